"""exec through the public API against real restored VMs."""

from __future__ import annotations

import pytest

from cryobox import Sandbox, SandboxTimeout
from tests.support.serve import Api


def test_stdout_stderr_and_exit_code(sandbox: Sandbox) -> None:
    result = sandbox.exec("echo out; echo err >&2; exit 3")
    assert result.stdout == "out\n"
    assert result.stderr == "err\n"
    assert result.exit_code == 3
    assert result.duration_ms > 0


def test_env_cwd_and_stdin(sandbox: Sandbox) -> None:
    result = sandbox.exec('echo "$GREETING"; pwd; cat', env={"GREETING": "hej"}, cwd="/tmp", stdin="from stdin")
    assert result.stdout == "hej\n/tmp\nfrom stdin"
    assert result.exit_code == 0


def test_timeout_kills_the_whole_process_tree(sandbox: Sandbox) -> None:
    with pytest.raises(SandboxTimeout, match="timed out"):
        sandbox.exec("sleep 300 & echo $! > /tmp/bg.pid; sleep 300", timeout_seconds=2)
    check = sandbox.exec("pid=$(cat /tmp/bg.pid); kill -0 $pid 2>/dev/null && echo alive || echo gone; pgrep -c sleep")
    lines = check.stdout.split()
    assert lines[0] == "gone"
    assert lines[1] == "0", "no sleep process may survive the timeout"


def test_stream_delivers_chunks_in_order(sandbox: Sandbox) -> None:
    cmd = "for i in 1 2 3 4 5; do echo out$i; echo err$i >&2; sleep 0.1; done; exit 7"
    events = list(sandbox.exec_stream(cmd))
    assert events[-1].kind == "exit" and events[-1].exit_code == 7
    assert all(e.kind in ("stdout", "stderr") for e in events[:-1])
    stdout = "".join(e.chunk for e in events if e.kind == "stdout")
    stderr = "".join(e.chunk for e in events if e.kind == "stderr")
    assert stdout == "".join(f"out{i}\n" for i in range(1, 6))
    assert stderr == "".join(f"err{i}\n" for i in range(1, 6))
    # chunks arrive as produced, not in one block at the end: out1 is seen before err5
    order = [e.chunk for e in events[:-1]]
    first_out1 = next(i for i, c in enumerate(order) if "out1" in c)
    first_err5 = next(i for i, c in enumerate(order) if "err5" in c)
    assert first_out1 < first_err5


def test_exec_in_a_deleted_sandbox_is_not_found(api: Api) -> None:
    sbx = Sandbox.create(template="base", **api)
    sbx_id = sbx.id
    sbx.kill()
    from cryobox import NotFound

    with pytest.raises(NotFound):
        Sandbox.connect(sbx_id, **api)
