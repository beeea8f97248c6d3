"""The disk and host tiers on their own: keys, round trips, persistence, budgets, faults."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from kvreuse.runtime.cache.store import DiskStore, HostStore, StoreError, page_keys, root_key

PS = 4
SHAPE = (2, 2, PS, 1, 3)  # layers, k/v, page_size, kv_heads, head_dim
FP = "f" * 40


def page_kv(key: bytes) -> torch.Tensor:
    """Deterministic content per key, so a read can be checked without remembering the write."""
    g = torch.Generator().manual_seed(int.from_bytes(key[:8], "little") & (2**62))
    return torch.randn(SHAPE, generator=g)


def put_chain(store, tokens, namespace=""):
    keys = page_keys(tokens, PS, parent=root_key(namespace))
    toks = [tokens[i * PS : (i + 1) * PS] for i in range(len(keys))]
    kv = torch.stack([page_kv(k) for k in keys])
    store.put(root_key(namespace), True, keys, toks, kv)
    return keys


def test_page_keys_name_the_whole_prefix():
    a = page_keys(list(range(12)), PS)
    b = page_keys(list(range(8)) + [99, 9, 10, 11], PS)
    assert len(a) == 3 and a[:2] == b[:2] and a[2] != b[2]
    c = page_keys([0, 1, 2, 99] + list(range(4, 12)), PS)
    assert all(x != y for x, y in zip(a, c))  # a change in page 0 changes every later key
    assert page_keys(list(range(12)), PS, parent=root_key("tenant-b")) != a
    assert page_keys(list(range(14)), PS) == a  # the partial tail page has no key
    assert page_keys(list(range(12)), PS, parent=a[0], start=4) == a[1:]


def test_round_trip_and_reopen(tmp_path):
    s = DiskStore(tmp_path, FP, 1 << 20)
    keys = put_chain(s, list(range(20)))
    assert s.match(keys) == 5 and s.match(keys[:2] + [b"x" * 16]) == 2
    got = s.get(keys)
    assert torch.equal(got, torch.stack([page_kv(k) for k in keys]))
    s.close()
    s = DiskStore(tmp_path, FP, 1 << 20)
    assert s.match(keys) == 5
    assert torch.equal(s.get(keys[2:4]), torch.stack([page_kv(k) for k in keys[2:4]]))
    recs = list(s.records())
    assert [r.key for r in recs] == keys and recs[0].is_root and recs[1].parent == keys[0]
    assert recs[3].tokens == tuple(range(12, 16))
    s.close()


def test_second_process_and_other_model_refused(tmp_path):
    s = DiskStore(tmp_path, FP, 1 << 20)
    with pytest.raises(StoreError, match="in use"):
        DiskStore(tmp_path, FP, 1 << 20)
    s.close()
    with pytest.raises(StoreError, match="another model"):
        DiskStore(tmp_path, "0" * 40, 1 << 20)
    DiskStore(tmp_path, FP, 1 << 20).close()  # the refusal left the store usable


def test_shared_prefix_is_stored_once(tmp_path):
    s = DiskStore(tmp_path, FP, 1 << 20)
    a = put_chain(s, list(range(16)))
    b = put_chain(s, list(range(8)) + [50, 51, 52, 53, 54, 55, 56, 57])
    assert a[:2] == b[:2] and s.stats().pages == 6
    assert torch.equal(s.get(b), torch.stack([page_kv(k) for k in b]))
    s.close()


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_damaged_group_is_dropped_never_served(tmp_path, damage):
    s = DiskStore(tmp_path, FP, 1 << 20)
    base = put_chain(s, list(range(8)))
    tail = page_keys(list(range(16)), PS)[2:]
    s.put(
        base[-1],
        False,
        tail,
        [list(range(8, 12)), list(range(12, 16))],
        torch.stack([page_kv(k) for k in tail]),
    )
    first = min((tmp_path / "groups").iterdir(), key=lambda f: f.stat().st_mtime_ns)
    data = bytearray(first.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x01
    else:
        data = data[: len(data) // 2]
    first.write_bytes(bytes(data))
    assert s.get(base) is None  # detected by the checksum
    assert s.match(base + tail) == 0  # the group and every page below it are gone
    assert s.stats().pages == 0
    s.close()


def test_budget_evicts_least_recently_used(tmp_path):
    one = DiskStore(tmp_path / "probe", FP, 1 << 30)
    put_chain(one, list(range(8)))
    group_bytes = one.stats().nbytes
    one.close()
    s = DiskStore(tmp_path / "s", FP, int(group_bytes * 2.5))
    a = put_chain(s, list(range(8)))
    b = put_chain(s, list(range(100, 108)))
    s.match(a)  # a is now more recent than b
    c = put_chain(s, list(range(200, 208)))
    assert s.stats().nbytes <= s.budget
    assert s.match(a) == 2 and s.match(c) == 2 and s.match(b) == 0
    s.close()


def test_orphans_dropped_with_their_parent(tmp_path):
    one = DiskStore(tmp_path / "probe", FP, 1 << 30)
    put_chain(one, list(range(4)))
    page_bytes = one.stats().nbytes
    one.close()
    s = DiskStore(tmp_path / "s", FP, page_bytes * 3)
    a = put_chain(s, list(range(4)))
    child = page_keys(list(range(8)), PS)[1:]
    s.put(a[0], False, child, [list(range(4, 8))], page_kv(child[0]).unsqueeze(0))
    s.match(child)  # the child is now more recent than its parent
    put_chain(s, list(range(50, 54)))
    put_chain(s, list(range(60, 64)))  # evicts the least recent group: the parent
    assert s.match(a) == 0
    assert s.match(child) == 0, "a page whose parent is gone can never match: it must not hold budget"
    assert s.stats().pages == 2
    s.close()


def test_crash_leftovers_are_cleaned(tmp_path):
    s = DiskStore(tmp_path, FP, 1 << 20)
    keys = put_chain(s, list(range(8)))
    s.close()
    (tmp_path / "tmp" / "half.safetensors").write_bytes(b"partial")
    (tmp_path / "groups" / "unindexed.safetensors").write_bytes(b"never indexed")
    s = DiskStore(tmp_path, FP, 1 << 20)
    assert not list((tmp_path / "tmp").iterdir())
    assert not (tmp_path / "groups" / "unindexed.safetensors").exists()
    assert s.match(keys) == 2
    s.close()


def test_sigkill_during_writes_serves_nothing_corrupt(tmp_path):
    writer = textwrap.dedent(
        f"""
        import sys, torch
        sys.path.insert(0, {os.getcwd()!r})
        from tests.test_kv_store import put_chain
        from kvreuse.runtime.cache.store import DiskStore
        s = DiskStore({str(tmp_path)!r}, {FP!r}, 1 << 30)
        print("open", flush=True)
        i = 0
        while True:
            put_chain(s, list(range(i * 1000, i * 1000 + 64)))
            i += 1
        """
    )
    p = subprocess.Popen([sys.executable, "-c", writer], stdout=subprocess.PIPE)
    assert p.stdout.readline().strip() == b"open"
    time.sleep(1.5)
    p.send_signal(signal.SIGKILL)
    p.wait()
    s = DiskStore(tmp_path, FP, 1 << 30)
    recs = list(s.records())
    assert recs, "the writer stored nothing before it was killed"
    for r in recs[:: max(1, len(recs) // 40)]:
        got = s.get([r.key])
        assert got is not None and torch.equal(got[0], page_kv(r.key))
    s.close()


def test_host_tier_lru_writes_back_to_disk(tmp_path):
    disk = DiskStore(tmp_path, FP, 1 << 20)
    page_bytes = page_kv(b"x" * 16).numel() * 4
    host = HostStore(page_bytes * 3, on_evict=disk.put)
    keys = put_chain(host, list(range(20)))  # 5 pages into room for 3
    assert len(host) == 3 and host.match(keys) == 0 and host.match(keys[2:]) == 3
    assert disk.match(keys) == 2  # the two oldest went down, in order, with their parents
    host.drain()
    assert disk.match(keys) == 5 and len(host) == 0
    assert torch.equal(disk.get(keys), torch.stack([page_kv(k) for k in keys]))
    disk.close()


def test_lower_tiers_write_in_background_and_serve_meanwhile(tmp_path):
    from kvreuse.runtime.cache.store.tiers import LowerTiers

    disk = DiskStore(tmp_path, FP, 1 << 20)
    tiers = LowerTiers(None, disk)
    tokens = list(range(16))
    keys = page_keys(tokens, PS)
    kv = torch.stack([page_kv(k) for k in keys])
    tiers.write_back(root_key(), True, keys, [tuple(tokens[i * PS : (i + 1) * PS]) for i in range(4)], kv)
    m = tiers.match(keys)  # served from the queue or the disk, whichever has it now
    assert m.total == 4 and m.host == 0
    assert torch.equal(tiers.load(keys, m), kv)
    tiers.flush()
    assert disk.match(keys) == 4 and tiers.stats().written_pages == 4
    tiers.close()
    disk = DiskStore(tmp_path, FP, 1 << 20)
    tiers = LowerTiers(HostStore(1 << 20), disk)
    m = tiers.match(keys)
    assert m == (0, 4, 0) and torch.equal(tiers.load(keys, m), kv)
    assert tiers.stats().loaded_disk_pages == 4
    tiers.close()


def test_prefetch_stages_disk_pages_so_the_load_reads_no_file(tmp_path):
    from kvreuse.runtime.cache.store.tiers import LowerTiers

    disk = DiskStore(tmp_path, FP, 1 << 20)
    keys = put_chain(disk, list(range(16)))
    tiers = LowerTiers(None, disk)
    tiers.prefetch(keys[1:]).result()  # the request's first page is in the pool already, say
    reads = []
    disk.get = lambda ks: reads.append(ks)  # any file read from here on would be recorded
    m = tiers.match(keys[1:])
    assert m.total == 3
    assert torch.equal(tiers.load(keys[1:], m), torch.stack([page_kv(k) for k in keys[1:]]))
    assert reads == [] and tiers._staged_bytes == 0  # served from staging, which is then empty
    tiers.close()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_group_file_reads_back_what_was_written_without_a_copy(tmp_path, dtype):
    from kvreuse.runtime.cache.store import group_file

    kv = torch.randn(5, 2, 2, 4, 1, 8).to(dtype)
    keys = [bytes([i]) * 20 for i in range(5)]
    data = group_file.encode(kv, keys)
    path = tmp_path / "g.safetensors"
    path.write_bytes(data)
    got = group_file.read(path, group_file.checksum(data))
    assert got is not None and got[0].dtype == dtype and torch.equal(got[0], kv)
    assert got[1] == [group_file.key_tag(k) for k in keys]  # the file names its pages
    assert group_file.read(path, group_file.checksum(data + b"x")) is None  # wrong checksum: refused
    path.write_bytes(b"\x08" + data[1:])  # a header that lies, its checksum recomputed to match
    assert group_file.read(path, group_file.checksum(path.read_bytes())) is None


def test_read_ahead_pages_are_viewed_when_consecutive_and_stacked_otherwise():
    from kvreuse.runtime.cache.store.tiers import _rows

    group = torch.randn(6, 3, 4)
    pages = list(group)  # what the read-ahead stages: one view per page
    view = _rows(pages[1:4])
    assert torch.equal(view, group[1:4]) and view.data_ptr() == group[1].data_ptr()
    mixed = _rows([pages[0], pages[2], pages[1]])
    assert torch.equal(mixed, group[[0, 2, 1]])
    other = torch.randn(2, 3, 4)
    assert torch.equal(_rows([pages[5], other[0]]), torch.stack([group[5], other[0]]))
