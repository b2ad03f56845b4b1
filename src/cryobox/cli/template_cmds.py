"""``cryobox template create``: start a custom template's build (``POST /v1/templates``) and follow it by polling
``GET /v1/templates/{name}`` (its ``status`` and ``progress``) until it is ready or failed."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..errors import CryoboxError
from ..util.progress import Reporter, open_reporter
from ._common import ApiKey, ApiUrl, Json, err, fail, out, print_json

if TYPE_CHECKING:  # httpx, pydantic and the models load when a command runs
    import httpx

    from .. import models

POLL_S = 1.0


def read_files(pairs: list[str] | None) -> dict[str, str]:
    """``["/guest/path=LOCAL_FILE", ...]`` as the request's ``files`` (each local file's text)."""
    files: dict[str, str] = {}
    for pair in pairs or []:
        guest, sep, local = pair.partition("=")
        if not sep or not guest or not local:
            raise typer.BadParameter(f"--file must be GUEST_PATH=LOCAL_FILE, not {pair!r}")
        try:
            files[guest] = Path(local).read_text()
        except (OSError, UnicodeDecodeError) as error:
            raise typer.BadParameter(f"--file {pair!r}: {error}") from None
    return files


def follow_build(
    http: httpx.Client,
    name: str,
    reporter: Reporter,
    *,
    timeout_s: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> models.Template:
    """Poll the template until it is no longer ``building``; each new ``progress`` line is printed, the phase's note
    shows the latest. :raises CryoboxError: the API refused a poll; ``TimeoutError``: still building."""
    from .. import models
    from ..sdk._transport import raise_for_error

    deadline = clock() + timeout_s
    last: str | None = None
    with reporter.phase(f"template {name}") as phase:
        while True:
            response = http.get(f"/v1/templates/{name}")
            raise_for_error(response)
            template = models.Template.model_validate(response.json())
            if template.progress and template.progress != last:
                last = template.progress
                reporter(f"  {last}")
                phase.update(last)
            if template.status != "building":
                return template
            if clock() >= deadline:
                raise TimeoutError(f"template {name} still building after {timeout_s:.0f}s")
            sleep(POLL_S)


def template_create(
    name: Annotated[str, typer.Argument(help="the template's name (lowercase letters, digits, '-')")],
    base: Annotated[str, typer.Option(help="the built-in it starts from: 'base' or 'code-interpreter'")] = "base",
    package: Annotated[list[str] | None, typer.Option("--package", help="a Debian package (repeatable)")] = None,
    pip: Annotated[list[str] | None, typer.Option("--pip", help="a pip requirement (repeatable)")] = None,
    file: Annotated[
        list[str] | None, typer.Option("--file", help="GUEST_PATH=LOCAL_FILE written into the guest (repeatable)")
    ] = None,
    warmup: Annotated[list[str] | None, typer.Option("--warmup", help="a command run before the snapshot")] = None,
    cpu: Annotated[int | None, typer.Option(help="vCPUs (default: the base's)")] = None,
    memory_mb: Annotated[int | None, typer.Option("--memory-mb", help="memory, MB (default: the base's)")] = None,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="follow the build until it ends")] = True,
    timeout: Annotated[float, typer.Option(help="seconds to wait for the build")] = 3600.0,
    as_json: Json = False,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
) -> None:
    """Create a custom template: a built-in's image plus packages, files and warm-up commands, baked by the
    server. Shows the build's progress; exits 1 when the build fails."""
    import httpx
    from pydantic import ValidationError

    from .. import models
    from ..sdk._transport import ClientConfig, raise_for_error

    body: dict[str, Any] = {
        "name": name,
        "base": base,
        "packages": package or [],
        "pip": pip or [],
        "files": read_files(file),
        "warmup": warmup or [],
    }
    if cpu is not None:
        body["cpu"] = cpu
    if memory_mb is not None:
        body["memory_mb"] = memory_mb
    try:
        request = models.TemplateCreateRequest.model_validate(body)
    except ValidationError as error:
        raise typer.BadParameter(str(error)) from None
    config = ClientConfig.resolve(api_url, api_key)
    try:
        with config.client() as http:
            response = http.post("/v1/templates", json=request.model_dump(exclude_none=True))
            raise_for_error(response)
            template = models.Template.model_validate(response.json())
            if wait and template.status == "building":
                with open_reporter(err, as_json=as_json) as reporter:
                    template = follow_build(http, name, reporter, timeout_s=timeout)
    except CryoboxError as error:
        fail(error)
    except (httpx.HTTPError, TimeoutError) as error:
        err.print(f"[red]error[/red]: {error}")
        raise typer.Exit(2) from error
    if as_json:
        print_json(template.model_dump())
    elif template.status == "error":
        err.print(f"[red]template {name} failed[/red]: {template.error}")
    else:
        out.print(f"template {template.name}: {template.status} ({template.generation})")
    if template.status == "error":
        raise typer.Exit(1)
