"""``python3 -m cryobox_guest.build <command> [json]`` in the build VM (see :mod:`.commands`)."""

from __future__ import annotations

from .commands import main

if __name__ == "__main__":
    raise SystemExit(main())
