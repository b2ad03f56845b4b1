"""``cryobox template build -f Dockerfile [--name N] DIR`` (or ``--image REF``, or ``--image-archive FILE [--image
REF]``): build a template on the server through the SDK (``Templates``), with its log lines live and a progress bar
over its steps (``base``, each step, ``finalize``). DIR is packed client-side honouring its ``.dockerignore`` (the
server applies it again). An image archive (``docker save``, an OCI layout tar) is the template as it is, or, with
``-f`` (a Dockerfile ``FROM archive``) and DIR, the base of the Dockerfile's steps. Exits 1 when the build fails,
printing the failing step, its Dockerfile line and the log's last lines."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ..errors import CryoboxError, TemplateBuildFailed
from ..util.progress import Phase, Reporter, open_reporter
from ._common import ApiKey, ApiUrl, Json, err, fail, out, parse_pairs, print_json

if TYPE_CHECKING:  # the SDK loads when a build starts
    from .. import models
    from ..sdk import Build

TAIL_SHOWN = 10


def _name_of(name: str | None, directory: Path | None, image: str | None, archive: Path | None = None) -> str:
    if name:
        return name
    if archive is not None and not image:
        base = archive.name.split(".")[0]
    elif image:
        base = image.split("@")[0].rsplit("/", 1)[-1].split(":")[0]
    else:
        base = (directory or Path(".")).resolve().name
    cleaned = "".join(c if c.isalnum() else "-" for c in base.lower()).strip("-")
    if not cleaned:
        raise typer.BadParameter("cannot derive a template name: give --name")
    return cleaned[:63]


def follow(build: Build, reporter: Reporter, *, quiet: bool) -> models.TemplateBuild:
    """Print the build's log lines as they come and advance a bar per step; returns the finished build.
    :raises TemplateBuildFailed: it failed."""
    total = build.info.steps_total or None
    steps_seen: list[str] = []
    phase: Phase
    with reporter.phase(f"template {build.name}", total=total) as phase:

        def on_log(line: models.BuildLogLine) -> None:
            if line.step and line.step not in steps_seen:
                if steps_seen:
                    phase.advance(1)  # the previous step is done
                steps_seen.append(line.step)
            phase.update(f"step {line.step}" if line.step else "")
            if not quiet:
                reporter(f"  [{line.step or '-'}] {line.message}")

        final = build.wait(on_log=on_log)
        if steps_seen:
            phase.advance(1)
    return final


def template_build(
    directory: Annotated[
        Path | None, typer.Argument(help="the build context (a directory); default: the Dockerfile's directory")
    ] = None,
    file: Annotated[Path | None, typer.Option("-f", "--file", help="the Dockerfile (default: DIR/Dockerfile)")] = None,
    image: Annotated[
        str | None,
        typer.Option("--image", help="build from this image reference instead (with --image-archive: the image in it)"),
    ] = None,
    image_archive: Annotated[
        Path | None,
        typer.Option("--image-archive", help="build from this docker save tar or OCI layout tar (-f: FROM archive)"),
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="the template's name (default: DIR's name)")] = None,
    build_arg: Annotated[
        list[str] | None, typer.Option("--build-arg", help="KEY=VALUE for an ARG (repeatable)")
    ] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="rebuild every step")] = False,
    cpu: Annotated[int | None, typer.Option(help="vCPUs of the template")] = None,
    memory_mb: Annotated[int | None, typer.Option("--memory-mb", help="memory of the template, MB")] = None,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="follow the build until it ends")] = True,
    as_json: Json = False,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
) -> None:
    """Build a template from a Dockerfile and its context directory (or from an image with --image, or from an
    image archive with --image-archive), on the server. Shows the build's log live; exits 1 when the build fails."""
    by_ref = image is not None and image_archive is None
    dockerfile: Path | None = None
    context: Path | None = None
    if by_ref and (file is not None or directory is not None or build_arg or no_cache):
        raise typer.BadParameter("--image takes no Dockerfile, DIR, --build-arg or --no-cache")
    if image_archive is not None:
        if not image_archive.is_file():
            raise typer.BadParameter(f"no image archive at {image_archive}")
        if file is None and (directory is not None or build_arg):
            raise typer.BadParameter("--image-archive takes DIR and --build-arg only with -f (FROM archive)")
        dockerfile, context = file, directory
    elif image is None:
        dockerfile = file if file is not None else (directory or Path(".")) / "Dockerfile"
        context = directory if directory is not None else dockerfile.parent
    if dockerfile is not None and not dockerfile.is_file():
        raise typer.BadParameter(f"no Dockerfile at {dockerfile} (give -f)")
    template = _name_of(name, directory if image is None else None, image, image_archive)
    args = parse_pairs(build_arg, "--build-arg")
    from ..sdk import Templates

    try:
        with Templates(api_url=api_url, api_key=api_key) as templates:
            if image_archive is not None:
                build = templates.build_from_image_archive(
                    template,
                    image_archive,
                    image=image,
                    dockerfile=dockerfile,
                    context=context,
                    build_args=args,
                    no_cache=no_cache,
                    cpu=cpu,
                    memory_mb=memory_mb,
                )
            elif image is not None:
                build = templates.build_from_image(template, image, cpu=cpu, memory_mb=memory_mb)
            else:
                assert dockerfile is not None
                build = templates.build_from_dockerfile(
                    template,
                    dockerfile=dockerfile,
                    context=context,
                    build_args=args,
                    no_cache=no_cache,
                    cpu=cpu,
                    memory_mb=memory_mb,
                )
            if not as_json:
                err.print(f"build {build.id} of template {template} started")
            final = build.info
            if wait:
                with open_reporter(err, as_json=as_json) as reporter:
                    final = follow(build, reporter, quiet=as_json)
    except TemplateBuildFailed as failure:
        if as_json:
            print_json({"error": failure.message, "code": failure.code, "details": failure.details})
        else:
            where = f"step {failure.step}" + (f", line {failure.line}" if failure.line else "")
            err.print(f"[red]template {template} failed[/red] at {where}: {failure.instruction or ''}")
            for line in failure.log_tail[-TAIL_SHOWN:]:
                err.print(f"  {line}", markup=False, highlight=False)
        raise typer.Exit(1) from None
    except CryoboxError as error:
        fail(error)
    if as_json:
        print_json(final.model_dump())
    else:
        out.print(f"template {final.name}: {final.status} (build {final.id})")
