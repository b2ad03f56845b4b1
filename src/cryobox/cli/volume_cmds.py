"""``cryobox volume ...``: the workspace's volumes from the shell (through ``cryobox.sdk.Volumes``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from ..errors import CryoboxError
from ._common import ApiKey, ApiUrl, Json, err, fail, out, print_json

if TYPE_CHECKING:  # the SDK (httpx) and the models (pydantic) load when a command runs
    from .. import models
    from ..sdk import Volumes

volume_app = typer.Typer(help="Volumes: data that outlives sandboxes.", no_args_is_help=True)
SizeMb = Annotated[int, typer.Option("--size-mb", min=16, help="size in MiB")]


@contextmanager
def _volumes(api_url: str | None, api_key: str | None) -> Iterator[Volumes]:
    """A ``Volumes`` handle, closed afterwards; an API error on the way exits with its message."""
    from ..sdk import Volumes

    with Volumes(api_url=api_url, api_key=api_key) as volumes:
        try:
            yield volumes
        except CryoboxError as error:
            fail(error)


def _mib(value: int | None) -> str:
    return "–" if value is None else f"{value / (1 << 20):.1f} MiB"


def volume_table(items: list[models.Volume]) -> Table:
    table = Table("name", "id", "size", "used", "host", "attached to", "created")
    for v in items:
        attached = ", ".join(f"{a.sandbox_id}:{a.path}{' (ro)' if a.read_only else ''}" for a in v.attached_to)
        table.add_row(
            v.name, v.id, f"{v.size_mb} MiB", _mib(v.used_bytes), v.host or "–", attached or "–", v.created_at
        )
    return table


def _show(items: list[models.Volume], as_json: bool) -> None:
    if as_json:
        print_json([v.model_dump() for v in items])
    else:
        out.print(volume_table(items))


@volume_app.command("create")
def create(
    name: str, size_mb: SizeMb = 1024, as_json: Json = False, api_url: ApiUrl = None, api_key: ApiKey = None
) -> None:
    """Make a volume (an ext4 file system of --size-mb MiB)."""
    with _volumes(api_url, api_key) as volumes:
        volume = volumes.create(name, size_mb=size_mb)
    if as_json:
        print_json(volume.model_dump())
    else:
        out.print(volume.id)


@volume_app.command("list")
def list_(as_json: Json = False, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """List the workspace's volumes."""
    with _volumes(api_url, api_key) as volumes:
        _show(volumes.list(), as_json)


@volume_app.command("get")
def get(name: str, as_json: Json = False, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """Show one volume: size, bytes used, where it is attached."""
    with _volumes(api_url, api_key) as volumes:
        volume = volumes.get(name)
    if as_json:
        print_json(volume.model_dump())
    else:
        out.print(volume_table([volume]))


@volume_app.command("resize")
def resize(name: str, size_mb: SizeMb, as_json: Json = False, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """Grow a volume no sandbox has attached (volumes never shrink)."""
    with _volumes(api_url, api_key) as volumes:
        volume = volumes.resize(name, size_mb=size_mb)
    if as_json:
        print_json(volume.model_dump())
    else:
        out.print(f"{volume.name}: {volume.size_mb} MiB")


@volume_app.command("restore")
def restore(name: str, as_json: Json = False, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """Bring a volume whose host is lost back from its last stored copy (writes made after it are lost)."""
    with _volumes(api_url, api_key) as volumes:
        done = volumes.restore(name)
    if as_json:
        print_json(done.model_dump())
    else:
        out.print(done.message)


@volume_app.command("rm")
def rm(names: list[str], as_json: Json = False, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """Delete volumes (refused while a sandbox has one attached)."""
    deleted: list[str] = []
    with _volumes(api_url, api_key) as volumes:
        for name in names:
            volumes.delete(name)
            deleted.append(name)
            if not as_json:
                err.print(f"deleted {name}")
    if as_json:
        print_json({"deleted": deleted})


@volume_app.command("cp")
def cp(src: str, dst: str, as_json: Json = False, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """Copy a file or directory between here and a volume: `cryobox volume cp ./data VOLUME:/data` or
    `cryobox volume cp VOLUME:/out ./out` (no sandbox of yours needed; refused while a sandbox has the volume
    mounted read-write)."""
    from . import volume_cp

    with _volumes(api_url, api_key) as volumes:
        try:
            done = volume_cp.copy(volumes, src, dst)
        except CryoboxError as error:
            fail(error)
    if as_json:
        print_json(done.to_json())
    else:
        skipped = f", {len(done.skipped)} skipped (symlinks)" if done.skipped else ""
        err.print(f"copied {done.files} file(s), {done.bytes} bytes, {done.dirs} dir(s){skipped}")
