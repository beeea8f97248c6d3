"""Issue 51: a damaged disk-tier index (``index.sqlite``) never stops a server from starting.

Garbage bytes, a file cut short or a torn page inside: the server starts with a fresh index and one
warning (the old one refused every start: "index.sqlite is unreadable ... move the directory away"),
the stored responses beside it are all still there, and the store it goes on writing is sound.  Only
the pages the damaged index listed are gone (it is their only record of tokens), recomputed on use.
"""

from __future__ import annotations

import logging
import os
import sqlite3

import httpx
import pytest

from tests.helpers import make_tiny_model, server_client

pytestmark = pytest.mark.timeout(400)
PAGE = 4096  # SQLite's default page size, the index's


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("index") / "m", vocab=49152)


def _damage(path, how: str) -> None:
    data = path.read_bytes()
    assert len(data) >= 4 * PAGE, len(data)  # the store wrote a real index: several pages
    if how == "garbage":
        path.write_bytes(os.urandom(len(data)))
    elif how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "torn-page":  # one page half written: its second half never reached the disk
        last = len(data) // PAGE - 1
        path.write_bytes(data[: last * PAGE + PAGE // 2] + bytes(PAGE // 2))
    else:  # zero length: a file created and never written
        path.write_bytes(b"")


def _stored_conversation(c, turns: int = 3) -> list[dict]:
    out: list[dict] = []
    for k in range(turns):
        body = {"model": "tiny", "max_output_tokens": 3, "temperature": 0, "store": True,
                "input": f"Topic {k}: " + "tell me more about it " * 30,
                "previous_response_id": out[-1]["id"] if out else None}  # fmt: skip
        r = c.post("/v1/responses", json=body)
        assert r.status_code == 200, r.text
        out.append(r.json())
    return out


def _sound(store) -> None:
    """The index the server left is a sound database and every group file in the store is indexed."""
    db = sqlite3.connect(store / "index.sqlite")
    assert db.execute("PRAGMA quick_check").fetchone()[0] == "ok"
    files = {f for (f,) in db.execute("SELECT file FROM groups")}
    db.close()
    assert {f.name for f in (store / "groups").iterdir()} == files


@pytest.mark.parametrize("how", ["garbage", "truncated", "torn-page", "zero-length"])
def test_a_damaged_index_starts_fresh_with_one_warning_and_nothing_else_lost(
    model_dir, tmp_path, how, caplog
):
    store = tmp_path / "store"
    with server_client(model_dir, store) as c:
        kept = _stored_conversation(c)
    _damage(store / "index.sqlite", how)
    with caplog.at_level(logging.WARNING), server_client(model_dir, store) as c:
        assert c.get("/health").json()["status"] == "ok"
        for k in kept:  # the stored responses are all there
            assert c.get(f"/v1/responses/{k['id']}").json() == k
        more = c.post("/v1/responses", json={"model": "tiny", "input": "and then?", "max_output_tokens": 3,
                                              "temperature": 0, "previous_response_id": kept[-1]["id"]})  # fmt: skip
        assert more.status_code == 200, more.text
        assert (
            more.json()["usage"]["input_tokens"] > kept[-1]["usage"]["total_tokens"]
        )  # the whole conversation
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    about = [w for w in warnings if "index.sqlite" in w]
    assert len(about) == (0 if how == "zero-length" else 1), warnings  # an empty file is an empty index
    _sound(store)
    with server_client(model_dir, store) as c:  # and the next start is clean
        assert c.get(f"/v1/responses/{more.json()['id']}").status_code == 200


@pytest.mark.slow
def test_kvreuse_serve_starts_on_a_store_whose_index_is_garbage(model_dir, tmp_path):
    """The same through ``kvreuse serve --kv-store DIR`` as a process (the old one exited with
    "index.sqlite is unreadable ... move the directory away")."""
    from kvreuse.runtime.server.launcher import ServerProcess

    store = tmp_path / "store"
    flags = [
        "--model",
        str(model_dir),
        "--served-model-name",
        "tiny",
        "--dtype",
        "float32",
        "--kv-cache-memory",
        "64M",
        "--kv-store",
        str(store),
    ]
    first = ServerProcess(flags, tmp_path / "first.log").start(timeout=300)
    try:
        with httpx.Client(base_url=first.url, timeout=120) as c:
            kept = _stored_conversation(c, turns=2)
    finally:
        assert first.terminate() == 0
    _damage(store / "index.sqlite", "garbage")
    again = ServerProcess(flags, tmp_path / "again.log").start(timeout=300)
    try:
        with httpx.Client(base_url=again.url, timeout=120) as c:
            for k in kept:
                assert c.get(f"/v1/responses/{k['id']}").json() == k
    finally:
        assert again.terminate() == 0
    log = again.log()
    assert log.count("index.sqlite is unreadable") == 1 and "fresh index" in log, log[-3000:]
    _sound(store)
