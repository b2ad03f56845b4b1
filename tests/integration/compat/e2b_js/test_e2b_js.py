"""Applications written against E2B's JavaScript SDKs work unchanged against ``cryobox serve``.

npm's ``e2b`` and ``@e2b/code-interpreter`` (pinned in ``tests/js/package.json``, installed by ``make setup``) run in
node programs under ``tests/js/`` that see only ``E2B_API_URL``, ``E2B_SANDBOX_URL`` and ``E2B_API_KEY`` — the
variables the JS SDK reads, as the Python SDK does (and ``E2B_VOLUME_API_URL`` for volumes) — and print one JSON
report; every entry is asserted here.
"""

from __future__ import annotations

import secrets

from cryobox.bench.server import ServeProcess
from tests.support.e2b_js import node_app_env, run_node_app


def test_e2b_js_sdk_application_runs_unchanged(server: ServeProcess) -> None:
    run = secrets.token_hex(4)
    report = run_node_app("e2b_app.mjs", node_app_env(server.url, server.api_key, server.data_dir, E2B_JS_RUN=run))
    sid = report["sandbox_id"]
    # commands: exit codes, callbacks, envs, users, background processes, stdin, timeouts, PTY
    assert report["run"] == {"stdout": "out\n", "stderr": "err\n", "exitCode": 0}
    assert report["run_failing"] == {
        "class": "CommandExitError",
        "isCommandExitError": True,
        "exitCode": 7,
        "stdout": "partial\n",
        "stderr": "oops\n",
    }
    assert report["callbacks"] == {
        "stdout": "line1\nline2\nline3\n",
        "stderr": "warn1\nwarn2\nwarn3\n",
        "result": "line1\nline2\nline3\n",
    }
    assert report["envs_cwd"] == "hi /tmp\n" and report["sandbox_env"] == "set-at-create\n"
    assert report["whoami"] == "user" and report["as_root"] == "root"
    bg = report["background"]
    assert bg["listed"] is True and bg["killed"] is True and bg["gone"] is True, bg
    assert bg["killedWait"]["class"] == "CommandExitError", bg  # killed by a signal: no exit code of its own
    assert bg["waited"] == {"class": "CommandExitError", "exitCode": 3, "stdout": "bg-done\n"}, bg
    assert bg["ok"] == {"exitCode": 0, "stdout": "fine\n"} and bg["killAgain"] is False, bg
    assert report["stdin"] == "got:typed\n"
    assert report["close_stdin"] == "abc"
    listed = report["listed_process"]
    assert listed["cmd"] == "/bin/bash" and listed["args"] == ["-l", "-c", "sleep 30"], listed
    assert listed["cwd"] == "/tmp" and listed["envs"]["A"] == "1", listed
    assert report["disconnect_reconnect"] == "x\n"
    assert report["connect_process"] == {"stdout": "later\n", "streamed": "later\n"}
    assert report["command_timeout"] == {"class": "TimeoutError", "isTimeout": True, "seconds": 2}
    pty = report["pty"]
    assert pty["seen"] and pty["size"] and pty["echo"] and pty["listed"] and pty["killed"] is True, pty
    assert pty["ended"] == {"class": "CommandExitError"}, pty
    assert report["pty_reconnect"] is True
    # files
    assert report["make_dir"] == [True, False]
    assert report["write_text"] == "/home/user/e2bjs/hello.txt"
    assert report["write_many"] == ["/home/user/e2bjs/many/a.txt", "/home/user/e2bjs/many/b.txt"]
    assert report["write_stream"] == "/home/user/e2bjs/many/streamed.txt"  # a ReadableStream body
    assert report["read_stream"] == "chunk0\nchunk1\nchunk2\nchunk3\n"
    assert report["read_text"] == "hello e2b js"
    assert report["read_bytes"] == {"type": "Uint8Array", "length": 16384, "equal": True}
    assert report["read_blob"] == "A" and report["read_relative"] == "B"
    assert report["list"] == ["blob.bin:file", "hello.txt:file", "many:dir"]
    assert report["exists"] == [True, False]
    assert report["get_info"] == {
        "name": "hello.txt",
        "type": "file",
        "size": 12,
        "owner": "user",
        "path": "/home/user/e2bjs/hello.txt",
    }
    assert report["rename"] == "renamed.txt" and report["owner_of_written"] == "user"
    assert report["read_missing"] == {"class": "FileNotFoundError", "isNotFound": True}
    watch = report["watch"]
    kinds = [kind for name, kind in watch["events"] if name == "watched.txt"]
    assert watch["seen"] and "create" in kinds and kinds[-1] == "remove", watch
    signed = report["signed_urls"]
    assert signed == {"signed": True, "upload": 200, "download": 200, "body": "signed upload\n", "tampered": 401}
    assert report["remove"] is False
    # lifecycle
    assert report["sandbox_list"] == {
        "ids": [sid],
        "states": ["running"],
        "other": 0,
        "hasNext": False,
        "inRunning": True,
        "paused": 0,
    }
    info = report["sandbox_info"]
    assert info["sandboxId"] == sid and info["metadata"] == {"app": "e2b-js", "run": run}, info
    assert info["state"] == "running" and info["templateId"] == "base", info
    assert 300 <= info["seconds"] <= 360, info  # timeoutMs 300 s, counted from the last activity
    assert 290 <= report["set_timeout"]["movedSeconds"] <= 310, report["set_timeout"]  # 300 s → 600 s
    assert report["is_running"] is True
    assert report["update_network"] == {
        "network": {"allowOut": [], "denyOut": ["10.0.0.0/8"], "allowPublicTraffic": True},
        "after": {"allowOut": [], "denyOut": [], "allowPublicTraffic": True},
    }
    metrics = report["metrics"]
    assert metrics["count"] >= 2 and metrics["cpuCount"] == 1 and metrics["memOk"] and metrics["diskOk"], metrics
    assert report["connect"] == "connected\n"
    assert report["pause_connect"] == {
        "paused": True,
        "state": "paused",
        "runningWhilePaused": False,
        "after": "kept\nalive\n",
        "stateAfter": "running",
    }
    assert report["beta_pause_connect"] == {"paused": True, "state": "paused", "after": "kept\n"}
    # snapshots, restore, fork
    snap = report["snapshot_restore"]
    assert snap["snapshotId"] and snap["listed"] and snap["listedAll"] and snap["restoredId"], snap
    assert snap["stillRuns"] == "1\n" and snap["file"] == "1\n" and snap["processAlive"] is True, snap
    assert snap["original"] == "1\n", snap  # the restored sandbox's write stayed its own
    assert report["fork"] == {"count": 1, "children": [{"id": True, "file": "child\n"}], "parent": "before-fork\n"}
    assert report["delete_snapshot"] == {"deleted": True, "listed": False}
    # volumes: the content API (E2B_VOLUME_API_URL), and a mount whose guest write outlives its sandbox
    assert report["volume_files"] == {
        "read": "from js volume",
        "list": ["hello.txt:file"],
        "exists": [True, False],
        "info": {"name": "hello.txt", "size": 14, "type": "file"},
        "listed": True,
    }
    assert report["volume_mount"] == {"seen": "from js volume", "killed": True, "afterKill": "from-guest\n"}
    assert report["volume_destroy"] is True
    # kill
    kills = {k: v for k, v in report.items() if k.startswith("kill_sb")}
    assert len(kills) == 2 and all(v is True for v in kills.values()), kills
    assert report["kill"] is True and report["is_running_after_kill"] is False
    assert report["after_kill"] == {"class": "SandboxNotFoundError", "isNotFound": True}
    assert report["kill_again"] is False


def test_e2b_js_code_interpreter_runs_unchanged(server: ServeProcess) -> None:
    """``@e2b/code-interpreter``: its default template (``code-interpreter-v1``, cryobox's ``code-interpreter``)
    and the kernel on port 49999, reached through the sandbox URL."""
    report = run_node_app("e2b_code_app.mjs", node_app_env(server.url, server.api_key, server.data_dir))
    assert report["template"] == "code-interpreter"
    assert report["first_1_plus_1"] == "2"
    assert report["state"] == [None, "42"]
    rich = report["rich"]
    assert "html" in rich["frameFormats"] and rich["htmlTable"] is True and "a  b" in rich["frameText"], rich
    assert rich["plotFormats"] == ["png"] and rich["pngSig"] == "89504e470d0a1a0a" and rich["pngBytes"] > 1000, rich
    assert report["error"] == {"name": "ValueError", "value": "bad value", "tb": True, "after": "41"}
    callbacks = report["callbacks"]
    # two prints in a row may arrive as one chunk (as from E2B's own Jupyter kernels): what was printed, in order
    logs = callbacks.pop("logs")
    assert "".join(logs["stdout"]) == "a\nb\n" and all(chunk.endswith("\n") for chunk in logs["stdout"]), logs
    assert logs["stderr"] == ["e\n"]
    assert callbacks == {"stdout": "a\nb\n", "stderr": "e\n", "results": ["7"]}
    assert report["envs"] == "'yes'"
    contexts = report["contexts"]
    assert contexts == {"isolated": "NameError", "cwd": "'/tmp'", "kept": "'in ctx'", "listed": True, "removed": True}
    assert report["context_restart"] == "NameError"  # the restarted kernel forgot y
    assert report["language_js"] == {"class": "SandboxError", "message": "400 Bad Request"}  # Python kernels only
    assert report["timeout_then_works"] == {"raised": "TimeoutError", "after": "43"}
    assert report["commands_too"] == "from-envd\n"
    assert report["kill"] is True
