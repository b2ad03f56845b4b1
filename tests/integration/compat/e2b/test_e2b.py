"""An application written against E2B's SDK works unchanged against ``cryobox serve``.

The SDK (``e2b``, pinned) is installed from PyPI into its own virtualenv (under the cache dir, once per
version), and the application (``apps/e2b_app.py``) sees only ``E2B_API_URL``, ``E2B_SANDBOX_URL`` and
``E2B_API_KEY``, as a user pointing it at a self-hosted E2B would set them.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from cryobox.bench.server import ServeProcess
from tests.support.e2b import e2b_env, run_app
from tests.support.paths import APPS


def test_e2b_sdk_application_runs_unchanged(e2b_python: Path, server: ServeProcess) -> None:
    report = run_app(e2b_python, server.url, server.api_key, server.data_dir)
    # commands
    assert report["run"] == {"stdout": "out\n", "stderr": "err\n", "exit_code": 0}
    assert report["run_failing"] == {"exit_code": 7, "stdout": "partial\n", "class": "CommandExitException"}
    assert report["on_stdout"]["chunks"] == "line1\nline2\nline3\n"
    assert report["envs_cwd"] == "hi /tmp\n"
    assert report["sandbox_env"] == "set-at-create\n"
    assert report["whoami"] == "user" and report["as_root"] == "root"  # E2B's default user, and user="root"
    bg = report["background"]
    assert bg["listed"] and bg["killed"] and bg["gone"], bg
    assert bg["waited"] == {"exit_code": 3, "stdout": "bg-done\n"}
    assert report["stdin"] == "got:typed\n"
    assert report["pty"] == {"size": True, "echo": True}
    # files
    assert report["make_dir"] is True and report["make_dir_again"] is False
    assert report["read_text"] == "hello e2b" and report["read_bytes_ok"] is True
    assert report["list"] == ["blob.bin", "hello.txt"]
    assert report["exists"] == [True, False]
    assert report["get_info"] == {"name": "hello.txt", "type": "file", "size": 9, "owner": "user"}
    assert report["rename"] == "renamed.txt" and report["owner_of_written"] == "user"
    kinds = [kind for name, kind in report["watch"] if name == "watched.txt"]
    assert "create" in kinds and "remove" in kinds, report["watch"]
    assert report["remove"] is False
    # lifecycle
    assert report["sandbox_id"] in report["sandbox_list"]["ids"] and set(report["sandbox_list"]["state"]) == {"running"}
    assert report["sandbox_info"] == {"metadata": {"app": "e2b"}, "state": "running", "template": "base"}
    assert report["set_timeout"] is True
    metrics = report["metrics"]  # sampled by the agent (every second for the suite's server), read by the SDK
    assert metrics["cpus"] == 1 and metrics["mem_ok"] and metrics["disk"], metrics
    assert metrics["samples"] >= 2 and metrics["in_order"] and metrics["cpu_ok"], metrics
    assert metrics["since"] and metrics["listed"], metrics
    assert report["connect"] == "connected\n"
    pause = report["pause_connect"]
    assert pause["paused"] is True and pause["state_paused"] is True, pause
    assert pause["after"] == "kept\nalive\n", pause
    logs = report["logs"]  # the agent's lines and the guest's console, through the SDK's API client
    assert logs["console"] and logs["started"] and logs["paused"], logs
    assert "info" in logs["levels"] and logs["newest"] == ["cryobox-console-42"], logs
    # snapshots and forks
    snap = report["snapshot_restore"]
    assert snap["file"] == "1\n" and snap["process_alive"] is True, snap
    fork = report["fork"]
    assert fork["children"] == 2 and all(len(e) == 32 for e in fork["entropy"]), fork
    assert fork["entropy"][0] != fork["entropy"][1], "fork children must not share entropy"
    assert report["kill"] is True
    assert "NotFound" in report["after_kill"]["error"]
    net = report["network"]
    assert net["create"] == {"internet": False, "allow_out": ["1.1.1.1/32"], "deny_out": ["0.0.0.0/0"]}, net
    assert net["updated"] == {"internet": False, "allow_out": ["example.org"], "deny_out": ["0.0.0.0/0"]}, net
    assert net["no_internet"]["internet"] is False and net["still_runs"] == "ok\n", net
    assert net["reached"] == {"example.org": True, "other.example.com": False}, net  # enforced in the guest
    assert "network.dnsServers" in net["update_refused"].get("message", ""), net
    for name, field in (
        ("rules", "network.rules"),
        ("egress_proxy", "network.egressProxy"),
        ("dns_servers", "network.dnsServers"),
        ("https_ports", "network.httpsPorts"),
    ):
        assert field in net[f"refused_{name}"].get("message", ""), (name, net[f"refused_{name}"])


CODE_APP = APPS / "e2b_code_app.py"


def test_e2b_code_interpreter_sdk_runs_unchanged(e2b_python: Path, server: ServeProcess) -> None:
    """``e2b-code-interpreter``: a stateful kernel baked warm into ``code-interpreter`` (its default template,
    ``code-interpreter-v1``), reached on port 49999 through the sandbox URL and the port proxy."""
    env = e2b_env(server.url, server.api_key, server.data_dir)
    done = subprocess.run([str(e2b_python), str(CODE_APP)], env=env, capture_output=True, text=True, timeout=900)
    assert done.stdout.strip(), f"no report (rc {done.returncode}): {done.stderr[-4000:]}"
    report = json.loads(done.stdout.strip().splitlines()[-1])
    errors = {k: v["error"] for k, v in report.items() if k != "_ms" and isinstance(v, dict) and "error" in v}
    assert not errors, json.dumps({k: report[k] for k in errors}, indent=1)
    assert report["first_1_plus_1"] == "2"
    assert report["state"] == [True, "42"]
    assert report["rich"]["html_table"] is True and report["rich"]["png_sig"] == "89504e470d0a1a0a"
    assert report["rich"]["png_bytes"] > 1000
    assert report["error"] == {"name": "ValueError", "value": "bad value", "tb": True, "after": "41"}
    assert report["callbacks"] == {"stdout": "a\nb\n", "result": "7"}
    assert report["contexts"] == {"isolated": "NameError", "listed": True}
    assert report["timeout_then_works"] == {"raised": "TimeoutException", "after": "43"}
    assert report["kill"] is True
