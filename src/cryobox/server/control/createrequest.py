"""What a create asks the control plane for (:class:`CreateRequest`), shared by every path that makes a sandbox."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Literal

from ...netpolicy import EgressPolicy
from .timeouts import OnTimeout
from .volumes import MountRequest


class Inherit(enum.Enum):
    """A create that names no network: from a snapshot it gets the snapshot's recorded policy, else none."""

    INHERIT = "inherit"


INHERIT = Inherit.INHERIT


@dataclass(frozen=True)
class CreateRequest:
    template: str
    workspace_id: str
    metadata: dict[str, str]
    env: dict[str, str]
    ttl_s: int | None
    persistent: bool
    from_snapshot: str | None = None
    egress: EgressPolicy | None | Literal[Inherit.INHERIT] = INHERIT
    """The network policy (``None``: nothing allowed); :data:`INHERIT`: the snapshot's, if any."""
    on_timeout: OnTimeout = OnTimeout()
    volumes: tuple[MountRequest, ...] | None = None
    """Volumes to mount; ``None``: the snapshot's mounts (from a snapshot), else none."""


__all__ = ["INHERIT", "CreateRequest", "Inherit"]
