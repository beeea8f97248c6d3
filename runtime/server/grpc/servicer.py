"""SMG's ``vllm.grpc.engine.VllmEngine`` service onto a kvreuse server's engine.

The gateway tokenizes and renders chat itself, so a request arrives as token ids with sampling
parameters; it runs on the path an HTTP request does (``core.generate.admit_run``: admission, an
``EngineRun`` built in the prep thread with the caller's tenant and session as its cache scope and its
request validated by ``Engine.make_request``, streamed by ``AsyncEngine.stream``) and its tokens go
back as deltas.  Metadata ``authorization`` / ``x-api-key`` and ``x-session-id`` play the HTTP headers'
parts.  Only what a text model behind the gateway needs is served: no n > 1, no logprobs, no
structured-output constraints, no multimodal inputs (each refused with a one-line status); penalties
and ``min_p`` are ignored, as the HTTP API ignores fields it does not serve.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
from smg_grpc_proto.generated import common_pb2, vllm_engine_pb2, vllm_engine_pb2_grpc

from kvreuse.runtime.engine.async_engine import EngineDead, RequestFailed
from kvreuse.runtime.engine.engine import EngineError
from kvreuse.runtime.engine.outputs import RequestOutput
from kvreuse.runtime.sampling.params import SamplingParams
from kvreuse.runtime.server.core.generate import admit_run
from kvreuse.runtime.server.core.run import EngineRun
from kvreuse.runtime.server.errors import APIError
from kvreuse.runtime.server.grpc.kv_stream import KvEventHub
from kvreuse.runtime.server.loads import worker_load
from kvreuse.runtime.server.state import ServerState
from kvreuse.runtime.server.tenants import Caller

STATUS = {400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
          403: grpc.StatusCode.PERMISSION_DENIED, 429: grpc.StatusCode.RESOURCE_EXHAUSTED,
          503: grpc.StatusCode.UNAVAILABLE}  # fmt: skip


def sampling_params(sp: vllm_engine_pb2.SamplingParams, prompt_len: int, max_len: int) -> SamplingParams:
    """The engine's params from the proto's (proto3 zeros mean unset: vLLM's defaults then)."""
    if sp.n > 1:
        raise APIError(400, "n > 1 is not served over gRPC; send n requests")
    if sp.WhichOneof("constraint") is not None or sp.HasField("logprobs") or sp.HasField("prompt_logprobs"):
        raise APIError(400, "structured-output constraints and logprobs are not served over gRPC")
    return SamplingParams(
        max_tokens=sp.max_tokens if sp.HasField("max_tokens") else max(1, max_len - prompt_len),
        temperature=sp.temperature if sp.HasField("temperature") else 1.0,
        top_p=sp.top_p or 1.0,
        top_k=sp.top_k or -1,
        seed=sp.seed if sp.HasField("seed") else None,
        stop=list(sp.stop),
        stop_token_ids=list(sp.stop_token_ids),
        ignore_eos=sp.ignore_eos,
        logit_bias=dict(sp.logit_bias) or None,
    )


class KvreuseVllmServicer(vllm_engine_pb2_grpc.VllmEngineServicer):
    """The gRPC worker front of one kvreuse server (see the module docstring)."""

    def __init__(
        self,
        state: ServerState,
        hub: KvEventHub,
        tokenizer_dir: Path,
        tokenizer_zip: bytes,
        tokenizer_sha: str,
    ) -> None:
        self.state, self.hub, self.tokenizer_dir = state, hub, tokenizer_dir
        self.zip, self.sha = tokenizer_zip, tokenizer_sha
        self.started = time.time()
        self._runs: dict[str, EngineRun] = {}  # running requests by the gateway's request id

    def _caller(self, context: grpc.aio.ServicerContext) -> Caller:
        md = {k.lower(): v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}
        tenant = self.state.tenants.authenticate("/grpc/Generate", md)
        return Caller(self.state.tenants, tenant, md.get("x-session-id"))

    async def Generate(
        self, request: vllm_engine_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[vllm_engine_pb2.GenerateResponse]:
        state = self.state
        rid = request.request_id or f"grpc-{uuid.uuid4().hex[:24]}"
        try:
            caller = self._caller(context)
            if request.WhichOneof("input") == "text":
                ids = state.tokenizer.encode(request.text, add_special_tokens=False)
            else:
                ids = list(request.tokenized.input_ids)
            params = sampling_params(request.sampling_params, len(ids), state.engine.max_model_len)
            # HTTP's admission path: the tenant's share and the server's capacity, then the request built
            # (cache scope, engine validation) in the prep thread; released once in the finally below
            run, release = await admit_run(
                state, caller, 1, lambda c: EngineRun(state, c, "grpc", [ids], 1, lambda *_: params)
            )
        except (APIError, EngineError, ValueError) as e:
            await self._abort(context, e)
            return
        self._runs[rid] = run  # the gateway's Abort names its own request id
        try:
            async for _, out in run.streams():
                if request.stream and (out.new_token_ids or out.finished):
                    yield self._chunk(out, out.new_token_ids)
                if out.finished:
                    yield self._complete(out, out.new_token_ids if request.stream else out.output_token_ids)
                    state.metrics.observe_request(out.prompt_tokens, out.cached_tokens,
                                                  len(out.output_token_ids), out.ttft_s, out.decode_s)  # fmt: skip
        except (EngineDead, RequestFailed) as e:
            await context.abort(grpc.StatusCode.INTERNAL, str(e))
        finally:
            self._runs.pop(rid, None)
            release()

    async def _abort(self, context: grpc.aio.ServicerContext, e: Exception) -> None:
        code = STATUS.get(e.status, grpc.StatusCode.INTERNAL) if isinstance(e, APIError) else None
        await context.abort(code or grpc.StatusCode.INVALID_ARGUMENT, str(getattr(e, "message", e)))

    @staticmethod
    def _chunk(out: RequestOutput, ids: list[int]) -> vllm_engine_pb2.GenerateResponse:
        chunk = vllm_engine_pb2.GenerateStreamChunk(
            token_ids=ids, prompt_tokens=out.prompt_tokens, completion_tokens=len(ids),
            cached_tokens=out.cached_tokens,
        )  # fmt: skip
        return vllm_engine_pb2.GenerateResponse(chunk=chunk)

    def _complete(self, out: RequestOutput, ids: list[int]) -> vllm_engine_pb2.GenerateResponse:
        done = vllm_engine_pb2.GenerateComplete(
            output_ids=ids, finish_reason=out.finish_reason or "stop", prompt_tokens=out.prompt_tokens,
            completion_tokens=len(out.output_token_ids), cached_tokens=out.cached_tokens,
        )  # fmt: skip
        last = out.output_token_ids[-1:] if out.output_token_ids else []
        if out.finish_reason == "stop" and last and last[0] in self.state.engine.eos_ids:
            done.matched_token_id = last[0]
        return vllm_engine_pb2.GenerateResponse(complete=done)

    async def Abort(self, request: vllm_engine_pb2.AbortRequest, context) -> vllm_engine_pb2.AbortResponse:
        for run in filter(None, map(self._runs.get, request.request_ids)):
            for req in run.requests:
                self.state.engine.abort(req.request_id)
        return vllm_engine_pb2.AbortResponse()

    async def HealthCheck(self, request, context) -> vllm_engine_pb2.HealthCheckResponse:
        body, status = self.state.health()
        return vllm_engine_pb2.HealthCheckResponse(healthy=status == 200, message=str(body.get("status")))

    async def GetModelInfo(self, request, context) -> vllm_engine_pb2.GetModelInfoResponse:
        eng = self.state.engine
        tok = self.state.tokenizer
        return vllm_engine_pb2.GetModelInfoResponse(
            model_path=str(self.tokenizer_dir), tokenizer_path=str(self.tokenizer_dir), is_generation=True, max_context_length=eng.max_model_len,
            vocab_size=len(tok), served_model_name=self.state.config.served_model_name,
            eos_token_ids=sorted(eng.eos_ids), pad_token_id=tok.pad_token_id or 0,
            bos_token_id=tok.bos_token_id or 0, max_req_input_len=eng.max_model_len,
        )  # fmt: skip

    async def GetServerInfo(self, request, context) -> vllm_engine_pb2.GetServerInfoResponse:
        eng = self.state.engine
        return vllm_engine_pb2.GetServerInfoResponse(
            active_requests=self.state.in_flight, is_paused=self.state.draining,
            uptime_seconds=time.time() - self.started, server_type="vllm-grpc", data_parallel_size=1,
            block_size=eng.cache.page_size, model_dtype=str(eng.dtype), max_num_seqs=eng.config.max_running,
        )  # fmt: skip

    async def GetLoads(self, request, context) -> vllm_engine_pb2.GetLoadsResponse:
        body = worker_load(self.state.engine)
        return vllm_engine_pb2.GetLoadsResponse(
            timestamp=body["timestamp"], dp_rank_count=1,
            loads=[vllm_engine_pb2.SchedulerLoad(**rank) for rank in body["loads"]],
        )  # fmt: skip

    async def GetTokenizer(self, request, context) -> AsyncIterator[common_pb2.GetTokenizerChunk]:
        step = 64 << 10
        for start in range(0, len(self.zip), step):
            last = start + step >= len(self.zip)
            yield common_pb2.GetTokenizerChunk(
                data=self.zip[start : start + step], sha256=self.sha if last else ""
            )

    async def FlushCache(self, request, context) -> common_pb2.FlushCacheResponse:
        try:
            await self.state.on_engine(lambda e: e.reset_prefix_cache())
        except (EngineError, APIError) as e:
            return common_pb2.FlushCacheResponse(success=False, message=str(e))
        self.state.clear_diagnostics()
        return common_pb2.FlushCacheResponse(success=True, message="ok")

    async def SubscribeKvEvents(self, request, context) -> AsyncIterator[common_pb2.KvEventBatch]:
        async for batch in self.hub.stream(self.state.on_engine, self.state.engine.cache, context.cancelled):
            yield batch
