"""The live page's shared KV tier in a real headless Chromium: two ``kvreuse serve`` replicas of a tiny
model on one real Valkey server.  Replica A answers a prompt and writes its pages through to the store;
replica B, which never saw it, answers a longer prompt with the same start from the shared tier.  B's page shows that
request's bar with a ``seg-shared`` segment of the API's ``cached_by_tier.shared`` tokens (and "shared
N" in its detail), and its shared-tier row shows /metrics' written / loaded / failure figures.  With
the store stopped, B's next request makes it notice, and the row shows the tier degraded with the
reason the live API gives."""

from __future__ import annotations

import time

import httpx
import openai
import pytest
from playwright.sync_api import expect

from kvreuse.runtime.cluster.services import start_valkey
from kvreuse.runtime.server.launcher import ServerProcess
from tests.helpers import make_tiny_model, metric_value
from tests.ui_browser import browser, keep_screenshot

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]
MODEL = "tiny"
PS = 16
TIMEOUT_MS = 90_000  # a loaded 2-core machine: polls and renders can take seconds
SYSTEM = "You are a careful coding agent. " + "Follow the repository rules. " * 30


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("uishared") / "m", vocab=49152)


@pytest.fixture
def store(tmp_path):
    svc, url = start_valkey(tmp_path, maxmemory="64mb")
    yield svc, url
    svc.stop()


@pytest.fixture
def replicas(model, store, tmp_path):
    args = ["--model", str(model), "--dtype", "float32", "--page-size", str(PS), "--served-model-name", MODEL,
            "--kv-cache-memory", "8M", "--kv-shared-store", store[1]]  # fmt: skip
    procs: list[ServerProcess] = []
    try:
        for name in ("a", "b"):
            procs.append(ServerProcess(args, tmp_path / f"replica-{name}.log").start())
        yield procs
    finally:
        for p in procs:
            p.stop()


def _ask(server: ServerProcess, question: str):
    client = openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0, timeout=120)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    return client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0)


def _shared_metrics(server: ServerProcess) -> dict[str, int]:
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    return {
        "written": int(metric_value(text, "kvreuse_kv_shared_written_pages_total")),
        "loaded": int(metric_value(text, "kvreuse_cached_tokens_by_tier_total", '{tier="shared"}')),
        "failures": int(metric_value(text, "kvreuse_kv_shared_failures_total")),
        "degraded": int(metric_value(text, "kvreuse_kv_shared_degraded")),
    }


def _settled(server: ServerProcess, until=lambda m: True, timeout_s: float = 60.0) -> dict[str, int]:
    """The replica's shared-tier figures once its background writer has stopped moving them (two reads
    a second apart agree) and ``until`` holds."""
    end, last = time.monotonic() + timeout_s, None
    while time.monotonic() < end:
        now = _shared_metrics(server)
        if now == last and until(now):
            return now
        last = now
        time.sleep(1.0)
    raise AssertionError(f"shared-tier metrics never settled: {last}")


def test_page_shows_the_shared_tier_and_its_degraded_state(replicas, store, tmp_path):
    a, b = replicas
    first = _ask(a, "List the files in src/ and explain each one.")
    full_pages = (first.usage.prompt_tokens - 1) // PS
    _settled(a, lambda m: m["written"] >= full_pages)  # A's prompt pages are in the store
    # the same system prompt, a longer question: B reads the common pages and writes its own new ones
    again = _ask(b, "List the files in src/ and explain each one. " + "Then say what every test checks. " * 4)
    shared = again.model_extra["kvreuse"]["cache"]["cached_by_tier"]["shared"]
    assert 0 < shared <= full_pages * PS and again.usage.prompt_tokens_details.cached_tokens == shared
    assert again.model_extra["kvreuse"]["cache"]["cause"] == "precomputed"  # B never saw A's request
    figures = _settled(b)
    assert figures["loaded"] == shared and figures["written"] > 0 and figures["failures"] == 0

    with browser() as chromium:
        page = chromium.new_page(viewport={"width": 1440, "height": 1000})
        page.set_default_timeout(TIMEOUT_MS)
        page.goto(f"{b.url}/ui")
        row = page.locator(f'[data-testid="request"][data-id="{again.id}"]')
        seg = row.locator(".seg-shared")
        seg.wait_for()  # locators: the page's CSP forbids the eval wait_for_function polls with
        assert seg.get_attribute("title") == f"{shared:,} cached (shared)"
        assert seg.bounding_box()["width"] > 0
        row.click()
        expect(page.locator('#detail [data-field="cached"]')).to_contain_text(f"shared {shared:,})")
        tier = page.locator('[data-tier="shared"]')
        for field in ("written", "loaded", "failures"):
            expect(tier.locator(f'[data-field="{field}"]')).to_have_text(f"{figures[field]:,}")
        expect(tier).to_contain_text(store[1])
        assert tier.locator('[data-field="degraded"]').count() == 0
        keep_screenshot(page, tmp_path, "ui-shared.png")

        store[0].stop()
        _ask(b, "Now look at the tests and say which of them fail.")  # a new prompt: B asks the store
        down = _settled(b, lambda m: m["degraded"] == 1)
        assert down["failures"] >= 1
        reason = httpx.get(f"{b.url}/ui/api/live", timeout=30).json()["tiers"]["shared"]["degraded"]
        assert reason and "Connection" in reason, reason
        expect(tier).to_have_class("tier degraded")
        expect(tier.locator('[data-field="degraded"]')).to_have_text(reason)
        expect(tier.locator('[data-field="failures"]')).to_have_text(f"{down['failures']:,}")
        assert tier.locator(".error").is_visible()
        page.screenshot(path=str(tmp_path / "ui-shared-degraded.png"))  # the test's output only
        page.close()
