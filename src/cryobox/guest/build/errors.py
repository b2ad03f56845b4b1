"""The one error the build driver reports: a build input or step it refuses or cannot carry out."""

from __future__ import annotations


class BuildError(Exception):
    """The build fails with this message (the driver prints it as its last line on stderr)."""


__all__ = ["BuildError"]
