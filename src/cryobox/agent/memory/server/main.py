"""The memory server process: the FUSE filesystem of memory images, the chunk resolver and the host's chunk cache.

Run by the host agent (``python -m cryobox.agent.memory.server.main ...``) as its own process, so libfuse owns that
process's signals and main thread and a page fault QEMU takes never waits for the agent's event loop. It runs in
its own session and outlives the agent (lazily paged VMs keep faulting through it while the agent restarts); a
restarted agent reattaches to it, and an agent stopping with ``--on-stop kill`` stops it.

Besides the mount it answers HTTP on a unix socket (``--control``)::

    GET  /metrics                       Prometheus text: faults_total, chunk_fetches_total, zero_fills_total, ...
    GET  /stats                         the same counters as JSON, plus cache and per-image figures
    GET  /images/<name>/first-reads     chunk indexes in first-read order (a restore's prefetch trace)
    POST /images/<name>/forget-reads    start recording first reads afresh
    GET  /images/<name>/failure         the last chunk fetch failure of the image (404 if none); ``?since=T``:
                                        only one recorded at or after T (seconds of CLOCK_BOOTTIME)
    POST /images/<name>/prefetch        replay the image's stored trace (memory.trace) in the background

``<name>`` is the image's file name under the mount, its index pin included (``<prefix>@<sha256>``, see
:mod:`.fusefs`). ``--pinned-names`` is required: it marks that naming in the argv the agent compares before
reattaching, so an agent never reattaches to a server of the earlier, unpinned naming (it replaces it);
``--content-chunks`` does the same for servers that still range-GET ``memory.pack`` and key their cache by image.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import socketserver
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import mfusepy as fuse
from prometheus_client import generate_latest

from ....errors import CryoboxError, ObjectNotFound
from ....objstore.chunkfmt import PrefetchTrace
from ....objstore.client import ObjectStore, open_store
from ....objstore.faults import FaultyStore, StoreFaults
from ..mounts import unmount
from .chunkcache import ChunkCache
from .failures import boot_clock
from .fusefs import TRACE_NAME, ImageTable, MemoryFS, prefix_of
from .metrics import MemoryMetrics
from .resolver import ChunkResolver, ResolverConfig

log = logging.getLogger("cryobox.memserver")

HOT_CHUNKS = 16
"""Verified chunks kept in memory in front of the disk cache (64 MiB): a 4 MiB chunk is read by up to four
1 MiB FUSE reads in a row, and re-reading and re-hashing it from disk each time costs ~5 ms per read."""


class MemoryServer:
    """Everything the process serves, wired together (the FUSE loop and the control socket share it)."""

    def __init__(
        self,
        store: ObjectStore,
        cache: ChunkCache | None,
        config: ResolverConfig,
        local_dir: Path | None = None,
        stamp: Callable[[], float] = boot_clock,
    ) -> None:
        self.store = store
        self.cache = cache
        self.metrics = MemoryMetrics()
        self.resolver = ChunkResolver(store, cache, config, self.metrics, stamp=stamp)
        self.table = ImageTable(store, local_dir, stamp)
        self.fs = MemoryFS(self.table, self.resolver)
        self.config = config

    def stats(self) -> dict[str, Any]:
        images = {
            name: {
                "touched": len(touched := self.resolver.touched(ref.identity)),
                "touched_stored": sum(1 for i in touched if not ref.index.is_zero(i)),
                # chunk objects behind them: chunks of equal bytes are one object, fetched and cached once
                "touched_distinct": len({ref.index.sha256[i] for i in touched if not ref.index.is_zero(i)}),
                "chunks": ref.index.chunk_count,
                "stored_chunks": sum(1 for i in range(ref.index.chunk_count) if not ref.index.is_zero(i)),
                "distinct_chunks": len(ref.index.digests()),
            }
            for name, ref in self.table.loaded().items()
        }
        cache: dict[str, Any] = {"enabled": self.cache is not None}
        if self.cache is not None:
            cache.update(used_bytes=self.cache.used_bytes, budget_bytes=self.cache.budget_bytes)
            cache.update(dataclasses.asdict(self.cache.stats))
        return {
            "metrics": self.metrics.snapshot(),
            "store": self.store.stats.snapshot(),
            "cache": cache,
            "single_flight": self.config.single_flight,
            "images": images,
        }

    def prefetch(self, name: str) -> int:
        ref = self.table.get(name)
        if self.cache is None:
            return 0  # without a cache prefetched chunks would be thrown away
        trace = PrefetchTrace.from_bytes(self.table.small_object(f"{prefix_of(name)}/{TRACE_NAME}"))
        self.resolver.prefetch(ref, trace.chunks)
        return len(trace.chunks)


def _handler(server: MemoryServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
            log.debug(format, *args)

        def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _json(self, status: int, value: Any) -> None:
            self._send(status, json.dumps(value).encode())

        def _image(self) -> tuple[str, str]:
            parts = urlsplit(self.path).path.strip("/").split("/")
            if len(parts) != 3 or parts[0] != "images":
                raise LookupError(self.path)
            return parts[1], parts[2]

        def _since(self) -> float | None:
            values = parse_qs(urlsplit(self.path).query).get("since")
            return float(values[-1]) if values else None

        def address_string(self) -> str:
            return "control"

        def do_GET(self) -> None:  # noqa: N802 - stdlib name
            try:
                if self.path == "/metrics":
                    return self._send(200, generate_latest(server.metrics.registry), "text/plain; version=0.0.4")
                if self.path == "/stats":
                    return self._json(200, server.stats())
                name, what = self._image()
                if what == "first-reads":
                    ref = server.table.loaded().get(name)
                    return self._json(200, server.resolver.first_reads(ref.identity) if ref else [])
                if what == "failure":
                    return self._failure(name, self._since())
                raise LookupError(self.path)
            except LookupError:
                self._json(404, {"error": f"no such resource {self.path}"})
            except ValueError:
                self._json(400, {"error": f"bad query in {self.path}"})

        def _failure(self, name: str, since: float | None) -> None:
            ref = server.table.loaded().get(name)
            failure: CryoboxError | None = server.resolver.last_failure(ref.identity, since) if ref else None
            failure = failure or server.table.failure(name, since)
            if failure is None:
                return self._json(404, {"error": "no failure recorded"})
            return self._json(200, failure.to_wire())

        def do_POST(self) -> None:  # noqa: N802 - stdlib name
            try:
                name, what = self._image()
                if what == "forget-reads":
                    ref = server.table.get(name)
                    server.resolver.forget_reads(ref.identity)
                    return self._json(200, {})
                if what == "prefetch":
                    return self._json(200, {"chunks": server.prefetch(name)})
                raise LookupError(self.path)
            except LookupError:
                self._json(404, {"error": f"no such resource {self.path}"})
            except ObjectNotFound as err:
                self._json(404, err.to_wire())
            except CryoboxError as err:
                self._json(502, err.to_wire())

    return Handler


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="cryobox-memserver")
    parser.add_argument("--mount", type=Path, required=True)
    parser.add_argument("--control", type=Path, required=True)
    parser.add_argument("--store", required=True, help="object store URL (file:///dir, s3://bucket?endpoint=...)")
    parser.add_argument("--cache-dir", type=Path, required=True)
    parser.add_argument("--cache-budget", type=int, required=True, help="bytes of allocated blocks")
    parser.add_argument("--faults", default="", help="store-side latency/throttle injection (StoreFaults spec)")
    parser.add_argument("--naive", action="store_true", help="no single-flight, no chunk cache (for comparison)")
    parser.add_argument("--fetch-deadline", type=float, default=ResolverConfig.fetch_deadline_s)
    parser.add_argument("--retries", type=int, default=ResolverConfig.retries)
    parser.add_argument("--image-gid", type=int, default=None, help="admit this group only (jailed QEMUs)")
    parser.add_argument(
        "--pinned-names",
        action="store_true",
        required=True,
        help="file names carry their chunk index's sha256 (<prefix>@<sha256>); names without one are refused",
    )
    parser.add_argument(
        "--content-chunks",
        action="store_true",
        required=True,
        help="chunks are objects named by their sha256 (chunks/<sha[:2]>/<sha>), cached by sha256",
    )
    return parser.parse_args(argv)


def build(args: argparse.Namespace) -> MemoryServer:
    store = open_store(args.store)
    faults = StoreFaults.parse(args.faults) if args.faults else None
    if faults is not None:
        store = FaultyStore(store, faults)
    cache = None
    if not args.naive:
        cache = ChunkCache(args.cache_dir, args.cache_budget)
        cache.open()
    config = ResolverConfig(
        single_flight=not args.naive,
        use_cache=not args.naive,
        hot_chunks=0 if args.naive else HOT_CHUNKS,
        retries=args.retries,
        fetch_deadline_s=args.fetch_deadline,
    )
    return MemoryServer(store, cache, config, None if args.naive else args.cache_dir / "objects")


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="memserver %(levelname)s %(message)s")
    args = parse_args(sys.argv[1:] if argv is None else argv)
    server = build(args)
    unmount(args.mount)
    args.mount.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        args.control.unlink()
    control = _UnixHTTPServer(str(args.control), _handler(server))
    threading.Thread(target=control.serve_forever, name="control", daemon=True).start()
    try:
        # blocks until unmounted or SIGTERM/SIGINT (libfuse's handlers unmount on the way out)
        server.fs.image_gid = args.image_gid
        shared = args.image_gid is not None  # other uids open the files, and the kernel checks their modes
        fuse.FUSE(
            server.fs,
            str(args.mount),
            foreground=True,
            allow_other=shared,
            default_permissions=shared,
            kernel_cache=True,
        )
    except RuntimeError as err:  # mfusepy reports the loop's exit status; a signal-initiated exit is nonzero
        log.info("FUSE loop ended (%s)", err)
    finally:
        control.shutdown()
        with contextlib.suppress(FileNotFoundError):
            args.control.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
