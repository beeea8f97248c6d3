"""``kvreuse cache save|load|inspect|clear --kv-store DIR``: the disk tier, offline.

* ``save``: compute prompts (a file, one JSON string or token-id list per line, or plain text lines)
  and write their KV to the store, e.g. a system prompt every later server start finds cached.
* ``load``: open the store with the model, load every stored prefix into the pool as far as it
  fits, verifying each page group's checksum; reports what was loaded and what was dropped.
* ``inspect``: what the store holds (works while a server has it open).
* ``clear``: delete every page and window snapshot (refused while a server has the store open).
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

from kvreuse.runtime.engine.args import add_engine_args, engine_kwargs


def _prompts(path: Path) -> list:
    out = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            out.append(line)
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="kvreuse cache", description=__doc__.split("\n\n")[0])
    p.add_argument("op", choices=["save", "load", "inspect", "clear"])
    p.add_argument("--prompt-file", type=Path, default=None, help="save: prompts, one per line")
    add_engine_args(p)
    args = p.parse_args(argv)
    if not args.kv_store:
        p.error("--kv-store DIR is required")
    if args.op == "inspect":
        from kvreuse.runtime.cache.store.inspect import describe

        print(json.dumps(describe(args.kv_store), indent=2))
        return 0
    if args.op == "clear":
        from kvreuse.runtime.cache.store.disk import DiskStore
        from kvreuse.runtime.cache.store.inspect import describe

        info = describe(args.kv_store)
        store = DiskStore(args.kv_store, info["fingerprint"], 0)  # takes the lock: no server has it
        store.clear()
        store.close()
        shutil.rmtree(Path(args.kv_store) / "tmp", ignore_errors=True)
        shutil.rmtree(Path(args.kv_store) / "window_states", ignore_errors=True)  # window snapshots
        print(f"cleared {info['pages']} pages ({info['bytes']} bytes) from {args.kv_store}")
        return 0
    from kvreuse.runtime.engine.engine import Engine
    from kvreuse.runtime.sampling.params import SamplingParams

    eng = Engine(args.model, **engine_kwargs(args))
    t0 = time.perf_counter()
    if args.op == "save":
        if args.prompt_file is None:
            p.error("save needs --prompt-file")
        outs = eng.generate(_prompts(args.prompt_file), SamplingParams(max_tokens=1))
        eng.close()
        tokens = sum(o.prompt_tokens for o in outs)
        print(
            f"saved {len(outs)} prompts ({tokens} tokens) to {args.kv_store} in {time.perf_counter() - t0:.1f} s"
        )
        return 0
    loaded = eng.cache.load_stored()
    st = eng.cache.tier_stats()
    eng.close()
    print(
        f"loaded {loaded} tokens ({st.loaded_disk_pages} pages) from {args.kv_store} in "
        f"{time.perf_counter() - t0:.2f} s; {st.disk_pages} pages stored"
    )
    return 0
