"""Settings read from the environment: a number of seconds, checked once at start (a bad value is a 400-style
:class:`~cryobox.errors.InvalidArgument` naming the variable, before anything runs)."""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import InvalidArgument


def positive_seconds(env: Mapping[str, str], name: str, default: float) -> float:
    """``env[name]`` as a positive number of seconds (``default`` when unset or empty)."""
    raw = env.get(name, "").strip()
    try:
        value = float(raw) if raw else default
    except ValueError:
        raise InvalidArgument(f"{name} must be a number of seconds, not {raw!r}") from None
    if not value > 0:  # also NaN
        raise InvalidArgument(f"{name} must be positive, not {raw!r}")
    return value
