"""The guest's own answers that an agent relays: file-system calls (:class:`FsReply`, its entries :class:`FsEntry`)
and network inspection (:class:`NetInspection`).

Re-exported by :mod:`.models`. These are open models: the guest agent (``guest/ops_files.py``,
``guest/ops_entries.py``, ``guest/ops_watch.py``, ``guest/ops_inspect.py``) may answer with keys they do not
declare (an older or a newer guest), and those cross as sent (``model_extra``). Serialized, an answer has exactly
the keys the guest sent, never a declared field's default: the JSON on the agent's wire and in the public API is
the guest's own, as it was when these answers were plain dicts. ``model_fields_set`` tells which declared fields
the guest sent (an older guest's entry has ``is_dir`` but no ``type``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, ValidationError, model_serializer

from ..errors import GuestError


class GuestAnswer(BaseModel):
    """An answer of the guest's, typed where its keys are known and open beyond them."""

    model_config = ConfigDict(extra="allow", frozen=True)

    @model_serializer(mode="wrap")
    def _as_sent(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        sent = self.model_fields_set
        data: dict[str, Any] = handler(self)
        return {key: value for key, value in data.items() if key in sent}

    @classmethod
    def from_guest(cls, raw: Mapping[str, Any]) -> Self:
        """``raw`` (a guest agent's reply) as this answer; ``GuestError`` when a known key has the wrong type."""
        try:
            return cls.model_validate(raw)
        except ValidationError as err:
            raise GuestError(f"the guest's answer is not a valid {cls.__name__}: {err}") from err


class FsEntry(GuestAnswer):
    """A file, directory or symlink as the guest describes it (``stat``; each item of a listing). Declared in the
    guest's own key order, so a serialized entry lists its keys as the guest did."""

    name: str = ""
    path: str = ""
    type: str = ""
    """``file``, ``dir`` or ``symlink`` (not sent by older guests: ``is_dir`` then stands in)."""
    is_dir: bool = False
    size: int = 0
    mode: int = 0
    """The permission bits (``stat.S_IMODE``)."""
    mtime: float | None = None
    """Epoch seconds."""
    permissions: str = ""
    """Go's ``FileMode.String()`` (``drwxr-xr-x``)."""
    owner: str = ""
    group: str = ""
    symlink_target: str | None = None


class FsChange(GuestAnswer):
    """One change a polled watcher kept (``watch_events``): its ``kind`` as the guest names it, and ``name``
    relative to the watched directory."""

    kind: str
    name: str = ""


class FsReply(FsEntry):
    """The guest's answer to a file-system call (``file_op``, ``fs``), by op:

    - ``stat``, ``move``: the entry itself (the fields of :class:`FsEntry`);
    - ``list_dir``: ``path`` and ``entries``;
    - ``mkdir``: ``path``, ``created`` (false when the directory was there already) and its ``entry``;
    - ``delete``, ``watch_remove``: nothing;
    - ``watch_create``: ``watcher``; ``watch_events``: ``events``, ``dropped`` and ``ended``.
    """

    entries: list[FsEntry] | None = None
    created: bool | None = None
    entry: FsEntry | None = None
    watcher: str | None = None
    events: list[FsChange] | None = None
    dropped: int = 0
    """Changes the watcher's bounded buffer discarded since the last ``watch_events``."""
    ended: str | None = None
    """Why the watcher stopped (``removed``: its directory went away), ``None`` while it runs: after an ``ended``
    answer no more events come."""


class NetInspection(GuestAnswer):
    """What the guest believes about the network, its clock and its identity (``inspect_net``): compare one taken
    before a snapshot with one after a restore. The items are as ``guest/ops_inspect.py`` documents them."""

    sockets: list[dict[str, Any]] = Field(default_factory=list)
    """``{"proto", "local", "remote", "state"}`` per socket (``/proc/net/{tcp,tcp6,udp,udp6}``)."""
    neighbours: list[dict[str, Any]] = Field(default_factory=list)
    """``{"ip", "mac", "device", "flags"}`` per ARP entry."""
    resolv_conf: str | None = None
    interfaces: list[dict[str, Any]] = Field(default_factory=list)
    """``{"name", "mac", "addresses"}`` per interface."""
    clock: dict[str, int] = Field(default_factory=dict)
    """``realtime_ns``, ``monotonic_ns`` and ``boottime_ns``."""
    instance_id: str | None = None


__all__ = ["FsChange", "FsEntry", "FsReply", "GuestAnswer", "NetInspection"]
