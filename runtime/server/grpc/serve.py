"""The gRPC worker's server: started beside the HTTP one, on the same event loop (``--grpc-port``).

The gateway reaches it as ``grpc://host:port``; the HTTP routes (``/health``, ``/metrics``, the
OpenAI API) stay on ``--port``.  The tokenizer the gateway renders and tokenizes with is the model
directory's tokenizer files plus the chat template this server renders with (as
``chat_template.jinja``), so a chat through the gateway becomes the prompt the HTTP route would make:
written to a directory under the cache directory named as ``tokenizer_path`` (a gateway on this host
loads it from there) and sent zipped by ``GetTokenizer`` (one on another host).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import shutil
import tempfile
import zipfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from smg_grpc_proto.generated import vllm_engine_pb2_grpc

from kvreuse.runtime.loading.model_source import cache_dir
from kvreuse.runtime.server.grpc.kv_stream import KvEventHub
from kvreuse.runtime.server.grpc.servicer import KvreuseVllmServicer
from kvreuse.runtime.server.state import ServerState

log = logging.getLogger("kvreuse.grpc")

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                   "merges.txt", "tokenizer.model", "config.json", "generation_config.json")  # fmt: skip


def write_tokenizer_dir(model_dir: Path, chat_template: str, out: Path) -> None:
    """The model's tokenizer files with this server's chat template as ``chat_template.jinja`` (the one
    ``tokenizer_config.json`` may carry is left out, so the gateway cannot pick another)."""
    for name in TOKENIZER_FILES:
        if (model_dir / name).is_file():
            shutil.copyfile(model_dir / name, out / name)
    config = out / "tokenizer_config.json"
    if config.is_file():
        cfg = json.loads(config.read_text())
        cfg.pop("chat_template", None)
        config.write_text(json.dumps(cfg, indent=1))
    (out / "chat_template.jinja").write_text(chat_template)


def tokenizer_dir(model_dir: Path, chat_template: str) -> Path:
    """That directory, under the cache directory by its content: written once, shared by every replica
    of the model (a killed replica leaves nothing behind, a new one finds it)."""
    h = hashlib.sha256(chat_template.encode())
    for name in TOKENIZER_FILES:
        if (model_dir / name).is_file():
            h.update(name.encode() + b"\0" + (model_dir / name).read_bytes())
    out = cache_dir() / "grpc-tokenizers" / h.hexdigest()[:16]
    if not out.is_dir():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=out.parent))
        write_tokenizer_dir(model_dir, chat_template, tmp)
        try:
            tmp.rename(out)
        except OSError:  # another replica wrote it first: the same content
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def tokenizer_zip(tokenizer_dir: Path) -> tuple[bytes, str]:
    """The gateway's tokenizer bundle and its SHA-256 (the shape of ``GetTokenizer``'s stream)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for f in sorted(tokenizer_dir.iterdir()):
            zf.write(f, f.name)
    data = buf.getvalue()
    return data, hashlib.sha256(data).hexdigest()


@asynccontextmanager
async def grpc_worker(state: ServerState, host: str, port: int) -> AsyncIterator[grpc.aio.Server]:
    """Serve SMG's vLLM engine service for ``state`` on ``host:port`` while inside the context."""
    hub = KvEventHub(state.engine.cache.page_size)
    if not hub.install(state.engine.cache):
        log.warning("the prefix cache keeps nothing (--prefix-cache): no KV events for the gateway")
    tok_dir = tokenizer_dir(Path(state.engine.model_dir), state.template.source)
    server = grpc.aio.server(options=[("grpc.max_send_message_length", 64 << 20)])
    servicer = KvreuseVllmServicer(state, hub, tok_dir, *tokenizer_zip(tok_dir))
    vllm_engine_pb2_grpc.add_VllmEngineServicer_to_server(servicer, server)
    checks = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    addr = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if server.add_insecure_port(addr) == 0:
        raise OSError(f"cannot listen for gRPC on {addr}")
    await server.start()
    for name in ("", "vllm.grpc.engine.VllmEngine"):
        await checks.set(name, health_pb2.HealthCheckResponse.SERVING)
    log.info("gRPC worker (SMG's vllm.grpc.engine.VllmEngine) on grpc://%s", addr)
    try:
        yield server
    finally:
        await server.stop(grace=2.0)
