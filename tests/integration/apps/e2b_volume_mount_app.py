"""E2B's volumes through the pinned ``e2b`` SDK, unchanged, on real sandboxes: ``Volume.create``, a sandbox with
``volume_mounts={"/mnt/data": vol}`` writes and syncs, is killed; a second sandbox mounting it reads the data;
``Volume.destroy`` is refused while a sandbox has it and works after. One JSON report."""

from __future__ import annotations

import json
import sys
from typing import Any

from e2b import Sandbox, Volume

REPORT: dict[str, Any] = {}


def main() -> int:
    made: list[Sandbox] = []
    vol = None
    try:
        vol = Volume.create(sys.argv[1])
        first = Sandbox.create(volume_mounts={"/mnt/data": vol})
        made.append(first)
        REPORT["info_mounts"] = Sandbox.get_info(first.sandbox_id).volume_mounts
        first.commands.run("echo from-e2b > /mnt/data/note && sync")
        first.kill()
        second = Sandbox.create(volume_mounts={"/mnt/data": vol.name})
        made.append(second)
        REPORT["read"] = second.commands.run("cat /mnt/data/note").stdout
        try:
            Volume.destroy(vol.volume_id)
            REPORT["destroy_while_attached"] = "destroyed"
        except Exception as err:
            REPORT["destroy_while_attached"] = type(err).__name__
        second.kill()
        REPORT["destroyed"] = Volume.destroy(vol.volume_id)
    except Exception as err:
        REPORT["fatal"] = f"{type(err).__name__}: {err}"
    finally:
        for sandbox in made:
            try:
                sandbox.kill()
            except Exception:  # gone already
                pass
        if vol is not None and "destroyed" not in REPORT:
            try:
                Volume.destroy(vol.volume_id)
            except Exception:
                pass
        print(json.dumps(REPORT, default=repr))
    return 0


if __name__ == "__main__":
    sys.exit(main())
