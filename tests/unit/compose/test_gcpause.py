"""The collector paused through a start: what exists is frozen, collection resumes once the server serves (or at
the cap), and nothing of it is left behind."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, cast

import pytest

from cryobox.compose import gcpause


@pytest.fixture(autouse=True)
def collector() -> Iterator[None]:
    yield
    gc.unfreeze()
    gc.enable()


async def test_held_until_the_server_serves() -> None:
    server = SimpleNamespace(started=False, should_exit=False)
    timer = gcpause.hold(asyncio.get_running_loop())
    assert not gc.isenabled() and gc.get_freeze_count() > 0
    releasing = asyncio.create_task(gcpause.release_once_serving(cast(Any, server)))
    await asyncio.sleep(0.05)
    assert not gc.isenabled()  # still starting
    server.started = True
    await asyncio.wait_for(releasing, 1)
    assert gc.isenabled()
    timer.cancel()


async def test_the_hold_has_a_cap() -> None:
    gcpause.hold(asyncio.get_running_loop(), max_s=0.05)
    assert not gc.isenabled()
    await asyncio.sleep(0.15)  # a first start baking templates: collection resumes anyway
    assert gc.isenabled()


async def test_a_stop_before_serving_releases_too() -> None:
    server = SimpleNamespace(started=False, should_exit=False)
    timer = gcpause.hold(asyncio.get_running_loop())
    releasing = asyncio.create_task(gcpause.release_once_serving(cast(Any, server)))
    await asyncio.sleep(0.03)
    releasing.cancel()  # the serve ended while starting
    with pytest.raises(asyncio.CancelledError):
        await releasing
    assert gc.isenabled()
    timer.cancel()
