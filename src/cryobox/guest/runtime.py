"""Where the guest agent itself runs from: the image's own python3, or the agent disk at ``/.cryobox``.

On the agent disk (:mod:`cryobox.image.agentdisk`) the agent is the disk's python3.11, started by
``/.cryobox/init`` through the disk's own loader with nothing in the environment but what user commands
should start from, plus ``LC_ALL=C`` (so the interpreter loads no locale files from the image; it runs in
UTF-8 mode anyway). :func:`settle_environ` drops that before any command starts, so what the agent spawns
inherits nothing of the agent disk.
"""

from __future__ import annotations

import sys
from collections.abc import MutableMapping

AGENT_MOUNT = "/.cryobox"
AGENT_ONLY_ENV = ("LC_ALL",)


def on_agent_disk(prefix: str = sys.prefix) -> bool:
    """Whether this interpreter is the agent disk's (its prefix is under the disk's mount point)."""
    return prefix == AGENT_MOUNT or prefix.startswith(AGENT_MOUNT + "/")


def settle_environ(environ: MutableMapping[str, str], prefix: str = sys.prefix) -> None:
    """Remove what only the agent disk's interpreter needed from ``environ`` (the process's own, by default:
    every child starts from it)."""
    if on_agent_disk(prefix):
        for name in AGENT_ONLY_ENV:
            environ.pop(name, None)
