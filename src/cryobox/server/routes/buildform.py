"""``POST /v1/templates/build`` read into a build order (:func:`read_build`): a Dockerfile (+ its context) or an
image reference, as a :class:`~cryobox.image.recipe.model.Recipe` and the context blobs it names.

One set of fields in three encodings (the first is the primary one, which both cryobox's and PandaStack's SDKs send
when there is a context):

* ``multipart/form-data``: text fields, plus the context either as ONE tar part (plain or gzip) named ``context``
  with a tar or gzip ``Content-Type`` (cryobox's SDK and CLI), or as one file part per context file, named by its
  path relative to the context root with ``/`` separators (PandaStack's SDK); a ``dockerfile`` part may be a file;
* ``application/x-www-form-urlencoded``: the same text fields, no context (PandaStack's ``register`` and a
  Dockerfile build without a context);
* ``application/json``: ``{"name", "dockerfile" | "image", "build_args": {…}, "no_cache", "cpu", "memory_mb"}``.

Fields: ``name`` (required); exactly one of ``dockerfile`` (its text) and ``image`` (alias ``image_ref``, an OCI
reference ``[registry/]name[:tag][@sha256:…]``); ``build_args`` (a JSON object of strings; in a form, its JSON
text); ``no_cache`` (bool); ``cpu``; ``memory_mb``; ``size_mb`` (PandaStack: the root disk's size, at most
:data:`DISK_MIB`, which every recipe-built template's disk is). Anything else, ``kernel`` included, is a 400 naming
it.

An image *archive* as the base (multipart only): an ``image_archive`` file part, a ``docker save`` tar or a tar of
an OCI image layout (:mod:`.buildarchive`), with ``image`` then naming the image inside when it holds several (one
of its ``RepoTags``, or a layout's ``ref.name``). Alone it is the template as the image is; with a ``dockerfile``
whose ``FROM`` is the literal ``archive`` (``FROM archive``), the Dockerfile's steps run on it (a ``FROM archive``
without the part is a 400).

Sizes: JSON and form bodies are capped (the context limit plus the Dockerfile's); a multipart body is read as it
streams, capped at the context and archive limits together, and each part is checked against its own (the
``context`` part and the context's files against the context limit, ``image_archive`` against the archive limit).
Past a limit: a 413, and nothing is stored.
"""

from __future__ import annotations

import io
import json
import re
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from starlette.datastructures import FormData, UploadFile
from starlette.requests import Request

from ...errors import CryoboxError, InvalidArgument, PayloadTooLarge
from ...image.recipe.contexts import ContextLimits, split_context
from ...image.recipe.dockerfile import MAX_DOCKERFILE_BYTES, parse_dockerfile
from ...image.recipe.model import Base, Recipe
from ...image.recipe.tarblob import member_name
from ...util.httpbody import read_body
from .buildarchive import FIELD as ARCHIVE
from .buildarchive import StagedArchive, stage_archive

FIELDS = frozenset(
    {"name", "dockerfile", "image", "image_ref", "build_args", "no_cache", "cpu", "memory_mb", "size_mb"}
)
DISK_MIB = 8192
"""The virtual size of a recipe-built template's disk (the agent's ``recipebuild.TARGET_BYTES``)."""
FORM_SLACK = 1 << 20
"""Room in the body cap for the fields and the multipart framing."""
MAX_PARTS = 10_000
IMAGE_REF = re.compile(
    r"^(?:[A-Za-z0-9][A-Za-z0-9.-]*(?::[0-9]{1,5})?/)?"
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$"
)
TAR_TYPES = frozenset({"application/x-tar", "application/tar", "application/gzip", "application/x-gzip"})
FROM_ARCHIVE = Base("image", "archive")
"""What ``FROM archive`` parses to: the uploaded ``image_archive``."""
MAX_IMAGE_NAME = 512


@dataclass(frozen=True)
class BuildOrder:
    name: str
    recipe: Recipe
    blobs: dict[str, bytes]
    cpu: int | None
    memory_mb: int | None
    archive: StagedArchive | None = None
    """The uploaded image archive (a temporary file: the caller stores it, then discards it)."""

    def discard(self) -> None:
        if self.archive is not None:
            self.archive.discard()


def _bad(field: str, problem: str) -> InvalidArgument:
    return InvalidArgument(f"{field}: {problem}", details={"field": field})


def _int(fields: Mapping[str, Any], field: str) -> int | None:
    value = fields.get(field)
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise _bad(field, "must be an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"-?[0-9]{1,9}", value.strip()):
        return int(value)
    raise _bad(field, "must be an integer")


def _bool(fields: Mapping[str, Any], field: str) -> bool:
    value = fields.get(field)
    if value is None or isinstance(value, bool):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("1", "true", "yes", "on", "0", "false", "no", "off", ""):
        return value.strip().lower() in ("1", "true", "yes", "on")
    raise _bad(field, "must be a boolean")


def _build_args(value: Any) -> dict[str, str]:
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise _bad("build_args", "must be a JSON object of strings") from None
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise _bad("build_args", "must be an object of strings")
    if len(value) > 256 or any(not k or "=" in k for k in value):
        raise _bad("build_args", "at most 256 names, each non-empty and without '='")
    return dict(value)


def _text(fields: Mapping[str, Any], field: str) -> str | None:
    value = fields.get(field)
    if value is None:
        return None
    if not isinstance(value, str):
        raise _bad(field, "must be a string")
    return value


def _over(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"request body exceeds {limit} bytes", details={"limit": limit})


async def _streamed_form(request: Request, limit: int) -> FormData:
    """A multipart body parsed as it arrives (file parts spool to disk), refused (413) past ``limit`` bytes."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _over(limit)
    seen = 0
    upstream = request.receive

    async def receive() -> dict[str, Any]:
        nonlocal seen
        message = dict(await upstream())
        seen += len(message.get("body", b""))
        if seen > limit:
            raise _over(limit)
        return message

    return await _parse(Request(request.scope, receive))


async def _parse(replay: Request) -> FormData:
    try:
        return await replay.form(max_files=MAX_PARTS, max_fields=64, max_part_size=MAX_DOCKERFILE_BYTES)
    except CryoboxError:
        raise
    except Exception as exc:  # starlette's parser raises its own (HTTP/multipart) errors: a malformed body
        raise InvalidArgument(f"the form could not be read: {exc}", details={"field": "body"}) from exc


async def _form(request: Request, body: bytes) -> FormData:
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.request", "body": b"", "more_body": False}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return await _parse(Request(request.scope, receive))


def _files_tar(files: list[tuple[str, bytes]]) -> bytes:
    """PandaStack's context (a part per file, named by its relative path) as one tar archive."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for raw, data in files:
            name = member_name(raw)
            if not name:
                raise _bad(raw or "context", "a context file needs a relative path as its part name")
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@dataclass
class _Parts:
    fields: dict[str, Any]
    context: bytes | None
    archive: UploadFile | None


def _context_too_large(size: int, limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"context: {size} bytes exceed the build context limit of {limit}", details={"field": "context", "limit": limit}
    )


async def _multipart(form: FormData, max_context_bytes: int) -> _Parts:
    fields: dict[str, Any] = {}
    tar: bytes | None = None
    archive: UploadFile | None = None
    files: list[tuple[str, bytes]] = []
    context_bytes = 0
    for key, value in form.multi_items():
        if isinstance(value, UploadFile):
            if key == ARCHIVE:
                if archive is not None:
                    raise _bad(ARCHIVE, "given more than once")
                archive = value
                continue
            size = value.size or 0
            if key == "dockerfile" and size > MAX_DOCKERFILE_BYTES:
                raise _bad("dockerfile", f"larger than {MAX_DOCKERFILE_BYTES} bytes")
            context_bytes += size if key != "dockerfile" else 0
            if context_bytes > max_context_bytes:
                raise _context_too_large(context_bytes, max_context_bytes)
            data = await value.read()
            kind = (value.content_type or "").split(";")[0].strip().lower()
            if key == "dockerfile":
                try:
                    fields["dockerfile"] = data.decode("utf-8")
                except UnicodeDecodeError:
                    raise _bad("dockerfile", "must be UTF-8 text") from None
            elif key == "context" and kind in TAR_TYPES:
                tar = data
            else:
                files.append((key, data))
            continue
        if key in fields:
            raise _bad(key, "given more than once")
        fields[key] = value
    if tar is not None and files:
        raise _bad("context", "send the context as one tar part or as one part per file, not both")
    return _Parts(fields, tar if tar is not None else _files_tar(files) if files else None, archive)


def _archive_recipe(dockerfile: str | None, image: str | None, build_args: dict[str, str]) -> Recipe:
    """The recipe of an ``image_archive`` build, its base's ``ref`` left for the archive's hash."""
    name = ""
    if image is not None:
        name = image.strip()
        if not name or len(name) > MAX_IMAGE_NAME or not name.isprintable():
            raise _bad("image", f"with an {ARCHIVE}, names the image inside it (a tag), at most {MAX_IMAGE_NAME}")
    base = Base("archive", "", name)
    if dockerfile is None:
        if build_args:
            raise _bad("build_args", "only a Dockerfile build takes build arguments")
        return Recipe(base=base)
    recipe = parse_dockerfile(dockerfile, build_args=build_args)
    if recipe.base != FROM_ARCHIVE:
        raise _bad("dockerfile", f"with an {ARCHIVE}, the Dockerfile starts FROM archive")
    return replace(recipe, base=base)


def _recipe(fields: Mapping[str, Any], *, archive: bool) -> Recipe:
    dockerfile = _text(fields, "dockerfile")
    image = _text(fields, "image")
    alias = _text(fields, "image_ref")
    if image is not None and alias is not None:
        raise _bad("image_ref", "give image or image_ref, not both")
    image = image if image is not None else alias
    build_args = _build_args(fields.get("build_args"))
    if archive:
        return _archive_recipe(dockerfile, image, build_args)
    if (dockerfile is None) == (image is None):
        raise _bad("dockerfile", "give exactly one of dockerfile and image")
    if image is not None:
        if build_args:
            raise _bad("build_args", "only a Dockerfile build takes build arguments")
        ref = image.strip()
        if len(ref) > 512 or not IMAGE_REF.fullmatch(ref):
            raise _bad("image", f"{image[:512]!r} is not an image reference ([registry/]name[:tag][@sha256:digest])")
        return Recipe(base=Base("image", ref))
    recipe = parse_dockerfile(dockerfile or "", build_args=build_args)
    if recipe.base == FROM_ARCHIVE:
        raise _bad(ARCHIVE, "the Dockerfile is FROM archive: send the image archive as an image_archive file part")
    return recipe


def _checked_fields(fields: Mapping[str, Any]) -> None:
    if ARCHIVE in fields:
        raise _bad(ARCHIVE, "the image archive travels as a multipart file part")
    unknown = sorted(set(fields) - FIELDS)
    if unknown:
        raise InvalidArgument(
            f"cryobox does not support {', '.join(unknown)} in a template build",
            details={"field": unknown[0], "fields": unknown},
        )
    size = _int(fields, "size_mb")
    if size is not None and not 1 <= size <= DISK_MIB:
        raise _bad("size_mb", f"must be 1..{DISK_MIB} (every template built so has a {DISK_MIB} MiB disk)")


async def read_build(request: Request, *, max_context_bytes: int, max_archive_bytes: int) -> BuildOrder:
    """The build ``request`` orders; 400 naming the field or Dockerfile line, 413 past a limit; nothing stored.
    An uploaded archive is in a temporary file the caller must :meth:`BuildOrder.discard`."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind not in ("application/json", "multipart/form-data", "application/x-www-form-urlencoded"):
        raise _bad("content-type", "send multipart/form-data, application/x-www-form-urlencoded or JSON")
    if kind != "multipart/form-data":
        body = await read_body(request, MAX_DOCKERFILE_BYTES + FORM_SLACK)  # no context: the fields alone
        fields = _fields(body) if kind == "application/json" else _form_fields(await _form(request, body))
        return _order(fields, None, set(), max_context_bytes)
    limit = max_context_bytes + max_archive_bytes + MAX_DOCKERFILE_BYTES + FORM_SLACK
    form = await _streamed_form(request, limit)
    try:
        partnames = {key for key, value in form.multi_items() if isinstance(value, UploadFile)}
        parts = await _multipart(form, max_context_bytes)
        archive = parts.archive is not None
        order = _order(parts.fields, parts.context, partnames, max_context_bytes, archive=archive)
        if parts.archive is None:
            return order
        staged = await stage_archive(parts.archive, max_archive_bytes)
        base = replace(order.recipe.base, ref=staged.sha256)
        return replace(order, recipe=replace(order.recipe, base=base), archive=staged)
    finally:
        await form.close()


def _fields(body: bytes) -> dict[str, Any]:
    try:
        parsed = json.loads(body)
    except ValueError:
        raise _bad("body", "not valid JSON") from None
    if not isinstance(parsed, dict):
        raise _bad("body", "must be a JSON object")
    if "context" in parsed:
        raise _bad("context", "a context travels as a multipart part, not in JSON")
    return parsed


def _form_fields(form: FormData) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for key, value in form.multi_items():
        if key in fields:
            raise _bad(key, "given more than once")
        fields[key] = value
    return fields


def _order(
    fields: dict[str, Any], context: bytes | None, parts: set[str], max_context_bytes: int, *, archive: bool = False
) -> BuildOrder:
    _checked_fields(fields)
    name = _text(fields, "name")
    if not name:
        raise _bad("name", "is required")
    if context is not None and _text(fields, "dockerfile") is None:
        if "rootfs" in parts:  # PandaStack's build(rootfs_tar=...)
            raise _bad("rootfs", "cryobox builds templates from a Dockerfile or an image, not an uploaded rootfs")
        raise _bad("context", "only a Dockerfile build takes a context")
    recipe = _recipe(fields, archive=archive)
    if _bool(fields, "no_cache"):
        recipe = replace(recipe, force=True)
    blobs: dict[str, bytes] = {}
    if any(step.op == "COPY" and not step.context for step in recipe.steps):
        limits = ContextLimits(max_total_bytes=max_context_bytes)
        recipe, blobs = split_context(
            recipe, io.BytesIO(context if context is not None else _files_tar([])), limits=limits
        )
    return BuildOrder(
        name=name, recipe=recipe, blobs=blobs, cpu=_int(fields, "cpu"), memory_mb=_int(fields, "memory_mb")
    )


__all__ = ["DISK_MIB", "FIELDS", "BuildOrder", "read_build"]
