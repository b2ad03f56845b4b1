"""Named crash points for the chaos suite: ``CRYOBOX_CRASH_AT=<step>[:<nth>]`` SIGKILLs the agent process the
``nth`` (default 1st) time it reaches ``step``; ``CRYOBOX_CRASH_FILE=<path>`` SIGKILLs it at the step named in
that file whenever the file exists (a test arms it at run time, so one process serves many rounds).

Steps are named ``<operation>.<moment>`` (``create.restored``, ``snapshot.captured``, ``hibernate.recorded`` …;
:data:`STEPS` lists every one). The hook is read once per process (:class:`CrashPoints.from_env`), costs a dict
lookup when unset, and kills with SIGKILL — no ``finally`` block, no atexit handler runs, exactly like the OOM
killer.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InvalidArgument

ENV = "CRYOBOX_CRASH_AT"
FILE_ENV = "CRYOBOX_CRASH_FILE"
STEPS = (
    "create.spawned",  # a QEMU holds the sandbox's slot, its state is not loaded yet
    "create.restored",  # the guest runs, the sandbox is not recorded yet
    "create.recorded",  # the record is durable, the answer has not been sent
    "snapshot.captured",  # the capture is restorable on this host, not durable yet
    "snapshot.finished",  # the snapshot is durable, the answer has not been sent
    "fork_tree.captured",  # the tree's snapshot exists, no child restored yet
    "fork_tree.children",  # some children are restored
    "hibernate.captured",  # the hibernation image is written, QEMU still alive
    "hibernate.recorded",  # the record says hibernated, QEMU still alive
    "wake.spawned",  # a new QEMU waits for the hibernation image
    "wake.restored",  # the woken guest runs, its record still says hibernated
    "delete.killed",  # QEMU is gone, the record still exists
)


@dataclass
class CrashPoints:
    step: str = ""
    nth: int = 1
    arm_file: Path | None = None
    kill: Callable[[], None] = field(default=lambda: os.kill(os.getpid(), signal.SIGKILL))
    _seen: int = 0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> CrashPoints:
        source = os.environ if env is None else env
        raw = source.get(ENV, "")
        if source.get(FILE_ENV):
            return cls(arm_file=Path(source[FILE_ENV]))
        if not raw:
            return cls()
        step, _, nth = raw.partition(":")
        if step not in STEPS:
            raise InvalidArgument(f"{ENV}={raw!r}: unknown step (known: {', '.join(STEPS)})")
        if nth and (not nth.isdigit() or int(nth) < 1):
            raise InvalidArgument(f"{ENV}={raw!r}: the count after ':' must be a positive integer")
        return cls(step=step, nth=int(nth) if nth else 1)

    def __call__(self, step: str) -> None:
        if self.arm_file is not None:
            try:
                armed = self.arm_file.read_text().strip()
            except OSError:
                return
            if armed == step:
                self.kill()
            return
        if step != self.step:
            return
        self._seen += 1
        if self._seen == self.nth:
            self.kill()
