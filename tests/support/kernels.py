"""The guest's REAL kernel server (``cryobox.guest.kernels``: Jupyter kernels behind E2B's code-interpreter protocol)
in a child process on 127.0.0.1, reached through a fake agent's ``port_target`` as in a sandbox: the fixtures of the
code routes', the SDK's code and PandaStack's REPL unit tests (``kernels`` is module-scoped: one server per module)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from cryobox.agentapi import models as am
from tests.support.app import Env
from tests.support.fake_agent import DEFAULT_TEMPLATE, FakeAgent

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


CODE_TEMPLATE = am.TemplateInfo(name="code-interpreter", generation="g1", cpus=1, memory_mib=512, created_at=0.0)


KERNEL_SERVER = """
import signal, sys, threading
from cryobox.guest.kernels.server import Contexts, make_server

contexts = Contexts(cwd=sys.argv[1], warm=False, spares=0)
try:
    contexts.start_default()
    server = make_server("127.0.0.1", 0, contexts)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    print(server.server_address[1], flush=True)
    server.serve_forever()
    server.server_close()
finally:
    for described in contexts.listed():
        contexts.get(described["id"]).shutdown()
"""


@dataclass
class Kernels:
    url: str
    process: subprocess.Popen[str]


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kernels]:
    """The guest's kernel server (``cryobox.guest.kernels.server``: cold kernels, no spares, so each context
    starts its own kernel) on 127.0.0.1, in a child process: jupyter_client's blocking client calls
    ``nest_asyncio.apply()``, which would patch asyncio for the rest of the test session (``asyncio.run`` that never
    closes its loop, pure-Python tasks) and leaks an unclosed event loop per request thread. SIGTERM makes it
    shut down every kernel it has before it exits, so no kernel process outlives the module."""
    env = {**os.environ, "PYDEVD_DISABLE_FILE_VALIDATION": "1"}  # the kernels' debugger warns at start otherwise
    cwd = str(tmp_path_factory.mktemp("kernels"))
    process = subprocess.Popen(
        [sys.executable, "-c", KERNEL_SERVER, cwd], stdout=subprocess.PIPE, text=True, env=env, cwd=cwd
    )
    try:
        assert process.stdout is not None
        port = process.stdout.readline().strip()
        assert port.isdigit(), f"the kernel server did not start (exit code {process.poll()})"
        yield Kernels(f"http://127.0.0.1:{port}", process)
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()  # its kernels notice their parent is gone and exit (ipykernel's parent poller)
            process.wait(timeout=10)
        if process.stdout is not None:
            process.stdout.close()


def closed_port_url() -> str:
    """An address where nothing listens (connections are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


class KernelAgent(FakeAgent):
    """A fake agent whose ``code-interpreter`` sandboxes have the kernel server on port 49999 (any other port, or
    any other template, has nothing listening)."""

    def __init__(self, kernel_url: str, **kw: Any) -> None:
        super().__init__(templates=[DEFAULT_TEMPLATE, CODE_TEMPLATE], **kw)
        self.kernel_url = kernel_url
        self.closed_url = closed_port_url()

    async def port_target(self, sandbox_id: str, port: int) -> am.PortTarget:
        await super().port_target(sandbox_id, port)  # recorded; a sandbox that is not running refuses
        if port == 49999 and self.sandboxes[sandbox_id].template == CODE_TEMPLATE.name:
            return am.PortTarget(url=self.kernel_url)
        return am.PortTarget(url=self.closed_url)


@pytest.fixture
def agent(kernels: Kernels) -> KernelAgent:
    return KernelAgent(kernels.url, name="a", max_sandboxes=64, vcpus=64, memory_mib=1 << 20)


@pytest.fixture
async def cid(env: Env) -> str:
    """A running ``code-interpreter`` sandbox."""
    return await env.made(template="code-interpreter")
