"""An application written against E2B's Python SDK (``e2b``, pinned), run unchanged against ``cryobox serve``.

It runs in its own virtualenv (the SDK's dependencies are not cryobox's) with only ``E2B_API_URL``,
``E2B_SANDBOX_URL`` and ``E2B_API_KEY`` set, as a user would point it at a self-hosted E2B, and prints one JSON
report; the test asserts every entry. Each step that raises is reported as ``{"error": "<type>: <message>"}``
under its name instead of stopping the run, so one broken method never hides the others.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from e2b import CommandExitException, ConnectionConfig, PtySize, Sandbox, SandboxQuery, SandboxState
from e2b.api.client.api.sandboxes import get_sandboxes_metrics, get_v_2_sandboxes_sandbox_id_logs
from e2b.api.client.models import LogsDirection
from e2b.api.client_sync import get_api_client

REPORT: dict[str, Any] = {}


def api_client() -> Any:
    """The SDK's own client of E2B's REST API (what its methods call), for the routes it has no method for."""
    return get_api_client(ConnectionConfig())


def step(name: str, fn: Callable[[], Any]) -> Any:
    started = time.monotonic()
    try:
        value = fn()
    except Exception as err:  # reported, the run goes on
        REPORT[name] = {"error": f"{type(err).__name__}: {err}", "trace": traceback.format_exc(limit=4)}
        return None
    REPORT[name] = value if isinstance(value, str | int | float | bool | list | dict | type(None)) else repr(value)
    REPORT.setdefault("_ms", {})[name] = round((time.monotonic() - started) * 1000, 1)
    return value


def commands(sbx: Sandbox) -> None:
    def run() -> dict[str, Any]:
        r = sbx.commands.run("echo out; echo err >&2; exit 0")
        return {"stdout": r.stdout, "stderr": r.stderr, "exit_code": r.exit_code}

    step("run", run)

    def failing() -> dict[str, Any]:
        try:
            sbx.commands.run("echo partial; exit 7")
        except CommandExitException as err:
            return {"exit_code": err.exit_code, "stdout": err.stdout, "class": type(err).__name__}
        return {"raised": False}

    step("run_failing", failing)

    def callbacks() -> dict[str, Any]:
        seen: list[str] = []
        sbx.commands.run("for i in 1 2 3; do echo line$i; done", on_stdout=seen.append)
        return {"chunks": "".join(seen)}

    step("on_stdout", callbacks)
    step("envs_cwd", lambda: sbx.commands.run("echo $GREETING $(pwd)", envs={"GREETING": "hi"}, cwd="/tmp").stdout)
    step("sandbox_env", lambda: sbx.commands.run("echo $FROM_CREATE").stdout)
    step("whoami", lambda: sbx.commands.run("whoami").stdout.strip())
    step("as_root", lambda: sbx.commands.run("whoami", user="root").stdout.strip())

    def background() -> dict[str, Any]:
        handle = sbx.commands.run("sleep 600", background=True)
        listed = [p.pid for p in sbx.commands.list()]
        killed = sbx.commands.kill(handle.pid)
        after = [p.pid for p in sbx.commands.list()]
        quick = sbx.commands.run("echo bg-done; exit 3", background=True)
        try:
            quick.wait()
            waited: dict[str, Any] = {"raised": False}
        except CommandExitException as err:
            waited = {"exit_code": err.exit_code, "stdout": err.stdout}
        return {"listed": handle.pid in listed, "killed": killed, "gone": handle.pid not in after, "waited": waited}

    step("background", background)

    def stdin() -> str:
        handle = sbx.commands.run("read line; echo got:$line", background=True, stdin=True)
        handle.send_stdin("typed\n")
        return str(handle.wait().stdout)

    step("stdin", stdin)

    def pty() -> dict[str, Any]:
        handle = sbx.pty.create(PtySize(cols=80, rows=24))
        sbx.pty.resize(handle.pid, PtySize(cols=120, rows=40))
        sbx.pty.send_stdin(handle.pid, b"stty size; echo pty-$((6*7)); exit\n")
        out: list[bytes] = []
        handle.wait(on_pty=out.append)
        text = b"".join(out).decode(errors="replace")
        return {"size": "40 120" in text, "echo": "pty-42" in text}

    step("pty", pty)


def files(sbx: Sandbox) -> None:
    base = "/home/user/e2b"
    step("make_dir", lambda: sbx.files.make_dir(base))
    step("make_dir_again", lambda: sbx.files.make_dir(base))
    step("write_text", lambda: sbx.files.write(f"{base}/hello.txt", "hello e2b").path)
    blob = bytes(range(256)) * 64
    step("write_bytes", lambda: sbx.files.write(f"{base}/blob.bin", blob).path)
    step("read_text", lambda: sbx.files.read(f"{base}/hello.txt"))
    step("read_bytes_ok", lambda: bytes(sbx.files.read(f"{base}/blob.bin", format="bytes")) == blob)
    step("list", lambda: sorted(e.name for e in sbx.files.list(base)))
    step("exists", lambda: [sbx.files.exists(f"{base}/hello.txt"), sbx.files.exists(f"{base}/nope")])

    def info() -> dict[str, Any]:
        entry = sbx.files.get_info(f"{base}/hello.txt")
        return {"name": entry.name, "type": str(entry.type.value), "size": entry.size, "owner": entry.owner}

    step("get_info", info)
    step("rename", lambda: sbx.files.rename(f"{base}/hello.txt", f"{base}/renamed.txt").name)
    step("owner_of_written", lambda: sbx.commands.run(f"stat -c %U {base}/renamed.txt").stdout.strip())

    def watch() -> list[list[str]]:
        handle = sbx.files.watch_dir(base)
        sbx.files.write(f"{base}/watched.txt", "x")
        sbx.files.remove(f"{base}/watched.txt")
        events: list[list[str]] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(e[1] == "remove" for e in events):
            events += [[e.name, str(e.type.value).lower()] for e in handle.get_new_events()]
            time.sleep(0.2)
        handle.stop()
        return events

    step("watch", watch)
    step("remove", lambda: [sbx.files.remove(f"{base}/blob.bin"), sbx.files.exists(f"{base}/blob.bin")][1])


def lifecycle(sbx: Sandbox) -> None:
    def listed() -> dict[str, Any]:
        running = Sandbox.list(query=SandboxQuery(metadata={"app": "e2b"})).next_items()
        return {"ids": [s.sandbox_id for s in running], "state": [str(s.state.value) for s in running]}

    step("sandbox_list", listed)

    def info() -> dict[str, Any]:
        got = sbx.get_info()
        return {"metadata": got.metadata, "state": str(got.state.value), "template": got.template_id}

    step("sandbox_info", info)
    step("set_timeout", lambda: sbx.set_timeout(600) is None)

    def metrics() -> dict[str, Any]:
        samples = sbx.get_metrics()
        deadline = time.monotonic() + 60
        while len(samples) < 2 and time.monotonic() < deadline:  # the agent samples every few seconds
            time.sleep(0.5)
            samples = sbx.get_metrics()
        sample = samples[-1]
        since = sbx.get_metrics(start=sample.timestamp)
        newest = get_sandboxes_metrics.sync_detailed(client=api_client(), sandbox_ids=[sbx.sandbox_id])
        return {
            "cpus": sample.cpu_count,
            "mem_ok": 0 < sample.mem_used < sample.mem_total,
            "disk": 0 < sample.disk_used < sample.disk_total,
            "samples": len(samples),
            "in_order": [s.timestamp for s in samples] == sorted(s.timestamp for s in samples),
            "cpu_ok": all(0 <= s.cpu_used_pct <= 100 for s in samples),
            # from the newest sample on (more may have been taken since: the agent samples every second), without
            # the older ones
            "since": bool(since)
            and all(s.timestamp >= sample.timestamp for s in since)
            and samples[0].timestamp not in {s.timestamp for s in since},
            "listed": sbx.sandbox_id in (newest.parsed.sandboxes if newest.parsed is not None else {}),
        }

    step("metrics", metrics)
    step("connect", lambda: Sandbox.connect(sbx.sandbox_id).commands.run("echo connected").stdout)

    def pause_connect() -> dict[str, Any]:
        sbx.commands.run("echo kept > /tmp/kept; nohup sleep 900 >/dev/null 2>&1 &")
        paused = sbx.pause()
        state = Sandbox.get_info(sbx.sandbox_id).state
        back = Sandbox.connect(sbx.sandbox_id)
        kept = back.commands.run("cat /tmp/kept; pgrep -x sleep >/dev/null && echo alive").stdout
        paused_listed = SandboxState.PAUSED == state
        return {"paused": paused, "state_paused": paused_listed, "after": kept}

    step("pause_connect", pause_connect)

    def logs() -> dict[str, Any]:
        """The sandbox's log through the SDK's own API client: the agent's lines about it (started, paused,
        woken) and a line its guest wrote to the serial console."""
        sbx.commands.run("echo cryobox-console-$((6*7)) > /dev/console", user="root")
        entries: list[Any] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            got = get_v_2_sandboxes_sandbox_id_logs.sync_detailed(sbx.sandbox_id, client=api_client())
            entries = list(got.parsed.logs) if got.parsed is not None and hasattr(got.parsed, "logs") else []
            if any(e.message == "cryobox-console-42" for e in entries):
                break
            time.sleep(0.5)
        agent = [e.message for e in entries if e.fields.additional_properties.get("source") == "agent"]
        console = [e.message for e in entries if e.fields.additional_properties.get("source") == "console"]
        backward = get_v_2_sandboxes_sandbox_id_logs.sync_detailed(
            sbx.sandbox_id, client=api_client(), direction=LogsDirection.BACKWARD, limit=1
        )
        newest = [e.message for e in backward.parsed.logs] if backward.parsed is not None else []
        return {
            "console": "cryobox-console-42" in console,
            "started": any(m.startswith("started: restored from template base") for m in agent),
            "paused": any(m.startswith("hibernated") for m in agent) and "woken from hibernation" in agent,
            "levels": sorted({str(e.level.value) for e in entries}),
            "newest": newest,
        }

    step("logs", logs)


def snapshots_and_forks(sbx: Sandbox) -> None:
    def snapshot_restore() -> dict[str, Any]:
        sbx.commands.run("echo 1 > /tmp/count; nohup sh -c 'while true; do sleep 1; done' >/dev/null 2>&1 &")
        loop = sbx.commands.run("sh -c 'while true; do echo tick; sleep 1; done'", background=True)
        snap = sbx.create_snapshot(name="e2b-app-snap")
        restored = Sandbox.create(snap.snapshot_id)
        try:
            procs = [p.pid for p in restored.commands.list()]
            out = restored.commands.run("cat /tmp/count").stdout
            return {"snapshot_id": snap.snapshot_id, "file": out, "process_alive": loop.pid in procs}
        finally:
            restored.kill()

    step("snapshot_restore", snapshot_restore)

    def fork() -> dict[str, Any]:
        children = sbx.fork(count=2)
        outs = []
        for child in children:
            if isinstance(child, Exception):
                outs.append(f"error: {child}")
                continue
            outs.append(child.commands.run("head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'").stdout)
            child.kill()
        return {"children": len(children), "entropy": outs}

    step("fork", fork)


def latency(sbx: Sandbox) -> list[float]:
    timings = []
    for _ in range(20):
        started = time.monotonic()
        sbx.commands.run("true")
        timings.append(round((time.monotonic() - started) * 1000, 2))
    return sorted(timings)


def fleet() -> int:
    """The short run for a fleet (control plane and agents in separate processes): sandbox calls reach the guest
    through the control plane and the sandbox's agent."""
    sbx = step("create", lambda: Sandbox.create(metadata={"app": "e2b-fleet"}, envs={"FROM_CREATE": "fleet"}))
    try:
        if sbx is None:
            return 1
        REPORT["sandbox_id"] = sbx.sandbox_id
        step("run", lambda: sbx.commands.run("echo $FROM_CREATE; whoami").stdout)

        def background() -> dict[str, Any]:
            handle = sbx.commands.run("sleep 600", background=True)
            listed = handle.pid in [p.pid for p in sbx.commands.list()]
            return {"listed": listed, "killed": sbx.commands.kill(handle.pid)}

        step("background", background)
        step("write_read", lambda: [sbx.files.write("/home/user/f.txt", "fleet file").path, sbx.files.read("f.txt")])

        def watch() -> list[str]:
            handle = sbx.files.watch_dir("/home/user")
            sbx.commands.run("touch /home/user/touched")
            deadline, names = time.monotonic() + 20, []
            while time.monotonic() < deadline and "touched" not in names:
                names += [e.name for e in handle.get_new_events()]
                time.sleep(0.2)
            handle.stop()
            return names

        step("watch", watch)
        step("kill", sbx.kill)
    finally:
        print(json.dumps(REPORT, default=repr))
    return 0


def _refusal(fn: Callable[[], Any]) -> dict[str, Any]:
    """What a call cryobox must refuse raised (its class and message); ``created`` if it did not raise."""
    try:
        made = fn()
    except Exception as err:
        return {"class": type(err).__name__, "message": str(err)}
    if isinstance(made, Sandbox):
        made.kill()
    return {"created": True}


def _network(info: Any) -> dict[str, Any]:
    net = info.network or {}
    return {"internet": info.allow_internet_access, "allow_out": net.get("allow_out"), "deny_out": net.get("deny_out")}


FETCH = """
import json, sys, urllib.request
out = {}
for name in sys.argv[1:]:
    try:
        with urllib.request.urlopen("http://" + name + "/", timeout=8) as r:
            out[name] = json.loads(r.read())["host"] == name
    except Exception:
        out[name] = False
print(json.dumps(out))
"""


def _reached(sbx: Sandbox) -> dict[str, bool]:
    """Which names the guest reaches now (resolved by its name server, through its egress proxy)."""
    result = sbx.commands.run(f"python3 -c {shlex.quote(FETCH)} example.org other.example.com", timeout=90)
    reached: dict[str, bool] = json.loads(result.stdout)
    return reached


def network() -> dict[str, Any]:
    """E2B's network options through the SDK: allow/deny lists and ``allow_internet_access`` at create,
    ``update_network``, and a refusal naming each option cryobox does not enforce; and what the guest then
    reaches by name (the test server's guests resolve in the suite's own internet)."""
    out: dict[str, Any] = {}
    sbx = Sandbox.create(network={"allow_out": ["1.1.1.1"], "deny_out": ["0.0.0.0/0"]})
    try:
        out["create"] = _network(Sandbox.get_info(sbx.sandbox_id))
        sbx.update_network({"allow_out": ["example.org"], "deny_out": ["0.0.0.0/0"]})
        out["updated"] = _network(Sandbox.get_info(sbx.sandbox_id))
        out["update_refused"] = _refusal(lambda: sbx.update_network({"dns_servers": ["1.1.1.1"]}))
        out["still_runs"] = sbx.commands.run("echo ok").stdout
        out["reached"] = _reached(sbx)
    finally:
        sbx.kill()
    closed = Sandbox.create(allow_internet_access=False)
    try:
        out["no_internet"] = _network(Sandbox.get_info(closed.sandbox_id))
    finally:
        closed.kill()
    refused: dict[str, Any] = {
        "rules": {"api.example.org": [{"transform": {"headers": {"X-Key": "k"}}}]},
        "egress_proxy": {"address": "proxy.example.org:1080"},
        "dns_servers": ["1.1.1.1"],
        "https_ports": [3000],
    }
    for name, value in refused.items():
        options: dict[str, Any] = {"allow_out": ["api.example.org"], name: value}
        out[f"refused_{name}"] = _refusal(lambda options=options: Sandbox.create(network=options))  # type: ignore[misc]
    return out


def main() -> int:
    if sys.argv[1:] == ["fleet"]:
        return fleet()
    sbx = step("create", lambda: Sandbox.create(metadata={"app": "e2b"}, envs={"FROM_CREATE": "set-at-create"}))
    try:
        if sbx is None:
            return 1
        REPORT["sandbox_id"] = sbx.sandbox_id
        for part in (commands, files, lifecycle, snapshots_and_forks):
            step(part.__name__, lambda part=part: part(sbx))  # type: ignore[misc]
        step("true_ms", lambda: latency(sbx))
        step("network", network)
        step("kill", sbx.kill)
        step("after_kill", lambda: Sandbox.get_info(sbx.sandbox_id))
    finally:
        print(json.dumps(REPORT, default=repr))
    return 0


if __name__ == "__main__":
    sys.exit(main())
