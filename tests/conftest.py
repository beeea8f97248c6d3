import importlib.abc
import os
import sys

import pytest


class _OneImportRoot(importlib.abc.MetaPathFinder):
    """The project's folders are importable only as ``kvreuse.<folder>``. pytest puts the repository root
    on ``sys.path``, where a bare ``chat_templates`` would import (a second copy of every module, and code
    that names its package by the bare name works here but not from a wheel); refusing it here makes
    the tests see what an installed wheel sees. (``kernels`` is Hugging Face's package.)"""

    BARE = frozenset({"runtime", "chat_templates", "benchmarks"})

    def find_spec(self, name, path=None, target=None):
        if name in self.BARE:
            raise ModuleNotFoundError(f"No module named {name!r} (the project imports as kvreuse.{name})")
        return None


sys.meta_path.insert(0, _OneImportRoot())

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
if "PYTEST_XDIST_WORKER" in os.environ:
    # `make test` runs two workers on CI's two cores: one torch thread each, so that they share
    # the cores instead of oversubscribing them (set before anything imports torch).
    os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """{(arch, tied): model_dir} built once per session."""
    from tests.helpers import make_tiny_model

    root = tmp_path_factory.mktemp("tiny")
    out = {}
    for arch in ("llama", "qwen2", "qwen3"):
        for tie in (False, True):
            out[(arch, tie)] = make_tiny_model(root / f"{arch}-{int(tie)}", arch, tie)
    # Llama 3.1-style rope scaling (with original context 128, so positions past it are scaled)
    llama3_rope = dict(
        rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=128, rope_theta=500000.0,
    )  # fmt: skip
    out[("llama3-rope", False)] = make_tiny_model(root / "llama3-rope", "llama", rope_scaling=llama3_rope)
    out[("mistral", False)] = make_tiny_model(root / "mistral", "mistral", sliding_window=None)
    return out
