"""E2B's ``Volume`` control-plane calls through the pinned ``e2b`` SDK, unchanged: create, list, get_info,
connect (its token), destroy; a taken name and an unknown id as the SDK reports them. One JSON report."""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
from typing import Any

from e2b import Volume

REPORT: dict[str, Any] = {}


def step(name: str, fn: Callable[[], Any]) -> Any:
    try:
        value = fn()
    except Exception as err:  # reported, the run goes on
        REPORT[name] = {"error": f"{type(err).__name__}: {err}", "trace": traceback.format_exc(limit=3)}
        return None
    REPORT[name] = value
    return value


def refusal(fn: Callable[[], Any]) -> dict[str, Any]:
    try:
        fn()
    except Exception as err:
        return {"class": type(err).__name__, "message": str(err)[:300]}
    return {"class": None}


def main() -> int:
    name = sys.argv[1]
    try:
        vol = Volume.create(name)
        REPORT["created"] = {"id": vol.volume_id, "name": vol.name, "has_token": bool(vol.token)}
        step("listed", lambda: sorted(v.name for v in Volume.list()))
        step(
            "info",
            lambda: {"id": Volume.get_info(vol.volume_id).volume_id, "name": Volume.get_info(vol.volume_id).name},
        )
        step("connect_token", lambda: Volume.connect(vol.volume_id).token == vol.token)
        REPORT["taken"] = refusal(lambda: Volume.create(name))
        REPORT["unknown"] = refusal(lambda: Volume.get_info("vol-000000000000"))
        step("destroyed", lambda: Volume.destroy(vol.volume_id))
        step("destroyed_again", lambda: Volume.destroy(vol.volume_id))
        step("listed_after", lambda: sorted(v.name for v in Volume.list()))
    except Exception as err:
        REPORT["fatal"] = f"{type(err).__name__}: {err}"
    print(json.dumps(REPORT, default=repr))
    return 0


if __name__ == "__main__":
    sys.exit(main())
