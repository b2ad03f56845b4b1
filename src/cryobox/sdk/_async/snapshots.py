"""``AsyncSnapshots`` (the workspace's snapshots) and ``AsyncForkTree`` (the result of ``AsyncSandbox.fork_tree``).

Snapshots are taken from a sandbox (``await sbx.snapshot(labels={"step": "3"})``) and restored by creating a
sandbox from them (``await AsyncSandbox.create(from_snapshot=snap.id)``). ``AsyncSnapshots`` manages them
across sandboxes; it resolves ``api_url`` / ``api_key`` like ``AsyncSandbox.create`` (argument, else
``$CRYOBOX_API_URL`` / ``$CRYOBOX_API_KEY``) and owns one HTTP client, released by ``aclose()`` or ``async with``::

    from cryobox import AsyncSandbox, AsyncSnapshots

    async with AsyncSnapshots() as snapshots:
        for snap in await snapshots.list(labels={"stage": "baseline"}):
            print(snap.id, snap.sandbox_id, snap.size_bytes, snap.created_at)
        snap = await snapshots.get("snp_0123")
        await snapshots.update(snap.id, labels={**snap.labels, "keep": "yes"}, retain=True)

A fork tree restores several children from one snapshot of a parent, to try alternatives side by side::

    tree = await parent.fork_tree(3)
    results = [await child.exec("python3 attempt.py") for child in tree.children]
    winner = tree.children[best_of(results)]
    await tree.promote(winner)   # deletes the other children and releases their handles
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ... import models
from ...errors import SandboxTimeout
from .. import _requests, _snapshots
from .._base import DEFAULT_RETRY
from ._resource import AsyncApiClient

if TYPE_CHECKING:
    from .sandbox import AsyncSandbox


class AsyncSnapshots(AsyncApiClient):
    """The workspace's snapshots. Build one per API endpoint; ``aclose()`` (or ``async with``) releases it.

    ``http`` is an optional client to use (custom transport, tests); this object takes ownership of it.
    """

    async def list(
        self, *, sandbox_id: str | None = None, labels: Mapping[str, str] | None = None
    ) -> list[models.Snapshot]:
        """Snapshots, newest first: only ``sandbox_id``'s when given, only those whose labels contain ``labels``."""
        request = _requests.list_snapshots_request(sandbox_id=sandbox_id, labels=labels)
        return _snapshots.parse_snapshot_list(await self._send(request))

    async def get(self, snapshot_id: str) -> models.Snapshot:
        """:raises NotFound: no such snapshot (or it belongs to another workspace)."""
        return _snapshots.parse_snapshot(await self._send(_requests.get_snapshot_request(snapshot_id)))

    async def wait_stored(self, snapshot_id: str, *, timeout_s: float = 300.0, poll_s: float = 0.5) -> models.Snapshot:
        """Wait until the snapshot is in the object store (``location == "stored"``): from then on any host of
        the fleet can restore it, also when the host that took it is gone.

        :raises SandboxTimeout: not stored within ``timeout_s``.
        :raises NotFound: no such snapshot.
        """
        deadline = DEFAULT_RETRY.clock() + timeout_s
        while True:
            snap = await self.get(snapshot_id)
            if snap.location == "stored":
                return snap
            if DEFAULT_RETRY.clock() >= deadline:
                raise SandboxTimeout(
                    f"snapshot {snapshot_id} was not stored within {timeout_s}s", details={"id": snapshot_id}
                )
            await DEFAULT_RETRY.async_sleep(poll_s)

    async def delete(self, snapshot_id: str) -> None:
        """Delete the snapshot: its registry row, its objects in the store and every host's copy of its files.

        :raises NotFound: no such snapshot.
        """
        await self._send(_requests.delete_snapshot_request(snapshot_id))

    async def update(
        self, snapshot_id: str, *, labels: Mapping[str, str] | None = None, retain: bool | None = None
    ) -> models.Snapshot:
        """Replace the snapshot's labels (the whole map) and/or set ``retain``; ``None`` leaves a field unchanged.

        :raises NotFound: no such snapshot.
        """
        request = _requests.update_snapshot_request(snapshot_id, labels=labels, retain=retain)
        return _snapshots.parse_snapshot(await self._send(request))

    async def publish(self, snapshot_id: str) -> dict[str, str]:
        """Upload the snapshot to the server's object store (``{"id", "store", "key"}``) so that another host
        sharing that store can :meth:`import_published` it.

        :raises NotFound: no such snapshot.
        :raises StateError: the snapshot is not over the template generation this server serves.
        """
        response = await self._send(_requests.publish_snapshot_request(snapshot_id))
        body = response.json()
        return {"id": str(body["id"]), "store": str(body["store"]), "key": str(body["key"])}

    async def import_published(
        self, snapshot_id: str, *, labels: Mapping[str, str] | None = None, retain: bool = True
    ) -> models.Snapshot:
        """Register a snapshot another host published to this server's object store; restore it with
        ``Sandbox.create(from_snapshot=...)`` (its memory is paged in from the store on demand).

        :raises NotFound: the store has no such published snapshot.
        :raises StateError: it is of a template generation this server does not serve, or is already here.
        """
        request = _requests.import_snapshot_request(snapshot_id, labels=labels, retain=retain)
        return _snapshots.parse_snapshot(await self._send(request))

    async def evidence(self, snapshot_id: str) -> builtins.list[dict[str, Any]]:
        """The files kept beside the snapshot (``[{"name", "size"}]``): the VM's ``console.log`` and ``qemu.log``,
        plus what clients added (``cryobox capture`` adds ``test.log``).

        :raises NotFound: no such snapshot.
        """
        response = await self._send(_requests.evidence_list_request(snapshot_id))
        body = response.json()
        files: builtins.list[dict[str, Any]] = [{"name": str(f["name"]), "size": int(f["size"])} for f in body["files"]]
        return files

    async def get_evidence(self, snapshot_id: str, name: str) -> bytes:
        """:raises NotFound: no such snapshot or evidence file."""
        response = await self._send(_requests.evidence_request(snapshot_id, name))
        return response.content

    async def put_evidence(self, snapshot_id: str, name: str, data: bytes | str) -> int:
        """Store ``data`` (``str`` is UTF-8 encoded) as evidence file ``name``; returns its size.

        :raises InvalidArgument: a bad name (letters, digits, ``.``, ``_``, ``-``; no leading dot; at most 128).
        :raises PayloadTooLarge: more than the server accepts.
        """
        payload = data.encode() if isinstance(data, str) else data
        response = await self._send(_requests.evidence_request(snapshot_id, name, content=payload))
        return int(response.json()["size"])


@dataclass(frozen=True)
class AsyncForkTree:
    """Children restored from one snapshot (``snapshot_id``) of ``parent_id``, memory and disk.

    ``children`` share the parent's HTTP client; ``errors`` lists the children that could not be created.
    """

    tree_id: str
    parent_id: str
    snapshot_id: str
    children: list[AsyncSandbox]
    errors: list[models.ForkTreeError]

    async def promote(self, winner: AsyncSandbox, *, cleanup_siblings: bool = True) -> models.PromoteResult:
        """``winner.promote(tree_id)``, then release the handles of the children the server deleted."""
        result = await winner.promote(self.tree_id, cleanup_siblings=cleanup_siblings)
        deleted = set(result.deleted)
        for child in self.children:
            if child.id in deleted and child is not winner:
                child.info = child.info.model_copy(update={"status": "stopped"})
                await child.aclose()
        return result

    async def aclose(self) -> None:
        """Release every child's handle; the sandboxes keep running."""
        for child in self.children:
            await child.aclose()
