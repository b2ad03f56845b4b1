"""Template builds without network IO (shared by ``Templates`` and ``AsyncTemplates``): the build context packed
from a directory as the server will see it (:func:`pack_context`: a gzip'd tar honouring the directory's
``.dockerignore``, which the server applies again), the requests, and the build log stream decoded.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from .. import models
from ..errors import InvalidArgument, TemplateBuildFailed
from ..image.recipe.dockerignore import IgnoreMatcher
from ._requests import ApiRequest
from ._sse import SSEDecoder, stream_error

BUILD_PATH = "/v1/templates/build"


def _build_path(name: str, build_id: str, suffix: str = "") -> str:
    return f"/v1/templates/{quote(name, safe='')}/builds/{quote(build_id, safe='')}{suffix}"


def dockerfile_text(dockerfile: str | os.PathLike[str]) -> str:
    """A Dockerfile given as a path to one (read), or as its text (a string with a newline, or no such file)."""
    path = Path(dockerfile)
    return path.read_text() if "\n" not in str(dockerfile) and path.is_file() else str(dockerfile)


def pack_context(directory: str | os.PathLike[str]) -> tuple[bytes, int]:
    """The gzip'd tar of ``directory`` (names relative to it, sorted; owner 0:0) without what its
    ``.dockerignore`` leaves out (``.dockerignore`` itself is kept, so the server re-checks it); and the number of
    files in it. Symlinks are kept as links; other special files are skipped."""
    root = Path(directory)
    if not root.is_dir():
        raise InvalidArgument(f"build context {str(root)!r} is not a directory", details={"field": "context"})
    ignore_file = root / ".dockerignore"
    ignore = IgnoreMatcher.from_text(ignore_file.read_text()) if ignore_file.is_file() else IgnoreMatcher([])
    raw = io.BytesIO()
    count = 0
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(root.rglob("*")):
            name = path.relative_to(root).as_posix()
            if name != ".dockerignore" and ignore.ignored(name):
                continue
            if not (path.is_symlink() or path.is_dir() or path.is_file()):
                continue
            info = tar.gettarinfo(str(path), arcname=name)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if info.isreg():
                count += 1
                with path.open("rb") as fh:
                    tar.addfile(info, fh)
            else:
                tar.addfile(info)
    return gzip.compress(raw.getvalue(), mtime=0), count


def _form(body: Mapping[str, object]) -> dict[str, str]:
    return {
        k: json.dumps(v) if isinstance(v, dict) else str(v).lower() if isinstance(v, bool) else str(v)
        for k, v in body.items()
    }


def _sizes(body: dict[str, object], cpu: int | None, memory_mb: int | None) -> dict[str, object]:
    if cpu is not None:
        body["cpu"] = cpu
    if memory_mb is not None:
        body["memory_mb"] = memory_mb
    return body


def dockerfile_request(
    name: str,
    dockerfile: str,
    *,
    context: bytes | None,
    build_args: Mapping[str, str] | None,
    no_cache: bool,
    cpu: int | None,
    memory_mb: int | None,
) -> ApiRequest:
    """``POST /v1/templates/build``: multipart with the Dockerfile's text and the context as one gzip'd tar part;
    JSON when there is no context."""
    body: dict[str, object] = {"name": name, "dockerfile": dockerfile, "no_cache": no_cache}
    if build_args:
        body["build_args"] = dict(build_args)
    _sizes(body, cpu, memory_mb)
    if context is None:
        return ApiRequest("POST", BUILD_PATH, json=body)
    files = [("context", ("context.tar.gz", context, "application/gzip"))]
    return ApiRequest("POST", BUILD_PATH, data=_form(body), files=files)


def archive_request(
    name: str,
    archive: bytes,
    *,
    filename: str,
    image: str | None,
    dockerfile: str | None,
    context: bytes | None,
    build_args: Mapping[str, str] | None,
    no_cache: bool,
    cpu: int | None,
    memory_mb: int | None,
) -> ApiRequest:
    """``POST /v1/templates/build`` with the image archive as the ``image_archive`` part (a Dockerfile, if any,
    starts ``FROM archive``; ``image`` names the image inside)."""
    body: dict[str, object] = {"name": name, "no_cache": no_cache}
    if image is not None:
        body["image"] = image
    if dockerfile is not None:
        body["dockerfile"] = dockerfile
    if build_args:
        body["build_args"] = dict(build_args)
    _sizes(body, cpu, memory_mb)
    files = [("image_archive", (filename, archive, "application/x-tar"))]
    if context is not None:
        files.append(("context", ("context.tar.gz", context, "application/gzip")))
    return ApiRequest("POST", BUILD_PATH, data=_form(body), files=files)


def image_request(name: str, image: str, *, cpu: int | None, memory_mb: int | None) -> ApiRequest:
    return ApiRequest("POST", BUILD_PATH, json=_sizes({"name": name, "image": image}, cpu, memory_mb))


def get_build_request(name: str, build_id: str) -> ApiRequest:
    return ApiRequest("GET", _build_path(name, build_id))


def logs_request(name: str, build_id: str, offset: int) -> ApiRequest:
    return ApiRequest("GET", _build_path(name, build_id, "/logs/stream"), params={"offset": str(offset)})


def parse_build(data: object) -> models.TemplateBuild:
    return models.TemplateBuild.model_validate(data)


def failure(build: models.TemplateBuild, log_tail: tuple[str, ...] = ()) -> TemplateBuildFailed:
    step = build.failed_step
    where = ""
    if step is not None:
        where = f" at step {step.step}" + (f" (line {step.line}: {step.instruction})" if step.line else "")
    return TemplateBuildFailed(
        f"template {build.name!r} build {build.id} failed{where}: {build.error or 'no error reported'}",
        build_id=build.id,
        template=build.name,
        step=step.step if step is not None else None,
        line=step.line if step is not None else None,
        instruction=step.instruction if step is not None else None,
        log_tail=log_tail,
    )


@dataclass(frozen=True)
class BuildEnd:
    """The last event of a build log stream: the build as it ended (``done`` or ``failed``)."""

    build: models.TemplateBuild


class BuildStreamDecoder:
    """Lines of ``…/logs/stream`` in; a :class:`~cryobox.models.BuildLogLine` per ``log`` event, a
    :class:`BuildEnd` for ``done`` or a build's ``error``. Feed ``""`` at end of stream to flush.

    :raises CryoboxError: an ``error`` event that is not a build's failure (the stream itself failed)."""

    def __init__(self) -> None:
        self._sse = SSEDecoder()

    def feed(self, line: str) -> models.BuildLogLine | BuildEnd | None:
        message = self._sse.feed(line)
        if message is None or message.event not in ("log", "done", "error"):
            return None
        data = json.loads(message.data)
        if message.event == "log":
            return models.BuildLogLine.model_validate(data)
        if message.event == "done":
            return BuildEnd(parse_build(data))
        if isinstance(data, dict) and isinstance(data.get("build"), dict):
            return BuildEnd(parse_build(data["build"]))
        raise stream_error(data if isinstance(data, dict) else {})


__all__ = [
    "BuildEnd",
    "BuildStreamDecoder",
    "dockerfile_request",
    "failure",
    "get_build_request",
    "image_request",
    "logs_request",
    "pack_context",
    "parse_build",
]
