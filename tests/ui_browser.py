"""Helpers for the live-page tests: the system Chromium through Playwright, a chat conversation."""

from __future__ import annotations

import os
from pathlib import Path

import openai
import pytest

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]
SYSTEM = "You are a terse assistant. Current time: 2026-12-02 09:00:00. Answer in one short sentence."
QUESTIONS = ["Name a red fruit.", "Name a blue bird.", "Name a cold place.", "Name a fast animal."]


def browser():
    """A context manager yielding a headless system Chromium; fails (never skips) when it is missing:
    ``make test`` installs it (the Makefile's ``browser`` target)."""
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: run `make browser` (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    class Browser:
        def __enter__(self):
            self.pw = sync_playwright().start()
            self.browser = self.pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
            return self.browser

        def __exit__(self, *exc):
            self.browser.close()
            self.pw.stop()

    return Browser()


def converse(client: openai.OpenAI, model: str, system: str = SYSTEM, turns: int = 4, **extra) -> list:
    """A ``turns``-turn conversation (each turn appends the model's reply and a new question); the
    responses in order."""
    messages = [{"role": "system", "content": system}]
    responses = []
    for q in QUESTIONS[:turns]:
        messages.append({"role": "user", "content": q})
        r = client.chat.completions.create(
            model=model, messages=messages, max_tokens=8, temperature=0, **extra
        )
        messages.append({"role": "assistant", "content": r.choices[0].message.content})
        responses.append(r)
    return responses


def shown_figures(page, request_id: str) -> tuple[int, int]:
    """(cached, prefilled) as the page's timeline row for ``request_id`` shows them."""
    row = page.locator(f'[data-testid="request"][data-id="{request_id}"]')
    return (int(row.locator('[data-field="cached"]').inner_text()),
            int(row.locator('[data-field="prefilled"]').inner_text()))  # fmt: skip


def keep_screenshot(page, out: Path, docs_name: str, full_page: bool = True) -> Path:
    """Screenshot into the test's output; with ``KVREUSE_UPDATE_DOCS=1`` also into ``docs/`` (so a
    plain test run never rewrites a tracked file)."""
    path = out / docs_name
    page.screenshot(path=str(path), full_page=full_page)
    if os.environ.get("KVREUSE_UPDATE_DOCS") == "1":
        (Path(__file__).resolve().parents[1] / "docs" / docs_name).write_bytes(path.read_bytes())
    return path
