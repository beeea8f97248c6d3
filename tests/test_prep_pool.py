"""Issue 39: request preparation shares its threads fairly between tenants (``runtime/server/prep.py``)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from kvreuse.runtime.server.errors import APIError
from kvreuse.runtime.server.prep import PrepPool

pytestmark = pytest.mark.timeout(60)


def test_a_tenant_flooding_the_pool_never_delays_another_past_its_share():
    async def main() -> tuple[float, list[float]]:
        pool = PrepPool(threads=2, share=1, wait_s=30)
        t0 = time.monotonic()
        flood = [asyncio.ensure_future(pool.run("b", time.sleep, 0.5)) for _ in range(4)]
        await asyncio.sleep(0.05)
        await pool.run("a", lambda: None)
        a_waited = time.monotonic() - t0
        await asyncio.gather(*flood)
        ends = time.monotonic() - t0
        pool.shutdown()
        return a_waited, ends

    a_waited, b_done = asyncio.run(main())
    assert a_waited < 0.3, a_waited  # a FIFO pool of 2 would make A wait for B's 4 x 0.5 s / 2
    assert b_done >= 1.9  # B ran one at a time: its share, not both threads


def test_a_share_is_held_until_the_work_ends_even_if_its_caller_left():
    async def main() -> float:
        pool = PrepPool(threads=2, share=1, wait_s=30)
        release = threading.Event()
        job = asyncio.ensure_future(pool.run("b", release.wait, 5))
        await asyncio.sleep(0.05)
        job.cancel()  # the client went away; the thread still runs
        t0 = time.monotonic()
        second = asyncio.ensure_future(pool.run("b", lambda: None))
        await asyncio.sleep(0.3)
        assert not second.done()  # still waiting for B's one share
        release.set()
        await second
        pool.shutdown()
        return time.monotonic() - t0

    assert asyncio.run(main()) >= 0.3


def test_a_tenant_whose_share_never_frees_gets_a_429():
    async def main() -> None:
        pool = PrepPool(threads=2, share=1, wait_s=0.2)
        release = threading.Event()
        job = asyncio.ensure_future(pool.run("b", release.wait, 5))
        await asyncio.sleep(0.05)
        with pytest.raises(APIError) as e:
            await pool.run("b", lambda: None)
        assert e.value.status == 429 and e.value.code == "prep_busy"
        release.set()
        await job
        pool.shutdown()

    asyncio.run(main())
