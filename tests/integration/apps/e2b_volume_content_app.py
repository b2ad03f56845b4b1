"""E2B's volume content API through the pinned ``e2b`` SDK, unchanged (``E2B_VOLUME_API_URL``): files and
directories written, listed, read, changed and removed with no sandbox of the caller's; a sandbox mounting the
volume sees them; while it has the volume mounted read-write the content API refuses; after it is killed the
content API reads what it wrote. One JSON report."""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
from typing import Any

from e2b import Sandbox, Volume

REPORT: dict[str, Any] = {}
DATA = bytes(range(256)) * 64


def step(name: str, fn: Callable[[], Any]) -> Any:
    try:
        value = fn()
    except Exception as err:  # reported, the run goes on
        REPORT[name] = {"error": type(err).__name__, "message": str(err)[:300], "trace": traceback.format_exc(limit=3)}
        return None
    REPORT[name] = value
    return value


def refusal(fn: Callable[[], Any]) -> str | None:
    try:
        fn()
    except Exception as err:
        return type(err).__name__
    return None


def entry(e: Any) -> dict[str, Any]:
    return {"name": e.name, "type": str(getattr(e.type, "value", e.type)), "path": e.path, "size": e.size,
            "mode": e.mode, "uid": e.uid, "gid": e.gid}  # fmt: skip


def main() -> int:
    vol = None
    sandbox: Sandbox | None = None
    try:
        vol = Volume.create(sys.argv[1])
        step("written", lambda: entry(vol.write_file("/hello.txt", "from-content")))
        step("dir", lambda: entry(vol.make_dir("/d/e", force=True)))
        step("binary", lambda: entry(vol.write_file("/d/e/data.bin", DATA, mode=0o600)))
        step("listed", lambda: sorted((e.path, str(getattr(e.type, "value", e.type))) for e in vol.list("/", depth=3)))
        step("info", lambda: entry(vol.get_info("/hello.txt")))
        step("exists", lambda: [vol.exists("/hello.txt"), vol.exists("/nope")])
        step("chmod", lambda: vol.update_metadata("/hello.txt", mode=0o640).mode)
        step("read_text", lambda: vol.read_file("/hello.txt"))
        step("read_bytes", lambda: bytes(vol.read_file("/d/e/data.bin", format="bytes")) == DATA)
        REPORT["read_missing"] = refusal(lambda: vol.read_file("/nope"))
        mounted = Sandbox.create(volume_mounts={"/mnt/data": vol})  # the content API's sandbox lets go of it
        sandbox = mounted
        show = "cat /mnt/data/hello.txt; stat -c %a /mnt/data/d/e/data.bin"
        step("in_sandbox", lambda: mounted.commands.run(show).stdout)
        REPORT["while_mounted"] = refusal(lambda: vol.read_file("/hello.txt"))
        mounted.commands.run("echo from-sandbox > /mnt/data/out.txt && sync")
        mounted.kill()
        sandbox = None
        step("after_kill", lambda: vol.read_file("/out.txt"))
        step("removed", lambda: [vol.remove("/d"), vol.exists("/d")][1])
        step("destroyed", lambda: Volume.destroy(vol.volume_id))
    except Exception as err:
        REPORT["fatal"] = f"{type(err).__name__}: {err}"
    finally:
        if sandbox is not None:
            try:
                sandbox.kill()
            except Exception:
                pass
        if vol is not None and REPORT.get("destroyed") is not True:
            try:
                Volume.destroy(vol.volume_id)
            except Exception:
                pass
        print(json.dumps(REPORT, default=repr))
    return 0


if __name__ == "__main__":
    sys.exit(main())
