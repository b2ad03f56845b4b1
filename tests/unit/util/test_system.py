"""Child processes of the agent do not inherit the control plane's secrets; a stopping process gives way."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cryobox.util.system import CONTROL_SECRETS, YIELD_NICENESS, scrubbed_env


def test_helpers_lose_the_secrets_and_keep_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in CONTROL_SECRETS:
        monkeypatch.setenv(name, "s3cret")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "store-credential")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    env = scrubbed_env()
    assert not set(CONTROL_SECRETS) & set(env)
    assert env["AWS_SECRET_ACCESS_KEY"] == "store-credential"  # the memory server reads the store
    assert scrubbed_env(minimal=True) == {"PATH": "/usr/bin:/bin"}  # an unjailed QEMU needs nothing else
    assert "CRYOBOX_SECRET_KEY" in CONTROL_SECRETS and "CRYOBOX_API_KEY" in CONTROL_SECRETS


YIELDING = """
import os, threading
from cryobox.util.system import yield_cpu
ready, done = threading.Event(), threading.Event()
def worker():
    ready.set()
    done.wait()
t = threading.Thread(target=worker)
t.start()
ready.wait()
lowered = yield_cpu()
def nice(tid):
    return int(open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()[16])
nices = [nice(tid) for tid in os.listdir("/proc/self/task")]
done.set()
t.join()
print(lowered, *nices)
"""


def test_yield_cpu_lowers_every_thread_of_the_process_not_only_the_caller() -> None:
    out = subprocess.run([sys.executable, "-c", YIELDING], capture_output=True, text=True, check=True, timeout=60)
    lowered, *nices = (int(v) for v in out.stdout.split())
    assert lowered == len(nices) == 2  # the main thread and the worker (niceness is per thread on Linux)
    assert nices == [YIELD_NICENESS, YIELD_NICENESS]
