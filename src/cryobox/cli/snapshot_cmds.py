"""``cryobox snapshot ...``: the workspace's snapshots from the shell (through ``cryobox.Snapshots``).

Snapshots are taken with ``cryobox sandbox snapshot ID`` and restored with ``cryobox sandbox create
--from-snapshot SNAPSHOT_ID``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from ..errors import CryoboxError
from ..util.progress import open_reporter
from ._common import ApiKey, ApiUrl, Json, err, fail, out, parse_pairs, print_json, snapshot_json, snapshot_table

if TYPE_CHECKING:
    from ..sdk import Snapshots

snapshot_app = typer.Typer(help="Snapshots: list, inspect, label and delete.", no_args_is_help=True)


@contextmanager
def _snapshots(api_url: str | None, api_key: str | None) -> Iterator[Snapshots]:
    """A ``Snapshots`` handle, closed afterwards; an API error on the way exits with its message."""
    from ..sdk import Snapshots

    with Snapshots(api_url=api_url, api_key=api_key) as snapshots:
        try:
            yield snapshots
        except CryoboxError as error:
            fail(error)


def merge_labels(current: dict[str, str], changes: dict[str, str]) -> dict[str, str]:
    """``current`` updated with ``changes``, where an empty value removes the key."""
    merged = dict(current)
    for key, value in changes.items():
        if value:
            merged[key] = value
        else:
            merged.pop(key, None)
    return merged


@snapshot_app.command("list")
def list_(
    sandbox: Annotated[str | None, typer.Option("--sandbox", help="only this sandbox's snapshots")] = None,
    label: Annotated[
        list[str] | None, typer.Option("--label", "-l", help="only snapshots with label KEY=VALUE (repeatable)")
    ] = None,
    as_json: Json = False,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
) -> None:
    """List snapshots, newest first."""
    labels = parse_pairs(label, "label")
    with _snapshots(api_url, api_key) as snapshots:
        items = snapshots.list(sandbox_id=sandbox, labels=labels)
    if as_json:
        print_json([snapshot_json(s) for s in items])
    else:
        out.print(snapshot_table(items))


@snapshot_app.command("get")
def get(snapshot_id: str, as_json: Json = False, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """Show one snapshot."""
    with _snapshots(api_url, api_key) as snapshots:
        snap = snapshots.get(snapshot_id)
    if as_json:
        print_json(snapshot_json(snap))
    else:
        out.print(snapshot_table([snap]))


@snapshot_app.command("publish")
def publish(snapshot_id: str, as_json: Json = False, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """Upload a snapshot to the server's object store, for another host to import."""
    with _snapshots(api_url, api_key) as snapshots, open_reporter(err, as_json=as_json) as reporter:
        with reporter.phase(f"publishing {snapshot_id}"):  # one request: the server says nothing until it is done
            published = snapshots.publish(snapshot_id)
    if as_json:
        print_json(published)
    else:
        out.print(f"published {snapshot_id} to {published['store']} ({published['key']})")


@snapshot_app.command("import")
def import_(
    snapshot_id: str,
    as_json: Json = False,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
) -> None:
    """Register a snapshot another host published (its memory stays in the store, paged in on restore)."""
    with _snapshots(api_url, api_key) as snapshots, open_reporter(err, as_json=as_json) as reporter:
        with reporter.phase(f"importing {snapshot_id}"):
            snap = snapshots.import_published(snapshot_id)
    if as_json:
        print_json(snapshot_json(snap))
    else:
        out.print(snapshot_table([snap]))


@snapshot_app.command("rm")
def rm(snapshot_ids: list[str], as_json: Json = False, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """Delete snapshots: files, registry row and the copy in this server's object store."""
    deleted: list[str] = []
    with _snapshots(api_url, api_key) as snapshots:
        for snapshot_id in snapshot_ids:
            snapshots.delete(snapshot_id)
            deleted.append(snapshot_id)
            if not as_json:
                err.print(f"deleted {snapshot_id}")
    if as_json:
        print_json({"deleted": deleted})


@snapshot_app.command("label")
def label(
    snapshot_id: str,
    pairs: Annotated[
        list[str] | None, typer.Argument(help="KEY=VALUE to set, KEY= to remove (merged with the current labels)")
    ] = None,
    retain: Annotated[
        bool | None, typer.Option("--retain/--no-retain", help="keep the snapshot when its sandbox is deleted")
    ] = None,
    as_json: Json = False,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
) -> None:
    """Set or remove labels of a snapshot, and/or change whether it is retained."""
    changes = parse_pairs(pairs, "label")
    if not changes and retain is None:
        raise typer.BadParameter("nothing to change: give KEY=VALUE labels and/or --retain / --no-retain")
    with _snapshots(api_url, api_key) as snapshots:
        labels = merge_labels(snapshots.get(snapshot_id).labels, changes) if changes else None
        snap = snapshots.update(snapshot_id, labels=labels, retain=retain)
    if as_json:
        print_json(snapshot_json(snap))
    else:
        out.print(snapshot_table([snap]))


@snapshot_app.command("evidence")
def evidence(
    snapshot_id: str,
    out_dir: Annotated[Path | None, typer.Option("--out", help="write every evidence file into this directory")] = None,
    as_json: Json = False,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
) -> None:
    """List the files kept beside a snapshot (console and QEMU logs, a captured test's log); --out fetches them."""
    written: list[str] = []
    with _snapshots(api_url, api_key) as snapshots:
        files = snapshots.evidence(snapshot_id)
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
            for entry in files:
                target = out_dir / Path(entry["name"]).name
                target.write_bytes(snapshots.get_evidence(snapshot_id, entry["name"]))
                written.append(str(target))
    if as_json:
        print_json({"files": files, "written": written} if out_dir is not None else {"files": files})
        return
    table = Table("name", "size")
    for entry in files:
        table.add_row(entry["name"], str(entry["size"]))
    out.print(table)
    for path in written:
        err.print(f"wrote {path}")
