"""Tokenizer + chat template combinations the patterns run under, and the reply each request generates.

A *stack* is what turns a pattern's messages into token ids: a tokenizer (a real model family's, or the
engine's own) and a chat template with its keyword arguments.  ``qwen3-stock`` is Qwen3's template as
published (reasoning of turns before the latest user query stripped), ``qwen3-append`` the same template
with our ``keep_reasoning`` (append-only), ``llama3.1`` Meta's Llama 3.1 template (tools in the first user
message), ``smollm2`` the embedded model's tokenizer in the Qwen3 format (the TTFT runs).

Cached replies: request k's reply is the scripted assistant message of turn k, and the tokens the model
"generates" are those the template renders for that message as the conversation's last turn (what a
model trained on the template emits), up to and including the end-of-turn token.  They are forced
through the engine, so their KV is cached like a real generation's; where the next request renders
the message differently (a template that rewrites history), the difference is a cache miss.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

from kvreuse.benchmarks.patterns.request import Request


class Stack(NamedTuple):
    """Tokenizer family (None: the target's own), template, template kwargs that win over the pattern's."""

    name: str
    family: str | None
    template: str
    kwargs: dict[str, Any]
    end_of_turn: str
    note: str
    turn_start: str = "<|im_start|>"  # the special token that opens every turn (the generation prompt's)


STACKS = {
    "qwen3-stock": Stack("qwen3-stock", "qwen3", "qwen3", {"keep_reasoning": False}, "<|im_end|>",
                         "Qwen3 vocabulary, Qwen3's template as published (old reasoning stripped)"),
    "qwen3-append": Stack("qwen3-append", "qwen3", "qwen3", {}, "<|im_end|>",
                          "Qwen3 vocabulary, our append-only Qwen3 template (keep_reasoning)"),
    "llama3.1": Stack("llama3.1", "llama3", "llama3", {}, "<|eot_id|>",
                      "Llama 3 vocabulary, Llama 3.1's template (tools in the first user message)", "<|start_header_id|>"),
    "smollm2": Stack("smollm2", None, "qwen3", {}, "<|im_end|>",
                     "embedded SmolLM2 tokenizer in the Qwen3 format (TTFT runs)"),
}  # fmt: skip


def template_source(stack: Stack, tokenizer: Any, transform: Any = None) -> str:
    """The stack's Jinja source, optionally rewritten by a pattern (e.g. tools before the system text)."""
    from kvreuse.chat_templates import load_template

    src = load_template(stack.template, tokenizer)
    return transform(src) if transform is not None else src


def render_request(tokenizer: Any, source: str, stack: Stack, req: Request, generation: bool = True) -> Any:
    from kvreuse.chat_templates import render

    kwargs = {**req.template_kwargs, **stack.kwargs}
    return render(
        tokenizer, req.messages, req.tools, template=source, add_generation_prompt=generation, **kwargs
    )


def reply_tokens(
    tokenizer: Any, source: str, stack: Stack, req: Request, prompt: Any, reply: dict
) -> list[int]:
    """The ids the model emits for ``reply`` after ``prompt``: the template's rendering of it as the last turn.

    Only the text from the generation prompt's turn-start token on is tokenised: tokenizers split at special
    tokens, so this gives the same ids as tokenising the whole conversation, at a fraction of the cost.
    """
    from kvreuse.chat_templates import render_text

    kwargs = {**req.template_kwargs, **stack.kwargs}
    done = render_text(
        tokenizer, [*req.messages, reply], req.tools, template=source, add_generation_prompt=False, **kwargs
    )
    start = prompt.text.rfind(stack.turn_start)
    if start >= 0 and done.startswith(prompt.text):
        head = tokenizer(prompt.text[start:], add_special_tokens=False)["input_ids"]
        ids = tokenizer(done[start:], add_special_tokens=False)["input_ids"]
        if ids[: len(head)] == head and prompt.token_ids[len(prompt.token_ids) - len(head) :] == head:
            return _until_end(tokenizer, stack, ids[len(head) :])
    # the template rewrote history once the reply exists (or merged a token across the boundary)
    n = len(os.path.commonprefix([done, prompt.text]))
    return _until_end(tokenizer, stack, tokenizer(done[n:], add_special_tokens=False)["input_ids"])


def _until_end(tokenizer: Any, stack: Stack, tail: list[int]) -> list[int]:
    end = tokenizer.convert_tokens_to_ids(stack.end_of_turn)
    return tail[: tail.index(end) + 1] if end in tail else tail


class PieceTokenizer:
    """Token ids of long, mostly repeated prompts: the text is split at the tokenizer's special tokens
    (which tokenizers split on before anything else, so the pieces tokenise independently) and each
    piece's ids are memoised.  Same ids as ``tokenizer(text)``; a 65-request session re-tokenises only
    what each request adds.  Used where no segment attribution is needed (the accounting target)."""

    def __init__(self, tokenizer: Any) -> None:
        import re

        self.tokenizer = tokenizer
        specials = sorted(tokenizer.get_added_vocab(), key=len, reverse=True)
        self.ids = tokenizer.get_added_vocab()
        self.split = re.compile("(" + "|".join(re.escape(s) for s in specials) + ")")
        self.memo: dict[str, list[int]] = {}

    def __call__(self, text: str) -> list[int]:
        out: list[int] = []
        for piece in self.split.split(text):
            if not piece:
                continue
            if piece in self.ids:
                out.append(self.ids[piece])
                continue
            ids = self.memo.get(piece)
            if ids is None:
                ids = self.memo[piece] = self.tokenizer(piece, add_special_tokens=False)["input_ids"]
            out.extend(ids)
        return out
