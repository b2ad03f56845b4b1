"""An upgrade's successor is the old serve's child; the bench, a child subreaper, reaps it like its own child
(run in a subprocess: a test worker must not become a subreaper for the rest of the session)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from cryobox.bench.restart.successor import lock_holder, wait_successor

SCRIPT = """
import signal, subprocess, sys, time
from cryobox.bench.restart.successor import Adopted, become_subreaper
become_subreaper()
# a parent that starts a long-lived child and exits at once, like serve handing over to its successor
parent = subprocess.Popen([sys.executable, "-c",
    "import subprocess, sys; p = subprocess.Popen(['sleep', '60']); print(p.pid, flush=True)"],
    stdout=subprocess.PIPE, text=True)
grandchild = int(parent.stdout.readline())
assert parent.wait(10) == 0
adopted = Adopted(grandchild)
assert adopted.poll() is None
try:
    adopted.wait(timeout=0.2)
    raise SystemExit("wait returned while it ran")
except subprocess.TimeoutExpired:
    pass
adopted.send_signal(signal.SIGTERM)
print(adopted.wait(10))
"""


def test_a_re_parented_grandchild_is_signalled_and_reaped() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "-15"  # its exit status, reaped here (SIGTERM)


def test_the_successor_is_whoever_holds_the_lock_after_the_old_pid(tmp_path: Path) -> None:
    (tmp_path / "agent.lock").write_text("123\n")
    assert lock_holder(tmp_path) == 123
    (tmp_path / "agent.lock").write_text("456\n")
    assert wait_successor(tmp_path, old=123, timeout_s=1) == 456
