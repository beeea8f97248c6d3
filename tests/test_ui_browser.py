"""The live page (/ui) in a real headless Chromium against a real ``kvreuse serve`` on the embedded
model: a 4-turn conversation and a request that breaks its prefix show up as bars whose cached /
prefilled figures are the API's usage, and the break shows its cause and both texts; with API keys,
no key gets no data (401) and a tenant sees only its own requests; under ``--eviction-policy predict``
the predictor's kept-vs-evicted return rates are those of ``/v1/cache``."""

from __future__ import annotations

import httpx
import openai
import pytest
from playwright.sync_api import expect

from kvreuse.runtime.server.launcher import ServerProcess
from tests.ui_browser import SYSTEM, browser, converse, keep_screenshot, shown_figures

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]
MODEL = "smol"
TIMEOUT_MS = 90_000  # a loaded 2-core machine: polls and renders can take seconds
SERVER_ARGS = ["--kv-cache-memory", "256M", "--served-model-name", MODEL, "--max-running", "4"]
SHADOWS = ["--eviction-shadows", "lru,answer"]


@pytest.fixture(scope="module")
def chromium():
    with browser() as b:
        yield b


@pytest.fixture  # one server at a time: each test has its own, stopped when it ends
def server(tmp_path_factory):
    proc = ServerProcess([*SERVER_ARGS, *SHADOWS], tmp_path_factory.mktemp("ui") / "server.log").start()
    yield proc
    proc.stop()


@pytest.fixture
def keyed_server(tmp_path_factory):
    d = tmp_path_factory.mktemp("ui-keys")
    (d / "keys").write_text("key-a alice\nkey-b bob\n")
    proc = ServerProcess([*SERVER_ARGS, "--api-key-file", str(d / "keys")], d / "server.log").start()
    yield proc
    proc.stop()


def _client(server, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=0, timeout=120)


def test_page_shows_the_break_and_the_apis_figures(server, chromium, tmp_path):
    client = _client(server)
    responses = converse(client, MODEL, user="agent-1")  # a session: its pin is listed with its TTL
    # the same conversation with the system prompt's timestamp moved: the prefix breaks in message 0
    broken = converse(client, MODEL, system=SYSTEM.replace("09:00:00", "09:00:07"), turns=1)[0]
    diag = broken.model_extra["kvreuse"]["cache"]
    assert diag["cause"] == "system_changed"
    assert responses[-1].usage.prompt_tokens_details.cached_tokens > 0  # the conversation hit its own history

    page = chromium.new_page(viewport={"width": 1440, "height": 1000})
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(f"{server.url}/ui")
    rows = page.locator('[data-testid="request"]')
    rows.first.wait_for()
    rows.nth(
        4
    ).wait_for()  # all five (locators: the page's CSP forbids the eval wait_for_function polls with)
    for r in [*responses, broken]:
        cached = r.usage.prompt_tokens_details.cached_tokens
        assert shown_figures(page, r.id) == (cached, r.usage.prompt_tokens - cached), r.id
    assert page.locator("#login").is_hidden()  # no keys: no key asked for

    page.locator(f'[data-testid="request"][data-id="{broken.id}"]').click()
    detail = page.locator("#detail")
    assert detail.locator('[data-field="cause"]').inner_text() == "system_changed"
    assert "system message differs" in detail.locator('[data-field="cause-detail"]').inner_text()
    where = detail.locator('[data-field="where"]').inner_text()
    assert f"token {diag['divergence']['token_index']}" in where and "message 0" in where, where
    earlier = detail.locator('[data-field="earlier"]').inner_text()
    new = detail.locator('[data-field="new"]').inner_text()
    # side by side: the same text up to the break, then the earlier request's second vs this one's
    assert "09:00:0" in earlier and "09:00:0" in new
    assert earlier.split("09:00:0")[1][:1] == "0" and new.split("09:00:0")[1][:1] == "7", (earlier, new)
    assert detail.locator('[data-field="message"]').inner_text() == SYSTEM.replace("09:00:00", "09:00:07")
    assert (
        detail.locator('[data-field="cached"]')
        .inner_text()
        .startswith(str(broken.usage.prompt_tokens_details.cached_tokens))
    )
    assert page.locator('[data-tier="pool"]').is_visible()
    assert page.locator('[data-tier="shared"]').inner_text() == "shared tier: off (--kv-shared-store)"
    pinned = httpx.get(f"{server.base_url}/cache", timeout=60).json()["sessions"][0]
    pin = page.locator('#pins [data-pin="agent-1"] td').all_inner_texts()
    assert pin[:3] == ["session", "agent-1", f"{pinned['pinned_tokens']:,}"] and pin[3].endswith(" s"), pin
    shadows = httpx.get(f"{server.base_url}/cache", timeout=60).json()["eviction_shadows"]
    assert set(shadows["policies"]) == {"lru", "answer"} and shadows["served"]["cached_tokens"] > 0
    row = page.locator(
        '[data-tier="shadows"]'
    )  # the pool's rate beside each shadow's, as /v1/cache gives them
    for key, r in [("served", shadows["served"]), *shadows["policies"].items()]:
        expect(row.locator(f'[data-policy="{key}"] b')).to_have_text(f"{100 * r['hit_rate']:.1f}%")
    shot = keep_screenshot(page, tmp_path, "ui.png")
    assert shot.stat().st_size > 10_000
    page.close()


def test_without_a_key_no_data_and_tenants_see_only_their_own(keyed_server, chromium, tmp_path):
    url = keyed_server.url
    r = httpx.get(f"{url}/ui/api/live", timeout=60)
    assert r.status_code == 401
    assert r.json()["error"]["type"] == "authentication_error"  # OpenAI's shape
    assert (
        httpx.get(f"{url}/ui/api/live", headers={"Authorization": "Bearer key-c"}, timeout=60).status_code
        == 401
    )
    page_html = httpx.get(f"{url}/ui", timeout=60)  # the page's files are open and hold no data
    assert page_html.status_code == 200 and "Content-Security-Policy" in page_html.headers

    a = converse(_client(keyed_server, "key-a"), MODEL, turns=2)
    b = converse(_client(keyed_server, "key-b"), MODEL, turns=1, user="bob-session")
    live_b = httpx.get(f"{url}/ui/api/live", headers={"Authorization": "Bearer key-b"}, timeout=60).json()
    assert [x["id"] for x in live_b["requests"]] == [b[0].id]
    assert [s["id"] for s in live_b["cache"]["sessions"]] == ["bob-session"]

    page = chromium.new_page(viewport={"width": 1440, "height": 900})
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(f"{url}/ui")
    page.locator("#login").wait_for()
    assert page.locator('[data-testid="request"]').count() == 0 and page.locator("#main").is_hidden()
    page.fill("#key", "wrong")
    page.click("#login button")
    expect(page.locator("#login-error")).to_contain_text("API key", timeout=TIMEOUT_MS)
    assert page.locator("#main").is_hidden()
    page.fill("#key", "key-a")
    page.click("#login button")
    page.locator('[data-testid="request"]').nth(1).wait_for()
    page.wait_for_timeout(2000)  # another poll: nothing of bob's arrives
    shown = page.locator('[data-testid="request"]').evaluate_all("rows => rows.map(r => r.dataset.id)")
    assert sorted(shown) == sorted(r.id for r in a), shown
    assert page.locator("#tenant").inner_text() == "tenant alice"
    assert page.locator('#pins [data-pin="bob-session"]').count() == 0
    for r in a:
        cached = r.usage.prompt_tokens_details.cached_tokens
        assert shown_figures(page, r.id) == (cached, r.usage.prompt_tokens - cached)
    page.screenshot(path=str(tmp_path / "ui-tenant.png"), full_page=True)  # the test's output only
    page.close()


@pytest.fixture
def predict_server(tmp_path_factory):
    # a pool of a few hundred tokens, so conversations evict each other and labels come within minutes
    args = [*SERVER_ARGS, "--eviction-policy", "predict"]
    args[args.index("256M")] = "16M"
    proc = ServerProcess(args, tmp_path_factory.mktemp("ui-predict") / "server.log").start()
    yield proc
    proc.stop()


def test_page_shows_the_predictors_kept_and_evicted_return_rates(predict_server, chromium):
    """Under ``--eviction-policy predict`` the page shows what ``/v1/cache`` gives: the labelled
    examples and the return rates of what it kept against what it evicted."""
    client = _client(predict_server)
    for _ in range(3):  # six conversations over a pool of 45 pages: they evict each other and come back
        for i in range(6):
            converse(client, MODEL, system=SYSTEM + f" Topic {i}." * 20, turns=2)
    shown = httpx.get(f"{predict_server.base_url}/cache", timeout=60).json()["eviction_predictor"]
    assert (
        shown["labelled"] > 0
        and shown["kept"]["labelled"] + shown["evicted"]["labelled"] == shown["labelled"]
    )
    page = chromium.new_page(viewport={"width": 1440, "height": 1000})
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(f"{predict_server.url}/ui")
    row = page.locator('[data-tier="predictor"]')
    expect(row).to_contain_text(f"{shown['labelled']:,} labelled")
    for side in ("kept", "evicted"):
        rate = shown[side]["return_rate"]
        expect(row.locator(f'[data-field="{side}"]')).to_have_text(
            "-" if rate is None else f"{100 * rate:.1f}%"
        )
    page.close()
