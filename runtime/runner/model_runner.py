"""Loads the model and the KV pool on a device and runs one forward per step."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import NamedTuple

import torch

from kvreuse.kernels.backends import select_backend
from kvreuse.runtime.models import build_model
from kvreuse.runtime.models.config import ModelConfig
from kvreuse.runtime.models.quantize import apply_quantization
from kvreuse.runtime.models.weights import load_weights
from kvreuse.runtime.runner.cuda_graph import DecodeGraphRunner
from kvreuse.runtime.runner.distributed.comm import recv_batch, send_batch
from kvreuse.runtime.runner.distributed.launch import (
    Group,
    Workers,
    join_torchrun,
    rank_device,
    set_rank_threads,
    torchrun_world,
    watch_parent,
)
from kvreuse.runtime.runner.distributed.sharding import TPGroup, local_config, shard_into
from kvreuse.runtime.runner.forward_batch import ForwardBatch, StepInput, build_forward_batch
from kvreuse.runtime.runner.kv_pool import KVPool
from kvreuse.runtime.runner.model_state import ModelState, StateInput
from kvreuse.runtime.runner.state_kinds import StateShape, make_model_state
from kvreuse.runtime.sampling.sampler import SampleResult, sample
from kvreuse.runtime.speculative.verify import verify

log = logging.getLogger("kvreuse.model")


class StepResult(NamedTuple):
    """Logits of the sampled rows (``[S, vocab]``) and the tokens drawn from them (None if S == 0)."""

    logits: torch.Tensor
    samples: SampleResult | None


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def default_dtype(device: torch.device) -> str:
    """bf16 on GPUs; on CPUs only where bf16 matmuls are native (AMX / AVX512-BF16), else fp32."""
    if device.type == "cuda":
        return "bfloat16"
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "float32"
    return "bfloat16" if ("amx_bf16" in flags or "avx512_bf16" in flags) else "float32"


class ModelRunner:
    """Our model plus its paged KV pool on one device (and a hybrid's linear-attention state pool); with
    ``tensor_parallel_size > 1``, rank 0 of a tensor-parallel group whose other ranks it spawns
    (see ``runtime/runner/distributed``)."""

    def __init__(
        self,
        model_dir: Path,
        dtype: str,
        device: str,
        page_size: int,
        kv_cache_memory: int | None,
        num_pages: int | None = None,
        attention_backend: str = "auto",
        tensor_parallel_size: int = 1,
        state_slots: int = 64,
        quantize: str = "none",
        tp: TPGroup | None = None,
        compile_decode: bool = False,
        chunk_size: int = 512,
        window_paging: bool = True,
    ) -> None:
        self.cfg = ModelConfig.from_dir(model_dir)  # the whole model's shapes, whatever this rank keeps
        self.workers: Workers | None = None
        if tp is None and tensor_parallel_size > 1 and torchrun_world() == tensor_parallel_size:
            tp = join_torchrun(torch.device(device).type)
            if tp.rank > 0:  # torchrun started this rank: it serves rank 0's steps, then the process ends
                run_worker(
                    tp, model_dir, dtype, device, page_size, kv_cache_memory, num_pages, attention_backend
                )
                raise SystemExit(0)
        if tp is None and tensor_parallel_size > 1:
            local_config(
                self.cfg, tensor_parallel_size
            )  # refuse a model that does not split, before spawning
            args = (str(model_dir), dtype, device, page_size, kv_cache_memory, num_pages, attention_backend)
            self.workers = Workers(tensor_parallel_size, tp_worker, args, torch.device(device).type)
            set_rank_threads(tensor_parallel_size)
            tp = TPGroup(0, tensor_parallel_size, self.workers.group)
        self.tp = tp
        self.device = torch.device(rank_device(device, tp.rank) if tp else device)
        self.dtype = DTYPES[dtype]
        self.model = self._load(Path(model_dir))
        apply_quantization(self.model, quantize, model_dir)
        self.model.prepare()
        self.model.eval()
        self.compile_decode = compile_decode
        log.info("%s %s: %s", self.cfg.model_type, model_dir, self.model.parameter_counts().describe())
        pool_cfg = local_config(self.cfg, tp.world) if tp else self.cfg
        self.backend = select_backend(self.device, attention_backend)
        self.page_size = page_size
        # a hybrid's linear-attention states, a window model's rings, or none (``state_kinds.py``)
        self.state_pool: ModelState = make_model_state(
            StateShape(self.cfg, state_slots, page_size, chunk_size, self.dtype, self.device),
            window_paging, one_device=tp is None,
        )  # fmt: skip
        if kv_cache_memory is not None and num_pages is None:  # the slots come out of the budget
            kv_cache_memory = self.state_pool.kv_budget_left(kv_cache_memory)
        full_layers = self.state_pool.full_layers(self.cfg)
        self.pool = KVPool(
            pool_cfg, page_size, self.dtype, self.device, kv_cache_memory, num_pages, full_layers
        )
        self.kv_layers = self.state_pool.kv_layers(self.cfg, self.pool.layers)
        self.graphs: DecodeGraphRunner | None = None
        self.decode_path = "eager"  # see choose_decode

    def choose_decode(self, max_seq_len: int | None) -> str:
        """How decode steps run, decided here once for the runner's life (``decode_path``):
        ``cuda-graphs`` (replayed graphs over static buffers: decode is launch-bound on a GPU; the
        Triton backend on one device, dense models), else the model's own choice among ``fused``
        (the CPU kernels), ``compiled`` (``--compile-decode``) and ``eager``.  ``max_seq_len``: the
        longest sequence a graph must hold (None: no graphs, e.g. a tensor-parallel worker)."""
        layers = self.kv_layers
        self.decode_path = self.model.choose_decode(self.backend, layers[0][0] if layers else None,
                                                    self.compile_decode)  # fmt: skip
        graphs = (
            self.device.type == "cuda" and self.backend.name == "triton" and self.state_pool.decode_graphs
        )
        if graphs and max_seq_len is not None and self.tp is None:
            self.enable_decode_graphs(max_seq_len)
            self.decode_path = "cuda-graphs"
        return self.decode_path

    def enable_decode_graphs(self, max_seq_len: int, capture: bool | None = None) -> None:
        """Run decode steps through static buffers: replayed CUDA graphs on a GPU (``capture=None``: when
        the device is CUDA), the same padded forward run eagerly otherwise (how CPU tests check it)."""
        max_pages = -(-max_seq_len // self.page_size)
        self.graphs = DecodeGraphRunner(self.model, self.kv_layers, self.backend, max_pages, capture=capture)
        self.graphs.capture_graphs()

    def _load(self, model_dir: Path) -> torch.nn.Module:
        if self.tp is None:
            model = build_model(self.cfg, self.device, self.dtype)
            load_weights(model, model_dir)
            return model
        # each rank reads the whole checkpoint on the host and keeps its slices (simple; a rank of a
        # model too large for host memory would need a sliced loader)
        full = build_model(self.cfg, torch.device("cpu"), self.dtype)
        load_weights(full, model_dir)
        local = build_model(local_config(self.cfg, self.tp.world), self.device, self.dtype)
        shard_into(full, local, self.cfg, self.tp)
        return local

    def step(self, batch: StepInput) -> StepResult:
        """Forward the chunks; sample the rows that end their sequence (and verify drafted ones)."""
        as_decode = batch.drafts is not None and batch.states is None
        fb = build_forward_batch(batch.seqs, batch.sample_mask, self.page_size, self.device, as_decode)
        logits = self.forward(fb, batch.states)
        if not batch.params:
            return StepResult(logits, None)
        if batch.drafts is not None:
            return StepResult(logits, verify(logits, batch.params, batch.draws, batch.matchers, batch.drafts))
        return StepResult(logits, sample(logits, batch.params, batch.draws, batch.matchers))

    def forward(self, fb: ForwardBatch, states: StateInput | None = None) -> torch.Tensor:
        """The one door to the model: every forward rank 0 runs (a step, a prompt's scoring) goes
        through here, so the other tensor-parallel ranks run it too (a forward they did not see would
        leave rank 0 alone in the first all-reduce).  Returns the logits of ``fb.logits_rows``."""
        if self.tp is not None:  # rank 0 (a worker runs its own loop, never this)
            if self.workers is not None:
                self.workers.check()
            send_batch(fb, self.tp.group, self.device)
        if self.graphs is not None and self.graphs.can_run(fb):
            return self.graphs.run(fb)  # a static buffer's view: consumed before the next step
        return self.state_pool.run(self.model, fb, self.kv_layers, self.backend, states)

    def close(self) -> None:
        """Stop the other tensor-parallel ranks (no-op on one device)."""
        tp, self.tp = self.tp, None
        if tp is None:
            return
        stop = lambda: send_batch(None, tp.group, self.device)  # noqa: E731
        if self.workers is not None:
            workers, self.workers = self.workers, None
            workers.close(stop)
        else:  # torchrun's ranks: they exit when told to stop
            stop()


def tp_worker(rank: int, world: int, port: int, model_dir: str, dtype: str, device: str, *rest) -> None:
    """A spawned tensor-parallel rank: join the group, load its shard, run every step rank 0 sends."""
    watch_parent()
    set_rank_threads(world)
    group = Group(rank, world, port, torch.device(device).type)
    run_worker(TPGroup(rank, world, group), model_dir, dtype, device, *rest)


def run_worker(tp: TPGroup, model_dir, dtype: str, device: str, *rest) -> None:
    """Load this rank's shard and run the forward of every batch rank 0 broadcasts, until it stops."""
    runner = ModelRunner(Path(model_dir), dtype, device, *rest, tp=tp)
    runner.choose_decode(None)  # the same layer path as rank 0 (graphs never run under tensor parallelism)
    while (fb := recv_batch(tp.group, runner.device)) is not None:
        runner.model(fb, runner.kv_layers, runner.backend)
