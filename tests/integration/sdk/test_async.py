"""AsyncSandbox against a real server: the same operations as the sync SDK, concurrently."""

from __future__ import annotations

import asyncio

import pytest

from cryobox import AsyncSandbox, SandboxTimeout
from tests.support.serve import Api


async def test_async_sdk_create_exec_files_stream(api: Api) -> None:
    async with await AsyncSandbox.create(template="base", **api) as sbx:
        result = await sbx.exec("echo async; exit 2")
        assert (result.stdout, result.exit_code) == ("async\n", 2)
        await sbx.filesystem.write("/work/a.txt", "alpha")
        assert await sbx.filesystem.read("/work/a.txt") == b"alpha"
        events = [e async for e in sbx.exec_stream("echo 1; echo 2 >&2; exit 0")]
        assert events[-1].kind == "exit" and events[-1].exit_code == 0
        with pytest.raises(SandboxTimeout):
            await sbx.exec("sleep 20", timeout_seconds=1)


async def test_async_sdk_concurrent_creates(api: Api) -> None:
    async def one(i: int) -> str:
        async with await AsyncSandbox.create(template="base", metadata={"i": str(i)}, **api) as sbx:
            return (await sbx.exec(f"echo {i}")).stdout

    assert await asyncio.gather(*(one(i) for i in range(4))) == [f"{i}\n" for i in range(4)]
