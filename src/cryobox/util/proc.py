"""Running host commands through one injectable seam."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from ..errors import ImageBuildError

Progress = Callable[[str], None]


def no_progress(_: str) -> None:
    """A progress sink that drops everything."""


class Runner(Protocol):
    def __call__(self, argv: Sequence[str], *, cwd: Path | None = None, progress: Progress | None = None) -> str: ...


def run(argv: Sequence[str], *, cwd: Path | None = None, progress: Progress | None = None) -> str:
    """Run ``argv``; return stdout. Lines are forwarded to ``progress`` as they arrive.

    :raises ImageBuildError: the command failed (its last output lines are in the message).
    """
    lines: list[str] = []
    with subprocess.Popen(
        list(argv), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if progress is not None:
                progress(line.rstrip())
        code = proc.wait()
    if code != 0:
        tail = "".join(lines[-15:])
        raise ImageBuildError(f"{argv[0]} exited with {code}:\n{tail}", details={"argv": list(argv)})
    return "".join(lines)
