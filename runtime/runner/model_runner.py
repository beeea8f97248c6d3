"""Loads the model and the KV pool on a device and runs one forward per step."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import NamedTuple

import torch

from kvreuse.kernels.backends import select_backend
from kvreuse.kernels.linear_attention import select_linear_backend
from kvreuse.runtime.models import build_model
from kvreuse.runtime.models.config import ModelConfig
from kvreuse.runtime.models.gated_deltanet import StateBatch
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
from kvreuse.runtime.runner.state_pool import StateInput, StatePool
from kvreuse.runtime.runner.window_pool import WindowPool, ring_batch
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
        hybrid = self.cfg.is_hybrid
        self.state_pool: StatePool | WindowPool | None = None
        if hybrid:
            self.state_pool = StatePool(self.cfg, state_slots, self.dtype, self.device)
        elif window_paging and uses_rings(self.cfg) and tp is None:
            self.state_pool = WindowPool(
                self.cfg, state_slots, page_size, chunk_size, self.dtype, self.device
            )
        rings = isinstance(self.state_pool, WindowPool)
        if rings and kv_cache_memory is not None and num_pages is None:  # the rings come out of the budget
            ring_bytes = self.state_pool.nbytes
            if ring_bytes >= kv_cache_memory:
                raise ValueError(
                    f"KV budget too small: the window rings of {state_slots} running requests (--max-running)"
                    f" take {ring_bytes / 2**20:.0f} MiB of the {kv_cache_memory / 2**20:.0f} MiB"
                    " (--kv-cache-memory); lower --max-running or raise --kv-cache-memory"
                )
            kv_cache_memory -= ring_bytes
        pooled_windows = not rings and any(w is not None for w in self.cfg.windows)
        if pooled_windows and self.cfg.kv_shape(True) != self.cfg.kv_shape(False):
            raise ValueError(
                f"{self.cfg.model_type}: its full and sliding layers' KV shapes differ, so its sliding layers"
                " need window rings (one device, window paging on)"
            )
        owners = self.cfg.cache_layers
        full_layers = sum(self.cfg.window(i) is None for i in owners) if rings else None
        self.pool = KVPool(
            pool_cfg, page_size, self.dtype, self.device, kv_cache_memory, num_pages, full_layers
        )
        # each attention layer's (k, v): a window layer's ring when the rings hold them, else its pool
        # pages; a layer that reads another's KV (Gemma 4's shared tail) gets that layer's; a hybrid's
        # are its full-attention layers' pages, in order
        self.kv_layers = list(self.pool.layers)
        if not hybrid:
            full, ring = iter(self.pool.layers), iter(self.state_pool.layers if rings else ())
            own = {i: next(ring) if rings and self.cfg.window(i) is not None else next(full) for i in owners}
            self.kv_layers = [own[src] for src in self.cfg.kv_source]
        self.linear_backend = select_linear_backend(self.device) if hybrid else None
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
        graphs = self.device.type == "cuda" and self.backend.name == "triton" and self.state_pool is None
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
        if isinstance(self.state_pool, WindowPool):
            assert states is not None, "a window model's step needs its ring slots"
            return self._window_forward(fb, states)
        if states is not None:
            return self._hybrid_forward(fb, states)
        if self.graphs is not None and self.graphs.can_run(fb):
            return self.graphs.run(fb)  # a static buffer's view: consumed before the next step
        return self.model(fb, self.kv_layers, self.backend)

    def _hybrid_forward(self, fb: ForwardBatch, st: StateInput) -> torch.Tensor:
        """Forward over the sequences' state slots, filling the snapshots the step asked for."""
        pool = self.state_pool
        assert pool is not None and self.linear_backend is not None, "states given to a dense model"
        sb = StateBatch(
            self.linear_backend,
            torch.tensor(st.slots, device=self.device),
            torch.tensor(st.fresh, device=self.device),
            fb.cu_seqlens_q.tolist(),
            st.cuts,
            st.inside,
            st.verify,
        )
        logits = self.model(fb, self.pool.layers, self.backend, pool.layers, sb)
        for slot, snap in zip(st.slots, st.ends):
            if snap is not None:  # the state after the whole chunk
                pool.copy_to(slot, snap)
        return logits

    def _window_forward(self, fb: ForwardBatch, st: StateInput) -> torch.Tensor:
        """Forward with the window layers on the sequences' rings; then fill the window snapshots the
        step asked for (every snapshot lies within its chunk, still in the ring)."""
        pool = self.state_pool
        assert isinstance(pool, WindowPool)
        cu = fb.cu_seqlens_q.tolist()
        longest = max(b - a for a, b in zip(cu, cu[1:]))
        if longest > pool.max_chunk:
            raise ValueError(
                f"a {longest}-token chunk overflows the window rings (built for {pool.max_chunk})"
            )
        ring = ring_batch(fb, st.slots, pool.ring_pages, self.page_size)
        logits = self.model(fb, self.kv_layers, self.backend, ring)
        starts = fb.positions[fb.cu_seqlens_q[:-1].long()].tolist() if cu[-1] else []
        inside = iter(st.inside)
        for i, (slot, cuts, end) in enumerate(zip(st.slots, st.cuts, st.ends)):
            for off in cuts:
                pool.copy_to(slot, next(inside), starts[i] + off)
            if end is not None:
                pool.copy_to(slot, end, starts[i] + cu[i + 1] - cu[i])
        return logits

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


def uses_rings(cfg: ModelConfig) -> bool:
    """Window layers go to rings when the model also has full-attention layers (whose pages the prefix
    cache keeps beside the window snapshots); a model windowed in every layer (Mistral) keeps all its
    KV in pool pages, so its prefix cache works as a dense model's."""
    return any(w is not None for w in cfg.windows) and any(w is None for w in cfg.windows)
