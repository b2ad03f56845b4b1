"""``AsyncTemplates``: building the workspace's templates from a Dockerfile (+ a context directory), an image
reference or an image archive (``docker save``, an OCI layout tar), and ``AsyncBuild``, one build: its live log
lines and its result.

The build runs on the server; the call that starts it returns at once. ``logs()`` follows it (resuming from the
last line seen if the connection drops), ``wait()`` returns the finished build or raises
:class:`~cryobox.errors.TemplateBuildFailed` naming the failing step, its Dockerfile line and the last log lines::

    from cryobox.sdk import AsyncTemplates

    async with AsyncTemplates() as templates:
        build = await templates.build_from_dockerfile("web", dockerfile="Dockerfile", context=".")
        async for line in build.logs():
            print(line.step, line.message)
        await build.wait()           # raises TemplateBuildFailed(step=..., line=..., log_tail=...)
        sbx = await AsyncSandbox.create(template="web")
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from os import PathLike
from pathlib import Path

from ... import models
from ...errors import HostUnavailable, InvalidArgument
from .. import _builds
from ._http import stream_lines
from ._resource import AsyncApiClient

LOG_TAIL = 20
RESUMES = 5
"""How often ``logs()`` reconnects after a dropped stream before it gives up."""


class AsyncBuild:
    """One template build. ``info`` is the build as last seen (``refresh()`` reads it again)."""

    def __init__(self, templates: AsyncTemplates, info: models.TemplateBuild) -> None:
        self._templates = templates
        self.info = info
        self.tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL)

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def name(self) -> str:
        return self.info.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, id={self.id!r}, status={self.info.status!r})"

    async def refresh(self) -> models.TemplateBuild:
        request = _builds.get_build_request(self.name, self.id)
        self.info = _builds.parse_build((await self._templates._send(request)).json())
        return self.info

    async def logs(self, *, offset: int = 0) -> AsyncIterator[models.BuildLogLine]:
        """The build's log lines from ``offset``, live, until the build ends (``info`` is then the final build;
        a failed build ends the iteration too: ``wait()`` raises)."""
        for _ in range(RESUMES + 1):
            decoder = _builds.BuildStreamDecoder()
            request = _builds.logs_request(self.name, self.id, offset)
            with contextlib.suppress(HostUnavailable):  # the server went away: reconnect, from where we were
                async with contextlib.aclosing(stream_lines(self._templates._http, request)) as lines:
                    async for raw in lines:
                        item = decoder.feed(raw)
                        if isinstance(item, _builds.BuildEnd):
                            self.info = item.build
                            return
                        if item is not None:
                            offset = item.offset + 1
                            self.tail.append(item.message)
                            yield item
            # the stream ended without its last event (a proxy cut it, a replica stopped): resume
        raise HostUnavailable(f"the log stream of build {self.id} kept ending before the build did")

    async def wait(self, *, on_log: Callable[[models.BuildLogLine], object] | None = None) -> models.TemplateBuild:
        """Follow the build to its end; returns it when ``done``.

        :raises TemplateBuildFailed: it failed (``step``, ``line``, ``instruction``, ``log_tail``)."""
        if self.info.status not in ("done", "failed"):
            async for line in self.logs():
                if on_log is not None:
                    on_log(line)
        if self.info.status != "failed":
            await self.refresh()
        if self.info.status == "failed":
            raise _builds.failure(self.info, tuple(self.tail))
        return self.info


class AsyncTemplates(AsyncApiClient):
    """The workspace's template builds. Build one per API endpoint; ``aclose()`` (or ``async with``) releases it.

    ``http`` is an optional client to use (custom transport, tests); this object takes ownership of it.
    """

    async def build_from_dockerfile(
        self,
        name: str,
        *,
        dockerfile: str | PathLike[str],
        context: str | PathLike[str] | None = None,
        build_args: Mapping[str, str] | None = None,
        no_cache: bool = False,
        cpu: int | None = None,
        memory_mb: int | None = None,
    ) -> AsyncBuild:
        """Start building template ``name`` from ``dockerfile`` (a path to one, or its text when no such file
        exists) with ``context`` (a directory, packed honouring its ``.dockerignore``; none: no ``COPY``).

        :raises InvalidArgument: the Dockerfile (the message names the line) or a field.
        :raises PayloadTooLarge: the context is over the server's limit."""
        text = _builds.dockerfile_text(dockerfile)
        packed = _builds.pack_context(context)[0] if context is not None else None
        request = _builds.dockerfile_request(
            name, text, context=packed, build_args=build_args, no_cache=no_cache, cpu=cpu, memory_mb=memory_mb
        )
        return AsyncBuild(self, _builds.parse_build((await self._send(request)).json()))

    async def build_from_image(
        self, name: str, image: str, *, cpu: int | None = None, memory_mb: int | None = None
    ) -> AsyncBuild:
        """Start building template ``name`` from the OCI image ``image`` (``[registry/]name[:tag][@digest]``)."""
        request = _builds.image_request(name, image, cpu=cpu, memory_mb=memory_mb)
        return AsyncBuild(self, _builds.parse_build((await self._send(request)).json()))

    async def build_from_image_archive(
        self,
        name: str,
        path: str | PathLike[str],
        *,
        image: str | None = None,
        dockerfile: str | PathLike[str] | None = None,
        context: str | PathLike[str] | None = None,
        build_args: Mapping[str, str] | None = None,
        no_cache: bool = False,
        cpu: int | None = None,
        memory_mb: int | None = None,
    ) -> AsyncBuild:
        """Start building template ``name`` from the image archive at ``path``: a ``docker save`` tar or a tar of
        an OCI image layout (``image`` names the image inside when it holds several: a tag). With ``dockerfile``
        (a path or its text; it starts ``FROM archive``) and ``context``, the Dockerfile's steps run on the image.

        :raises InvalidArgument: not an image archive, or a field.
        :raises PayloadTooLarge: the archive is over the server's limit."""
        archive = Path(path)
        if not archive.is_file():
            raise InvalidArgument(f"image archive {str(archive)!r} is not a file", details={"field": "image_archive"})
        text = None
        if dockerfile is not None:
            text = _builds.dockerfile_text(dockerfile)
        packed = _builds.pack_context(context)[0] if context is not None else None
        request = _builds.archive_request(
            name,
            archive.read_bytes(),
            filename=archive.name,
            image=image,
            dockerfile=text,
            context=packed,
            build_args=build_args,
            no_cache=no_cache,
            cpu=cpu,
            memory_mb=memory_mb,
        )
        return AsyncBuild(self, _builds.parse_build((await self._send(request)).json()))

    async def get_build(self, name: str, build_id: str) -> AsyncBuild:
        """:raises NotFound: no such build of ``name`` in this workspace."""
        request = _builds.get_build_request(name, build_id)
        return AsyncBuild(self, _builds.parse_build((await self._send(request)).json()))


__all__ = ["AsyncBuild", "AsyncTemplates"]
