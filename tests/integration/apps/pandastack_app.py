"""An application written against PandaStack's Python SDK (``pandastack`` on PyPI), with no cryobox code.

Run with PANDASTACK_API / PANDASTACK_API_KEY pointing at a cryobox server; prints one JSON object of what it
observed. ``tests/integration/compat/pandastack/test_pandastack.py`` runs it as a separate process and checks the
results.
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any

import pandastack
from pandastack import Client, CommandFailed, NotFoundError, Sandbox, SandboxTimeout


def main() -> None:
    report: dict[str, Any] = {}
    retries: list[int] = []
    pandastack.set_default_client(Client(on_create_retry=lambda event: retries.append(event.status_code)))

    sbx = Sandbox.create(template="base", metadata={"app": "pandastack"}, ttl_seconds=600)
    try:
        report["created"] = {
            "id": sbx.id,
            "status": sbx.status,
            "template": sbx.template,
            "metadata": sbx.metadata,
            "boot_mode": sbx.boot_mode,
        }
        report["get_status"] = Sandbox.get(sbx.id).status
        report["listed"] = sbx.id in [s.id for s in Sandbox.list()]
        result = sbx.exec("echo hello; echo oops >&2; exit 4")
        report["exec"] = {"stdout": result.stdout, "stderr": result.stderr, "exit_code": result.exit_code}
        try:
            sbx.exec("exit 3", check=True)
            report["check"] = "no error"
        except CommandFailed as err:
            report["check"] = err.exit_code
        try:
            sbx.exec("sleep 30", timeout_seconds=1)
            report["timeout"] = "no error"
        except SandboxTimeout:
            report["timeout"] = "SandboxTimeout"
        out: list[str] = []
        err_chunks: list[str] = []
        code = sbx.exec_stream(
            "for i in 1 2 3; do echo $i; done; echo e >&2; exit 5", on_stdout=out.append, on_stderr=err_chunks.append
        )
        report["stream"] = {"stdout": "".join(out), "stderr": "".join(err_chunks), "exit_code": code}
        sbx.filesystem.write("/work/data/hello.txt", "hi from pandastack")
        sbx.filesystem.write("/work/data/blob.bin", bytes(range(256)))
        report["read"] = sbx.filesystem.read("/work/data/hello.txt").decode()
        report["read_binary_ok"] = sbx.filesystem.read("/work/data/blob.bin") == bytes(range(256))
        report["listdir"] = sorted(e.name for e in sbx.filesystem.listdir("/work/data"))
        stat = sbx.filesystem.stat("/work/data/hello.txt")
        report["stat"] = {"size": stat.size, "is_dir": stat.is_dir, "name": stat.name}
        report["exists"] = [sbx.filesystem.exists("/work/data/hello.txt"), sbx.filesystem.exists("/nope")]
    finally:
        sbx.kill()
    try:
        Sandbox.get(sbx.id)
        report["after_kill"] = "still there"
    except NotFoundError:
        report["after_kill"] = "NotFoundError"

    # capacity retry: the server admits one restore at a time with no queue, so concurrent creates are refused
    # with 503 + Retry-After and the SDK retries them within its budget
    made: list[str] = []
    failures: list[str] = []

    def one() -> None:
        try:
            child = Sandbox.create(template="base")
            made.append(child.id)
            child.kill()
        except pandastack.PandastackError as err:
            failures.append(repr(err))

    threads = [threading.Thread(target=one) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    report["burst"] = {"created": len(made), "failures": failures, "retries": retries}
    json.dump(report, sys.stdout)


def lifecycle() -> None:
    """Snapshot (the SDK POSTs no body), restore from it with a process still alive, fork (no body either), and a
    fork tree of two."""
    report: dict[str, Any] = {}
    sbx = Sandbox.create(template="base", ttl_seconds=600)
    try:
        sbx.filesystem.write("/root/before.txt", "written before the snapshot")
        sbx.exec("nohup sleep 1000 >/dev/null 2>&1 & echo $! > /root/sleeper.pid")
        snap = sbx.snapshot()
        report["snapshot"] = snap.startswith("snap-")
        restored = Sandbox.create(template="base", from_snapshot=snap, ttl_seconds=600)
        try:
            report["restored"] = {
                "file": restored.filesystem.read("/root/before.txt").decode(),
                "process": restored.exec("kill -0 $(cat /root/sleeper.pid) && echo alive").stdout,
            }
        finally:
            restored.kill()
        child = sbx.fork()
        try:
            report["fork"] = child.filesystem.read("/root/before.txt").decode()
        finally:
            child.kill()
        children = sbx.fork_tree(2)
        try:
            report["tree"] = [c.filesystem.read("/root/before.txt").decode() for c in children]
            report["tree_ids"] = len({c.id for c in children} - {sbx.id})
        finally:
            for c in children:
                c.kill()
    finally:
        sbx.kill()
    json.dump(report, sys.stdout)


if __name__ == "__main__":
    lifecycle() if sys.argv[1:] == ["lifecycle"] else main()
