"""Files the driver puts into the target for the length of a ``RUN`` and takes out again: the build VM's
``/etc/resolv.conf`` (so ``apt-get update`` and ``pip install`` resolve; the image's own comes back afterwards,
whatever the step wrote there, as with Docker's bind mount) and a ``/usr/sbin/policy-rc.d`` that forbids service
starts (as ``cryobox-build-install`` does).

The image's file (or symbolic link) is renamed aside to ``.cryobox-saved.<name>`` in the same directory; a record in
the state directory says what was swapped, so a step killed half way is put right by the next command
(:func:`restore`).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping

from .paths import resolve_in_root
from .writer import remove, replace_text

SAVED_PREFIX = ".cryobox-saved."
RECORD = "overlays.json"
POLICY_RC = "#!/bin/sh\n# cryobox build: no service starts while building\nexit 101\n"


def run_overlays(vm_resolv: str = "/etc/resolv.conf") -> dict[str, tuple[str, int]]:
    """What a ``RUN`` gets: path in the target -> (text, mode)."""
    files = {"/usr/sbin/policy-rc.d": (POLICY_RC, 0o755)}
    with contextlib.suppress(OSError):
        with open(vm_resolv, encoding="utf-8", errors="surrogateescape") as handle:
            files["/etc/resolv.conf"] = (handle.read(), 0o644)
    return files


def _record(state_dir: str) -> str:
    return os.path.join(state_dir, RECORD)


def restore(state_dir: str) -> None:
    """Put back every file a (possibly interrupted) :func:`overlaid` swapped; a no-op when none is."""
    record = _record(state_dir)
    try:
        with open(record) as handle:
            swapped: dict[str, bool] = json.load(handle)
    except FileNotFoundError:
        return
    for host, had in swapped.items():
        saved = os.path.join(os.path.dirname(host), SAVED_PREFIX + os.path.basename(host))
        if had and not os.path.lexists(saved):
            continue  # already restored (or never moved aside): leave the image's file alone
        remove(host)
        if had:
            os.rename(saved, host)
    os.unlink(record)


@contextlib.contextmanager
def overlaid(root: str, files: Mapping[str, tuple[str, int]], state_dir: str) -> Iterator[None]:
    """``files`` (path in the target -> (text, mode)) in place of the image's, for the ``with`` block.

    A file whose directory the image lacks is not added (no directory is created for it).
    """
    restore(state_dir)
    plan: list[tuple[str, bool, str, int]] = []
    for path, (text, mode) in files.items():
        host = resolve_in_root(root, path)
        parent = os.path.dirname(host)
        if os.path.isdir(parent) and not os.path.islink(parent) and not os.path.isdir(host):
            plan.append((host, os.path.lexists(host), text, mode))
    os.makedirs(state_dir, exist_ok=True)
    with open(_record(state_dir), "w") as handle:
        json.dump({host: had for host, had, _, _ in plan}, handle)
    try:
        for host, had, text, mode in plan:
            if had:
                os.rename(host, os.path.join(os.path.dirname(host), SAVED_PREFIX + os.path.basename(host)))
            replace_text(host, text, mode)
        yield
    finally:
        restore(state_dir)


__all__ = ["POLICY_RC", "SAVED_PREFIX", "overlaid", "restore", "run_overlays"]
