import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """{(arch, tied): model_dir} built once per session."""
    from tests.helpers import make_tiny_model

    root = tmp_path_factory.mktemp("tiny")
    out = {}
    for arch in ("llama", "qwen2", "qwen3"):
        for tie in (False, True):
            out[(arch, tie)] = make_tiny_model(root / f"{arch}-{int(tie)}", arch, tie)
    return out
