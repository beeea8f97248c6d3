"""Engine options, one place, with the defaults and why (the CLI flags read their defaults from here)."""

from __future__ import annotations

from dataclasses import dataclass

from kvreuse.runtime.cache.eviction import DEFAULT_POLICY, POLICIES
from kvreuse.runtime.cache.registry import DEFAULT_KIND, cache_kind
from kvreuse.runtime.cache.store.seal import read_secret
from kvreuse.runtime.speculative.drafter import MODES as SPECULATIVE_MODES


@dataclass
class EngineConfig:
    """Everything that shapes an engine; the CLI and server map their flags onto it."""

    model: str | None = None
    model_dir: str | None = None  # an already-resolved local directory (skips model_source)
    dtype: str | None = None  # None: bf16 on GPU / bf16-capable CPU, else fp32
    device: str | None = None  # None: cuda if available else cpu
    prefix_cache: str = DEFAULT_KIND  # a kind of runtime/cache/registry.py; "off": the naive baseline
    session_ttl: float = 300.0  # seconds a session's last node stays pinned after its last use
    pinned_fraction: float = 0.5  # of the pool at most pinned, so pins never starve admission
    eviction_policy: str = (
        DEFAULT_POLICY  # runtime/cache/eviction.py; chosen on benchmarks/traces/eviction_traces.py
    )
    # other policies replayed beside the pool on the same requests (runtime/cache/shadows.py): what each
    # would have hit here, so a policy is chosen on the server's own traffic
    eviction_shadows: tuple[str, ...] = ()
    page_size: int = 16  # see benchmarks/results/page_size.json for why 16
    kv_cache_memory: int | str | None = None  # bytes or "2G"; None: 1 GiB on CPU, 85% of free GPU memory
    num_pages: int | None = None  # exact pool size (tests); overrides kv_cache_memory
    chunk_size: int = 512  # prefill tokens per step: the longest stall a running decode sees
    # ... while requests of more than one tenant have work: one tenant's long prompt then stalls another's
    # request by a step of this many tokens (benchmarks/serving/fairness.py)
    tenant_chunk_size: int = 128
    # ... and at most what fits a step of this many seconds, by the step times seen (StepClock): the
    # victim's wait is then about two such steps (the one running when it arrives, then its own)
    tenant_step_s: float = 0.15
    max_running: int = 64
    schedule_policy: str = "fcfs"  # or "lpm": longest cached prefix first
    max_model_len: int | None = None
    attention_backend: str = (
        "auto"  # "reference" (torch), "cpu" (the C kernels of kernels/native_cpu.py) or "triton"
    )
    # none | int8 | int4 | gguf (a GGUF's own blocks). Dense by default: quantized decodes faster but
    # prefills slower (benchmarks/results/quantized.json)
    quantize: str = "none"
    compile_decode: bool = False  # torch.compile decode steps' layers (CPU dispatch-bound); see decoder.py
    # unseeded requests' seeds: None, the OS's entropy per request; an int, one stream for the engine
    # (reproducible in-process runs; a server shares it among tenants, so it is never the default)
    seed: int | None = None
    # speculative decoding drafted from tokens already seen (runtime/speculative): off | ngram | suffix, or
    # auto (`kvreuse serve`'s default): suffix where the model supports it (runtime/engine/states.py)
    speculative: str = "off"
    # a grammar (response_format schema, tools) compiling longer than this is refused with a 400: one
    # caller's pathological schema must not hold a prep thread (issue 39: 10k optional properties, minutes)
    grammar_compile_timeout: float = 5.0
    tensor_parallel_size: int = 1  # ranks on torch.distributed (gloo on CPU, NCCL on GPUs); rank 0 schedules
    kv_store: str | None = None  # directory of the disk tier (KV pages that outlive eviction and restarts)
    kv_store_size: int | str = "20G"  # the disk tier's byte budget
    kv_host_memory: int | str | None = None  # host-memory tier budget (pinned on GPU); None: no host tier
    kv_write_through: bool = False  # write every cached page down at once, not only when evicted
    kv_store_sync_s: float = 60.0  # how often pool-only pages are written to the disk tier
    # the shared tier: a Valkey/Redis server (valkey://host:port) every replica writes its pages through to
    kv_shared_store: str | None = None
    # a file holding the replicas' shared secret: entries carry an HMAC under it (runtime/cache/store/seal.py)
    kv_shared_secret_file: str | None = None

    # hybrids (Qwen3.5): linear-attention state snapshots beside the KV pages (see runtime/cache/state_slots.py)
    snapshot_memory: int | str | None = None  # bytes or "1G"; None: 1 GiB
    snapshot_every: int = 0  # also snapshot every K pages inside a prefill chunk (0: chunk ends only)
    # sliding-window models with full-attention layers too (Gemma 3): window layers' KV in per-request
    # rings, snapshots of the last W keys beside the radix tree (runtime/runner/window_pool.py); False:
    # every layer keeps pool pages for every token
    window_paging: bool = True

    @property
    def tiered(self) -> bool:
        """Whether any tier sits below the pool (host memory, disk, a shared store)."""
        return bool(self.kv_store or self.kv_host_memory or self.kv_shared_store)

    def shared_secret(self) -> bytes | None:
        """The shared tier's secret, read from ``kv_shared_secret_file`` (None without one)."""
        return read_secret(self.kv_shared_secret_file) if self.kv_shared_secret_file else None

    def __post_init__(self) -> None:
        from kvreuse.runtime.runner.kv_pool import (
            parse_memory,  # here, so the CLI reads these defaults without torch
        )

        self.kv_cache_memory = parse_memory(self.kv_cache_memory)
        self.snapshot_memory = parse_memory(self.snapshot_memory)
        self.kv_store_size = parse_memory(self.kv_store_size)
        self.kv_host_memory = parse_memory(self.kv_host_memory)
        if self.tiered and not cache_kind(self.prefix_cache).keeps_prefixes:
            raise ValueError(
                "--kv-store / --kv-host-memory / --kv-shared-store need a prefix cache "
                f"(not --prefix-cache {self.prefix_cache})"
            )
        if self.kv_shared_store and not self.kv_shared_store.startswith(("valkey://", "redis://", "unix://")):
            raise ValueError(
                f"--kv-shared-store must be a valkey://, redis:// or unix:// URL, got {self.kv_shared_store!r}"
            )
        if self.kv_shared_secret_file and not self.kv_shared_store:
            raise ValueError("--kv-shared-secret-file needs --kv-shared-store")
        if self.kv_shared_secret_file:
            self.shared_secret()  # an unreadable or short secret: a one-line error before the model loads
        if self.snapshot_every < 0:
            raise ValueError(f"snapshot_every must be >= 0, got {self.snapshot_every}")
        if self.page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {self.page_size}")
        if self.tenant_step_s <= 0:
            raise ValueError(f"tenant_step_s must be > 0, got {self.tenant_step_s}")
        if self.chunk_size < 1 or self.tenant_chunk_size < 1:
            raise ValueError(f"chunk sizes must be >= 1, got {self.chunk_size} and {self.tenant_chunk_size}")
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if self.eviction_policy not in POLICIES:
            raise ValueError(
                f"eviction_policy must be one of {', '.join(POLICIES)}, got {self.eviction_policy!r}"
            )
        bad = [p for p in self.eviction_shadows if p not in POLICIES]
        if bad:
            raise ValueError(f"eviction_shadows must be among {', '.join(POLICIES)}, got {', '.join(bad)}")
        if self.session_ttl <= 0:
            raise ValueError(f"session_ttl must be > 0 seconds, got {self.session_ttl}")
        if not 0 <= self.pinned_fraction <= 1:
            raise ValueError(f"pinned_fraction must be in [0, 1], got {self.pinned_fraction}")
        if self.tensor_parallel_size > 1 and self.quantize != "none":
            raise ValueError("--quantize does not work with --tensor-parallel-size > 1 yet")
        if self.tensor_parallel_size > 1 and self.tiered:
            raise ValueError(
                "--kv-store / --kv-host-memory / --kv-shared-store do not work with --tensor-parallel-size > 1 yet"
            )
        if self.speculative not in (*SPECULATIVE_MODES, "auto"):
            raise ValueError(
                f"speculative must be one of {', '.join(SPECULATIVE_MODES)} or auto, got {self.speculative!r}"
            )
        if self.max_running < 1:
            raise ValueError(f"max_running must be >= 1, got {self.max_running}")
