"""Prefix-stability check: does each request's prompt, plus what the model generated, prefix the next one?

For every assistant message of a conversation we take the request that produced it (the messages
before it, with the generation prompt), append the tokens the model generated -- the assistant turn
as the template renders it when it is the newest message, up to and including its end-of-turn
token -- and test whether that is a token prefix of the next request.  If not, the KV cache of the
previous request cannot be reused past the reported point.

CLI: ``kvreuse template-check [--model M] [--chat-template T] [--enable-thinking] [--keep-reasoning]
[--keep-analysis]``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

from kvreuse.chat_templates.conversations import Conversation, default_conversations, without_reasoning
from kvreuse.chat_templates.render import RenderedPrompt, describe, first_divergence, locate_char, render

HARMONY_END = ("<|return|>", "<|call|>")
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>", "<turn|>")
CONTEXT_CHARS = 40


class StepReport(NamedTuple):
    """One request -> next request transition of a conversation, and where it breaks if it does."""

    conversation: str
    step: int  # index of the assistant message the model generated
    next_messages: int  # messages in the next request
    prefix_tokens: int  # previous prompt + generated tokens
    ok: bool
    divergence: int | None = None  # first differing token index
    message_index: int | None = None
    segment: str = ""
    previous_text: str = ""  # text of previous prompt + generation from the divergence on
    next_text: str = ""  # text of the next request from the divergence on
    before_text: str = ""  # common text just before the divergence
    refused: str = ""  # the template raised on this conversation (e.g. Gemma 3 on tool turns): no verdict
    note: str = ""  # why an ok step is ok although the token sequences differ


def _starts(tokenizer: Any, text: str) -> list[int]:
    return [
        s for s, _ in tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    ]


def _generated_text(prompt: str, newest: str, eos: str | None) -> str | None:
    if not newest.startswith(prompt):
        return None
    rest = newest[len(prompt) :]
    # harmony: a turn is several messages, each ending <|end|>; the model stops at <|return|> / <|call|>
    stops = HARMONY_END if "<|channel|>" in rest else {*END_OF_TURN, *([eos] if eos else [])}
    ends = [rest.find(t) + len(t) for t in stops if t and t in rest]
    return rest[: min(ends)] if ends else rest


def _stop_rewritten(gen_text: str, next_text: str, at: int) -> bool:
    """Harmony: the answer the model ended with ``<|return|>`` is ``<|end|>`` in the next request."""
    return gen_text.endswith("<|return|>") and next_text[at - len("<|return|>") :].startswith("<|end|>")


def _step(
    tokenizer: Any, conv: Conversation, k: int, j: int, template: str | None, kwargs: dict
) -> StepReport:
    msgs, tools = conv.messages, conv.tools
    prompt = render(tokenizer, msgs[:k], tools, template=template, add_generation_prompt=True, **kwargs)
    newest = render(tokenizer, msgs[: k + 1], tools, template=template, add_generation_prompt=False, **kwargs)
    nxt = render(tokenizer, msgs[:j], tools, template=template, add_generation_prompt=True, **kwargs)
    gen_text = _generated_text(prompt.text, newest.text, tokenizer.eos_token)
    if gen_text is None:
        # The template renders the assistant turn in a way that does not continue its own
        # generation prompt: compare the prompt alone against that rendering.
        prev_text, prev_ids, prev_starts = prompt.text, prompt.token_ids, _starts(tokenizer, prompt.text)
        other: RenderedPrompt = newest
    else:
        gen_ids = tokenizer(gen_text, add_special_tokens=False)["input_ids"]
        prev_text = prompt.text + gen_text
        prev_ids = prompt.token_ids + list(gen_ids)
        prev_starts = _starts(tokenizer, prompt.text) + [
            len(prompt.text) + s for s in _starts(tokenizer, gen_text)
        ]
        other = nxt
    d = first_divergence(prev_ids, other.token_ids)
    base = StepReport(conv.name, k, j, len(prev_ids), d == len(prev_ids))
    if base.ok and gen_text is not None:
        return base
    if (
        gen_text is not None
        and d == len(prev_ids) - 1
        and _stop_rewritten(gen_text, other.text, len(prev_text))
    ):
        # the sampled stop token is never fed to the model, so no KV of it is cached to lose
        return base._replace(
            ok=True, note="<|return|> written <|end|> in history: the last token, never cached"
        )
    pc = prev_starts[d] if d < len(prev_starts) else len(prev_text)
    oc = _starts(tokenizer, other.text)[d] if d < len(other.token_ids) else len(other.text)
    prev_seg = locate_char(newest, pc) if pc < len(newest.text) else None
    next_seg = locate_char(other, oc) if oc < len(other.text) else None
    seg = prev_seg if prev_seg is not None and prev_seg.kind != "template" else next_seg or prev_seg
    idx = next((s.message_index for s in (prev_seg, next_seg) if s and s.message_index is not None), None)
    where = describe(seg, msgs)
    if gen_text is None:
        where = f"generation prompt not continued by the assistant turn; {where}"
    elif other.text.startswith(prev_text):
        where = f"same text, different token split (prompt end merges with the next text); {where}"
    return base._replace(
        ok=False,
        divergence=d,
        message_index=idx,
        segment=where,
        previous_text=prev_text[pc : pc + CONTEXT_CHARS],
        next_text=other.text[oc : oc + CONTEXT_CHARS],
        before_text=prev_text[max(0, pc - CONTEXT_CHARS) : pc],
    )


def check_prefix_stability(
    tokenizer: Any,
    template: str | None,
    conversations: list[Conversation] | None = None,
    **kwargs: Any,
) -> list[StepReport]:
    """Report, for every generation in every conversation, whether the next request extends it."""
    convs = conversations if conversations is not None else default_conversations()
    if kwargs.get("enable_thinking") is False:
        convs = [without_reasoning(c) for c in convs]
    reports = []
    for conv in convs:
        roles = [m.get("role") for m in conv.messages]
        gens = [i for i, r in enumerate(roles) if r == "assistant" and i > 0]
        for n, k in enumerate(gens):
            j = gens[n + 1] if n + 1 < len(gens) else len(roles)
            if j <= k + 1:
                continue
            try:
                reports.append(_step(tokenizer, conv, k, j, template, kwargs))
            except Exception as exc:  # jinja2's TemplateError from raise_exception: a refusal, not a break
                if "TemplateError" not in type(exc).__name__:
                    raise
                reports.append(StepReport(conv.name, k, j, 0, True, refused=str(exc)))
                break
    return reports


def format_table(reports: list[StepReport]) -> str:
    """A readable table: one row per step, with the break details under failing rows."""
    lines = [f"{'conversation':<18} {'step':>4} {'next msgs':>9} {'tokens':>7}  result"]
    for r in reports:
        verdict = (
            (f"ok ({r.note})" if r.note else "ok") if r.ok else f"BREAK at token {r.divergence}: {r.segment}"
        )
        lines.append(
            f"{r.conversation:<18} {r.step:>4} {r.next_messages:>9} {r.prefix_tokens:>7}  "
            + (f"refused by the template: {r.refused}" if r.refused else verdict)
        )
        if not r.ok:
            lines.append(f"{'':<22}before:   {r.before_text!r}")
            lines.append(f"{'':<22}previous: {r.previous_text!r}")
            lines.append(f"{'':<22}next:     {r.next_text!r}")
    breaks = sum(not r.ok for r in reports)
    refused = sum(bool(r.refused) for r in reports)
    lines.append(
        f"{len(reports) - refused} steps, {breaks} break(s)"
        + (f", {refused} conversation(s) refused" if refused else "")
    )
    return "\n".join(lines)


def main(
    argv: list[str] | None = None, resolve_model: Callable[[str | None], tuple[Any, str]] | None = None
) -> int:
    """``kvreuse template-check``: exit 1 when any step breaks the prefix, 0 otherwise.

    ``resolve_model`` maps ``--model`` (None: the default) to ``(tokenizer dir or hub id, name)``; the
    kvreuse CLI passes the runtime's (which knows the embedded model).  Without it ``--model`` is
    handed to transformers as is, so chat_templates never depends on the runtime.
    """
    parser = argparse.ArgumentParser(prog="kvreuse template-check", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="model dir, .gguf, hub id (default: embedded model)")
    parser.add_argument(
        "--chat-template",
        default=None,
        help="bundled name (chatml, qwen3, llama3, qwen3_5, gemma3, gpt_oss) or path",
    )
    parser.add_argument("--enable-thinking", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--keep-reasoning", action="store_true", help="qwen3: keep every turn's reasoning")
    parser.add_argument(
        "--keep-analysis", action="store_true", help="gpt_oss: every turn as generated (analysis kept)"
    )
    args = parser.parse_args(argv)

    from transformers import AutoTokenizer

    try:
        if resolve_model is None and args.model is None:
            raise ValueError(
                "--model is required here (`kvreuse template-check` defaults to the embedded model)"
            )
        model_dir, name = resolve_model(args.model) if resolve_model is not None else (args.model, args.model)
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        kwargs: dict[str, Any] = {}
        if args.enable_thinking is not None:
            kwargs["enable_thinking"] = args.enable_thinking
        if args.keep_reasoning:
            kwargs["keep_reasoning"] = True
        if args.keep_analysis:
            kwargs["keep_analysis"] = True
        reports = check_prefix_stability(tokenizer, args.chat_template, **kwargs)
    except Exception as exc:  # a CLI reports one line, not a traceback
        print(f"template-check: {exc}", file=sys.stderr)
        return 2
    print(f"model: {name}  template: {args.chat_template or 'model default'}  options: {kwargs or 'none'}")
    print(format_table(reports))
    return 1 if any(not r.ok for r in reports) else 0


if __name__ == "__main__":
    sys.exit(main())
