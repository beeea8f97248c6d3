"""``kvreuse`` command line: generate, chat, serve, cluster, bench, template-check, cache, top.

Every failure a user can cause ends in one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from importlib.metadata import EntryPoint, entry_points

from kvreuse.runtime.engine.args import add_engine_args, engine_kwargs

USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, FileNotFoundError, OSError)


def _engine(args: argparse.Namespace):
    from kvreuse.runtime.engine.engine import Engine

    return Engine(args.model, **engine_kwargs(args))


def cmd_generate(args: argparse.Namespace) -> int:
    from kvreuse.runtime.sampling.params import SamplingParams

    eng = _engine(args)
    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
    )
    if args.chat:
        from kvreuse.chat_templates import render

        prompt = render(
            eng.tokenizer, [{"role": "user", "content": args.prompt}], template=args.chat_template
        ).token_ids
    else:
        prompt = args.prompt
    try:
        out = eng.generate(prompt, params)[0]
    finally:
        eng.close()  # stops the other tensor-parallel ranks, persists the KV tiers
    print(out.text)
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    from kvreuse.chat_templates import render
    from kvreuse.runtime.sampling.params import SamplingParams

    eng = _engine(args)
    print(
        f"kvreuse chat: {eng.model_name} ({eng.dtype}, {eng.device}); empty line or Ctrl-D to quit",
        file=sys.stderr,
    )
    messages: list[dict] = [{"role": "system", "content": args.system}] if args.system else []
    params = SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, seed=args.seed
    )
    while True:
        try:
            line = input("> ").strip()
        except EOFError:
            break
        if not line:
            break
        messages.append({"role": "user", "content": line})
        ids = render(eng.tokenizer, messages, template=args.chat_template).token_ids
        req = eng.make_request(ids, params)
        eng.submit(req)
        req_id = req.request_id
        text = ""
        while eng.has_work():
            for out in eng.step():
                if out.request_id == req_id:
                    print(out.delta, end="", flush=True)
                    text = out.text
                    cached = out.cached_tokens
        print(f"\n  [{len(ids)} prompt tokens, {cached} cached]", file=sys.stderr)
        messages.append({"role": "assistant", "content": text})
    return 0


def _sampling_args(p: argparse.ArgumentParser, max_tokens: int) -> None:
    p.add_argument("--max-tokens", type=int, default=max_tokens)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument(
        "--chat-template", default=None, help="bundled name (chatml, qwen3, llama3) or a .jinja path"
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvreuse", description="LLM inference with a KV cache that is reused for real."
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    g = sub.add_parser("generate", help="complete one prompt and print the result")
    g.add_argument("--prompt", required=True)
    g.add_argument(
        "--chat", action="store_true", help="wrap the prompt as a user message with the chat template"
    )
    _sampling_args(g, 64)
    add_engine_args(g)
    g.set_defaults(func=cmd_generate)
    c = sub.add_parser("chat", help="interactive chat with the model's own chat template, streamed")
    c.add_argument("--system", default=None, help="system prompt")
    _sampling_args(c, 256)
    add_engine_args(c)
    c.set_defaults(func=cmd_chat)
    for name, helptext in _delegated_help().items():
        sub.add_parser(name, help=helptext, add_help=False)
    return p


# Commands with parsers of their own, each given the rest of the command line.  The runtime's own are
# named here; others plug in through the ``kvreuse.commands`` entry points of installed packages (the
# benchmarks' ``bench``), so the runtime never imports the packages that build on it.
BUILT_IN = {
    "serve": "OpenAI-compatible server (see `kvreuse serve --help`)",
    "template-check": "check that a chat template renders history append-only",
    "cache": "the disk KV tier offline: `kvreuse cache save|load|inspect|clear --kv-store DIR`",
    "top": "a live terminal view of a running server: `kvreuse top --url http://127.0.0.1:8000`",
    "cluster": "N replicas behind the SMG gateway sharing a Valkey KV tier: `kvreuse cluster --replicas 3 -- ARGS`",
}
PLUGIN_GROUP = "kvreuse.commands"


def _plugins() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=PLUGIN_GROUP) if ep.name not in BUILT_IN}


def _delegated_help() -> dict[str, str]:
    helps = dict(BUILT_IN)
    for name, ep in _plugins().items():
        helps[name] = (ep.load().__doc__ or name).strip().splitlines()[0]
    return helps


def _delegate(command: str, rest: list[str]) -> int | None:
    """Run a delegated command; None when ``command`` is not one."""
    if command == "serve":
        from kvreuse.runtime.server.cli import main as serve_main

        return serve_main(rest)
    if command == "cache":
        from kvreuse.runtime.cli.cache import main as cache_main

        return cache_main(rest)
    if command == "cluster":
        from kvreuse.runtime.cli.cluster import main as cluster_main

        return cluster_main(rest)
    if command == "top":
        from kvreuse.runtime.cli.top import main as top_main

        return top_main(rest)
    if command == "template-check":
        from kvreuse.chat_templates.template_check import main as check_main
        from kvreuse.runtime.loading.model_source import resolve_model

        return check_main(rest, resolve_model)
    plugin = _plugins().get(command)
    return None if plugin is None else int(plugin.load()(rest) or 0)


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    try:
        if argv and (rc := _delegate(argv[0], argv[1:])) is not None:
            return rc
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        return args.func(args)
    except KeyboardInterrupt:
        return 130
    except USER_ERRORS as e:
        print(f"kvreuse: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except Exception as e:  # model source / weights errors are plain Exceptions subclasses
        from kvreuse.runtime.loading.model_source import ModelSourceError
        from kvreuse.runtime.models.weights import WeightsError

        if isinstance(e, (ModelSourceError, WeightsError)):
            print(f"kvreuse: error: {_one_line(e)}", file=sys.stderr)
            return 2
        raise


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


if __name__ == "__main__":
    sys.exit(main())
