"""The model the agent benchmark serves: the tiny random Qwen3-vocabulary model of ``real_vocab``
(token accounting is exact whatever the weights; 262K positions hold Claude Code's ~32K-token prompts),
with its tokenizer's added tokens flagged as Qwen3 releases them.

``real_vocab`` marks every added token special; Qwen3's own ``tokenizer_config.json`` marks
``<tool_call>``, ``</tool_call>``, ``<tool_response>``, ``</tool_response>``, ``<think>``, ``</think>``
and the FIM/repo tokens as not special, so a detokenizer that skips special tokens keeps them in the
text, where the server's tool-call parser reads them.  Ids and token counts are unchanged.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from kvreuse.benchmarks.real_vocab import tiny_model_dir, vocab_root

NOT_SPECIAL = (
    "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>",
    "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
)  # fmt: skip


def agent_model_dir() -> Path:
    out = vocab_root() / "qwen3-agents-tiny"
    if (out / ".complete").exists():
        return out
    src = tiny_model_dir("qwen3")
    tmp = Path(tempfile.mkdtemp(dir=vocab_root()))
    for f in src.iterdir():
        if f.is_file() and f.name != ".complete":
            shutil.copy(f, tmp / f.name)
    tok = json.loads((tmp / "tokenizer.json").read_text())
    for t in tok["added_tokens"]:
        if t["content"] in NOT_SPECIAL:
            t["special"] = False
    (tmp / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    cfg_path = tmp / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    for t in cfg.get("added_tokens_decoder", {}).values():
        if t.get("content") in NOT_SPECIAL:
            t["special"] = False
    cfg_path.write_text(json.dumps(cfg, ensure_ascii=False, indent=1))
    (tmp / ".complete").write_text("qwen3 tiny, Qwen3's special flags")
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out
