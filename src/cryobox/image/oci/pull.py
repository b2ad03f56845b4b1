"""``pull_image``: a reference to plain layer tars and an image config, over the distribution API.

Synchronous: the host agent runs it in a worker thread. An index (or Docker manifest list) resolves to its
entry for ``settings.platform`` (``linux/amd64``); the host only moves bytes (no layer is ever unpacked onto its
filesystem, only decompressed to a tar file).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from ...errors import ImagePullFailed
from ..cache import ContentCache
from .assemble import assemble
from .client import RegistryClient
from .limits import ImageLimits
from .manifest import Descriptor, Index, Manifest, parse_document, select_platform
from .pulled import PulledImage
from .reference import Reference, parse_reference
from .settings import RegistrySettings

MAX_INDEX_DEPTH = 2
"""An index may name an index (rare); deeper nesting is refused."""


class _RegistryBlobs:
    def __init__(self, client: RegistryClient, ref: Reference) -> None:
        self._client = client
        self._ref = ref

    @contextlib.contextmanager
    def open_blob(self, descriptor: Descriptor, what: str) -> Iterator[Iterable[bytes]]:
        with self._client.blob_stream(self._ref, descriptor.digest, what=what) as chunks:
            yield chunks


def pull_image(
    ref: str,
    dest: Path,
    *,
    settings: RegistrySettings,
    limits: ImageLimits,
    progress: Callable[[str], None],
    client: RegistryClient | None = None,
) -> PulledImage:
    """Pull ``ref`` into ``dest`` (created if need be; layer tars named ``NNN-<diff id>.tar``).

    ``client``: a client to reuse (tests pass one over a mock transport); by default one for this call.
    Raises :class:`~cryobox.errors.InvalidArgument` (the reference), :class:`~cryobox.errors.NotFound` (no such
    image), :class:`~cryobox.errors.ImageTooLarge` (a limit), :class:`~cryobox.errors.ImageDigestMismatch` and
    :class:`~cryobox.errors.ImagePullFailed` (anything else the registry or the image got wrong).
    """
    parsed = parse_reference(ref)
    with contextlib.ExitStack() as stack:
        if client is None:
            client = stack.enter_context(RegistryClient(settings))
        progress(f"pulling {parsed}")
        document_limit = limits.limit("max_document_bytes")
        data, content_type, digest = client.manifest(parsed, parsed.target, limit=document_limit)
        doc = parse_document(data, content_type)
        index_digest = ""
        depth = 0
        while isinstance(doc, Index):
            depth += 1
            if depth > MAX_INDEX_DEPTH:
                raise ImagePullFailed(f"{parsed}: indexes nested deeper than {MAX_INDEX_DEPTH} are not supported")
            index_digest = index_digest or digest
            entry = select_platform(doc, settings.platform)
            progress(f"{parsed}: {entry.platform} is {entry.digest}")
            data, content_type, digest = client.manifest(parsed, entry.digest, limit=document_limit)
            doc = parse_document(data, entry.media_type or content_type)
        assert isinstance(doc, Manifest)
        cache = ContentCache(settings.cache_dir) if settings.cache_dir is not None else None
        return assemble(
            _RegistryBlobs(client, parsed),
            doc,
            name=str(parsed),
            digest=digest,
            dest=dest,
            limits=limits,
            progress=progress,
            cache=cache,
            platform=settings.platform,
            index_digest=index_digest,
        )
    raise AssertionError("unreachable")  # pragma: no cover - ExitStack does not swallow


__all__ = ["pull_image"]
