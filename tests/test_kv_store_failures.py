"""Issue 39, points 1 and 4: a store that cannot be written degrades to pool-only (never a hang), and a
store is only ever served to the configuration and the pages it was written for."""

from __future__ import annotations

import logging
import re
import shutil
import sqlite3
import threading
import time

import pytest
import torch
from fastapi.testclient import TestClient

from kvreuse.runtime.cache.store import DiskStore, StoreError
from kvreuse.runtime.cache.store.fingerprint import fingerprint
from kvreuse.runtime.cache.store.tiers import LowerTiers
from kvreuse.runtime.engine.async_engine import AsyncEngine
from kvreuse.runtime.engine.engine import Engine
from kvreuse.runtime.server.app import create_app
from kvreuse.runtime.server.state import ServerConfig
from tests.helpers import make_tiny_model
from tests.test_kv_store import FP, page_kv, put_chain

pytestmark = pytest.mark.timeout(300)


def _within(seconds: float, fn) -> None:
    """Run ``fn`` in a thread; fail (rather than hang the suite) when it does not return in time."""
    box: list = []
    t = threading.Thread(target=lambda: box.append(fn()), daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still running after {seconds} s (hung)"


@pytest.mark.parametrize("breakage", ["tmp removed", "groups is a file"])
def test_a_failed_write_makes_the_disk_tier_read_only_and_flush_returns(tmp_path, breakage):
    disk = DiskStore(tmp_path / "s", FP, 1 << 20)
    tiers = LowerTiers(None, disk)
    keys = put_chain(disk, list(range(8)))  # written before the breakage: still readable after
    if breakage == "tmp removed":
        shutil.rmtree(tmp_path / "s" / "tmp")
    else:
        shutil.rmtree(tmp_path / "s" / "groups")
        (tmp_path / "s" / "groups").write_text("not a directory")
    new = list(range(100, 108))
    from kvreuse.runtime.cache.store import page_keys, root_key

    nkeys = page_keys(new, 4, parent=root_key(""))
    kv = torch.stack([page_kv(k) for k in nkeys])
    tiers.write_back(root_key(""), True, nkeys, [tuple(new[:4]), tuple(new[4:])], kv, durable=True)
    _within(10, tiers.flush)  # the writer survived the failure: the old code waited here forever
    assert tiers.disk_error is not None and tiers.stats().write_failures == 1
    assert not tiers.accepts(durable=True)  # later writes are dropped, not queued
    tiers.write_back(root_key(""), True, nkeys, [tuple(new[:4]), tuple(new[4:])], kv, durable=True)
    _within(10, tiers.flush)
    _within(10, tiers.clear)  # a cache reset
    if breakage == "tmp removed":
        assert tiers.match(keys).disk == 0  # cleared
    tiers.close()


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("storefail") / "m", vocab=49152)


def test_a_server_whose_store_breaks_keeps_answering_and_says_so(tiny_model, tmp_path):
    store = tmp_path / "store"
    engine = Engine(model_dir=str(tiny_model), dtype="float32", device="cpu", num_pages=64, page_size=16,
                    kv_store=str(store), kv_write_through=True)  # fmt: skip
    aengine = AsyncEngine(engine)
    app = create_app(aengine, ServerConfig("tiny"), on_shutdown=aengine.shutdown)
    body = {"model": "tiny", "max_tokens": 2, "temperature": 0}
    with TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False) as c:

        def chat(text: str) -> dict:
            r = c.post("/v1/chat/completions", json={**body, "messages": [{"role": "user", "content": text}]})
            assert r.status_code == 200, r.text
            return r.json()

        chat(" ".join(f"w{i}" for i in range(60)))
        shutil.rmtree(store / "tmp")  # what the issue did under a running server
        t0 = time.monotonic()
        answer = chat(" ".join(f"x{i}" for i in range(60)))
        assert answer["choices"][0]["finish_reason"] in ("stop", "length")
        assert c.post("/v1/cache/reset", json={}).status_code == 200  # old: 500 after 30 s
        assert c.get("/debug/kv").status_code == 200  # old: 500
        chat("after the reset")  # old: no answer in 90 s
        assert time.monotonic() - t0 < 30
        health = c.get("/health").json()
        assert health["status"] == "degraded" and "read-only" in health["kv_store"], health
        metrics = c.get("/metrics").text
        assert re.search(r"^kvreuse_kv_store_degraded 1\.0$", metrics, re.M)
        assert float(re.search(r"^kvreuse_kv_store_write_failures_total (\S+)$", metrics, re.M)[1]) >= 1


def test_the_fingerprint_covers_quantization(tiny_model):
    dense = fingerprint(tiny_model, "float32", 16, settings={"quantize": "none"})
    assert dense != fingerprint(tiny_model, "float32", 16, settings={"quantize": "int8"})
    assert dense != fingerprint(tiny_model, "bfloat16", 16, settings={"quantize": "none"})
    assert dense == fingerprint(tiny_model, "float32", 16, settings={"quantize": "none"})


def test_an_int8_engine_refuses_a_dense_engines_store(tiny_model, tmp_path):
    store = str(tmp_path / "store")
    Engine(model_dir=str(tiny_model), dtype="float32", device="cpu", num_pages=16, kv_store=store).close()
    with pytest.raises(StoreError, match="another model or settings"):
        Engine(model_dir=str(tiny_model), dtype="float32", device="cpu", num_pages=16, kv_store=store,
               quantize="int8")  # fmt: skip


def _two_groups(path):
    s = DiskStore(path, FP, 1 << 20)
    a = put_chain(s, list(range(8)))
    b = put_chain(s, list(range(50, 58)))
    return s, a, b


def test_an_index_pointing_at_swapped_groups_is_never_served(tmp_path):
    s, a, b = _two_groups(tmp_path)
    s.close()
    db = sqlite3.connect(tmp_path / "index.sqlite")
    (ga, fa, ca), (gb, fb, cb) = db.execute("SELECT id, file, checksum FROM groups ORDER BY id").fetchall()
    db.execute("UPDATE groups SET file = ?, checksum = ? WHERE id = ?", (fb, cb, ga))  # checksums pass
    db.execute("UPDATE groups SET file = ?, checksum = ? WHERE id = ?", (fa, ca, gb))
    db.commit()
    db.close()
    s = DiskStore(tmp_path, FP, 1 << 20)
    assert s.match(a) == 2
    assert s.get(a) is None  # old: group b's K/V served as a's
    assert s.match(a) == 0  # and the lying entry is gone
    s.close()


def test_an_index_pointing_past_a_files_end_is_never_served(tmp_path):
    s, a, _ = _two_groups(tmp_path)
    s.close()
    db = sqlite3.connect(tmp_path / "index.sqlite")
    db.execute("UPDATE pages SET idx = idx + 7 WHERE key = ?", (a[1],))
    db.commit()
    db.close()
    s = DiskStore(tmp_path, FP, 1 << 20)
    assert s.get(a) is None  # old: IndexError, an engine death on every restart
    s.close()


def test_a_corrupt_index_is_replaced_by_a_fresh_one_with_one_warning(tmp_path, caplog):
    s, a, _ = _two_groups(tmp_path)
    s.close()
    (tmp_path / "index.sqlite").write_bytes(b"this is not a database" * 100)
    for f in tmp_path.glob("index.sqlite-*"):
        f.unlink()
    with caplog.at_level(logging.WARNING, logger="kvreuse.store"):
        s = DiskStore(tmp_path, FP, 1 << 20)  # old: refused ("move the directory away"), every start
    assert [r.getMessage() for r in caplog.records if "index.sqlite is unreadable" in r.getMessage()]
    assert len(caplog.records) == 1, [r.getMessage() for r in caplog.records]
    assert s.match(a) == 0 and s.stats().groups == 0  # its pages are gone (the index held their tokens)
    assert not list((tmp_path / "groups").iterdir())  # and their files, unindexed now
    assert put_chain(s, list(range(8))) == a  # the fresh index takes writes and serves them
    assert torch.equal(s.get(a), torch.stack([page_kv(k) for k in a])) and s.check().pages == len(a)
    s.close()


def test_an_index_that_cannot_be_opened_is_refused_in_one_line_and_kept(tmp_path):
    """Not damage (here: a directory where the file should be; likewise no permission, a full disk):
    the index may be sound, so it is never replaced; start-up stops with one line."""
    s, _, _ = _two_groups(tmp_path)
    s.close()
    for f in tmp_path.glob("index.sqlite*"):
        f.unlink()
    (tmp_path / "index.sqlite").mkdir()
    (tmp_path / "index.sqlite" / "keep").write_text("x")
    with pytest.raises(StoreError) as e:
        DiskStore(tmp_path, FP, 1 << 20)
    assert "index.sqlite cannot be opened" in str(e.value) and "\n" not in str(e.value)
    assert (tmp_path / "index.sqlite" / "keep").exists()
    with pytest.raises(StoreError, match="cannot be opened"):  # the lock was released: not "in use"
        DiskStore(tmp_path, FP, 1 << 20)


def test_a_failed_window_snapshot_write_drops_the_snapshot_not_the_engine(tmp_path, caplog):
    """The window snapshots' files (``window_states/``): a write that fails (here the folder replaced by a
    file; likewise a full disk) drops that snapshot with one warning (the old write raised into the
    engine step); a ``.tmp`` a crash left is deleted at the next open."""
    from kvreuse.runtime.cache.store.states import StateTier

    folder = tmp_path / "window_states"
    tier = StateTier(0, folder, disk_bytes=1 << 20)
    tier.put(b"a" * 32, torch.ones(8), durable=True)
    before = tier.disk_nbytes
    shutil.rmtree(folder)
    folder.write_text("not a folder")
    with caplog.at_level(logging.WARNING, logger="kvreuse.store"):
        for k in (b"b", b"c"):
            tier.put(k * 32, torch.ones(8), durable=True)
    assert tier.failed >= 2 and len(caplog.records) == 1 and tier.disk_nbytes == before
    assert tier.get(b"b" * 32) is None and tier.get(b"a" * 32) is None  # recomputed, never raised
    folder.unlink()
    folder.mkdir()
    (folder / ("d" * 64 + ".tmp")).write_bytes(b"cut short")
    StateTier(0, folder, disk_bytes=1 << 20)
    assert not list(folder.glob("*.tmp"))
