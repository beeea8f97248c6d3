"""Plausible tool output for a coding agent: source files, find/grep listings, test runs.

Everything is drawn from templates with a caller-supplied ``random.Random`` so the same seed
yields byte-identical output.
"""

from __future__ import annotations

import random

PACKAGES = ["payments", "reconcile", "accounts", "api", "statements", "fx"]
NOUNS = ["payment", "refund", "invoice", "statement", "ledger_entry", "transfer", "payout", "chargeback"]
VERBS = ["create", "apply", "validate", "settle", "reverse", "match", "import", "export", "lookup", "close"]
FIELDS = [
    ("amount_minor", "int"),
    ("currency", "str"),
    ("account_id", "UUID"),
    ("created_at", "datetime"),
    ("reference", "str"),
    ("status", "PaymentStatus"),
    ("counterparty", "str | None"),
    ("external_id", "str"),
]
ERRORS = ["InsufficientFunds", "CurrencyMismatch", "DuplicateReference", "StatementGap", "AccountClosed"]


def module_path(rng: random.Random) -> str:
    pkg = rng.choice(PACKAGES)
    return f"ledgerly/{pkg}/{rng.choice(['service', 'models', 'rules', 'repository', 'handlers'])}.py"


def _function(rng: random.Random, noun: str) -> list[str]:
    verb = rng.choice(VERBS)
    args = rng.sample(FIELDS, k=rng.randint(1, 3))
    sig = ", ".join(f"{n}: {t}" for n, t in args)
    err = rng.choice(ERRORS)
    first = args[0][0]
    lines = [
        f"def {verb}_{noun}(session: Session, {sig}) -> {noun.title().replace('_', '')}:",
        f'    """{verb.capitalize()} a {noun.replace("_", " ")} and persist it in the current transaction."""',
        f"    existing = session.scalar(select({noun.title().replace('_', '')}).where_{first}({first}))",
        "    if existing is not None:",
        f'        raise {err}(f"{noun} {{{first}}} already {verb}d")',
    ]
    if any(n == "amount_minor" for n, _ in args):
        lines += [
            "    if amount_minor <= 0:",
            '        raise ValueError("amount_minor must be positive")',
        ]
    lines += [
        f"    obj = {noun.title().replace('_', '')}({', '.join(f'{n}={n}' for n, _ in args)})",
        "    session.add(obj)",
        f'    log.info("{verb}d {noun}", extra={{"{first}": str({first})}})',
        "    return obj",
        "",
    ]
    return lines


def code_file(rng: random.Random, path: str, n_functions: int) -> str:
    """A Python module of ``n_functions`` functions with imports and a dataclass, as read_file shows it."""
    noun = rng.choice(NOUNS)
    cls = noun.title().replace("_", "")
    fields = rng.sample(FIELDS, k=rng.randint(3, 6))
    lines = [
        f'"""{cls} {path.rsplit("/", 1)[-1][:-3]} for the ledgerly {path.split("/")[1]} package."""',
        "",
        "from __future__ import annotations",
        "",
        "import logging",
        "from dataclasses import dataclass, field",
        "from datetime import datetime, timezone",
        "from uuid import UUID, uuid4",
        "",
        "from sqlalchemy import select",
        "from sqlalchemy.orm import Session",
        "",
        f"from ledgerly.errors import {', '.join(sorted(set(rng.sample(ERRORS, k=2))))}",
        "",
        "log = logging.getLogger(__name__)",
        "",
        "",
        "@dataclass",
        f"class {cls}:",
        f'    """One {noun.replace("_", " ")} as stored in the ledger."""',
        "",
        "    id: UUID = field(default_factory=uuid4)",
    ]
    lines += [f"    {n}: {t} | None = None" for n, t in fields]
    lines += ["", ""]
    for _ in range(n_functions):
        lines += _function(rng, noun) + [""]
    numbered = [f"{i + 1:>5}\t{line}" for i, line in enumerate(lines[:-1])]
    return "\n".join(numbered)


def find_output(rng: random.Random, pattern: str, n: int) -> str:
    paths = sorted(
        {module_path(rng) for _ in range(n)} | {f"tests/test_{rng.choice(NOUNS)}.py" for _ in range(n // 3)}
    )
    return "\n".join(paths) + f"\n({len(paths)} files matching {pattern})"


def grep_output(rng: random.Random, regex: str, n: int) -> str:
    rows = []
    for _ in range(n):
        noun = rng.choice(NOUNS)
        verb = rng.choice(VERBS)
        snippet = rng.choice(
            [
                f"def {verb}_{noun}(session: Session, amount_minor: int, currency: str) -> {noun.title().replace('_', '')}:",
                f"    obj = {verb}_{noun}(session, amount_minor=entry.amount_minor, currency=entry.currency)",
                f"    if {noun}.currency != account.currency:",
                f"from ledgerly.{rng.choice(PACKAGES)}.service import {verb}_{noun}",
                f'    log.warning("{noun} %s could not be {verb}d: %s", {noun}.id, exc)',
                f"        assert {noun}.status is PaymentStatus.{rng.choice(['PENDING', 'SETTLED', 'FAILED'])}",
            ]
        )
        rows.append(f"{module_path(rng)}:{rng.randint(12, 480)}: {snippet}")
    rows.sort()
    return "\n".join(rows) + f"\n({n} matches for /{regex}/)"


def test_run_output(rng: random.Random, command: str, failing: int, packages: int = 4) -> str:
    passed = rng.randint(40, 160)
    lines = [
        f"$ {command}",
        "============================= test session starts =============================",
    ]
    lines.append(
        f"platform linux -- Python 3.11.9, pytest-8.2.1, pluggy-1.5.0\ncollected {passed + failing} items\n"
    )
    for pkg in rng.sample(PACKAGES, k=packages):
        marks = "".join(rng.choice("......F" if failing else ".") for _ in range(rng.randint(8, 30)))
        lines.append(f"tests/{pkg}/test_{rng.choice(NOUNS)}.py {marks}")
    for i in range(failing):
        noun = rng.choice(NOUNS)
        lines += [
            "",
            f"____________________ test_{rng.choice(VERBS)}_{noun}_rejects_{rng.choice(['negative', 'duplicate', 'foreign'])} ____________________",
            f"    def test_case_{i}(session):",
            f"        with pytest.raises({rng.choice(ERRORS)}):",
            f">           {rng.choice(VERBS)}_{noun}(session, amount_minor=-{rng.randint(1, 9999)}, currency='EUR')",
            "E           Failed: DID NOT RAISE",
            f"tests/{rng.choice(PACKAGES)}/test_{noun}.py:{rng.randint(20, 300)}: Failed",
        ]
    elapsed = rng.uniform(1.5, 14.0)
    summary = f"{failing} failed, {passed} passed" if failing else f"{passed} passed"
    lines.append(f"\n======================= {summary} in {elapsed:.2f}s =======================")
    return "\n".join(lines) + f"\nexit code: {1 if failing else 0}"


def write_result(rng: random.Random, path: str, content: str) -> str:
    added = content.count("\n") + 1
    return f"Wrote {len(content.encode())} bytes to {path} (+{added} -{rng.randint(0, added)} lines)."


def patch_content(rng: random.Random, path: str) -> str:
    """New file content the agent writes: a shorter module than read_file returns."""
    return "\n".join(line.split("\t", 1)[1] for line in code_file(rng, path, 1).splitlines())


def from_first_def(source: str) -> str:
    """The lines of ``source`` from its first top-level function on (imports and dataclasses dropped)."""
    lines = source.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split("\t", 1)[-1].startswith("def "))
    return "\n".join(lines[start:])
