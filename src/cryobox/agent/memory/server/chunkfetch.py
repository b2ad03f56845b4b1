"""One chunk fetch: a GET of the chunk's object (``chunks/<sha[:2]>/<sha>``, through the store's range reader:
``[0, chunk length)``, the whole object) verified against the index, retried with exponential backoff and full
jitter (``sleep(uniform(0, min(max, base * 2**retry)))``) for throttling, store errors, short reads and
sha256 mismatches, bounded by ``retries`` and by the per-fetch deadline. A missing object is final. Failure is a
:class:`~cryobox.errors.ChunkFetchFailed` naming the key, the chunk, the attempts and the last error.
"""

from __future__ import annotations

import hashlib
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass

from ....errors import ChunkFetchFailed, InvalidArgument, ObjectNotFound, StoreError
from .chunkref import ImageRef, RangeReader, ResolverConfig
from .metrics import MemoryMetrics

log = logging.getLogger(__name__)

Progress = Callable[[int, str], None]
"""Told ``(attempts so far, last error)`` after each failed attempt (waiters report it on their own deadline)."""


@dataclass(frozen=True)
class Timing:
    """The clock, sleep and random source a fetch uses (injected by tests)."""

    clock: Callable[[], float]
    sleep: Callable[[float], None]
    rng: random.Random


def fetch_chunk(
    store: RangeReader,
    image: ImageRef,
    idx: int,
    config: ResolverConfig,
    metrics: MemoryMetrics,
    timing: Timing,
    prefetch: bool,
    progress: Progress,
) -> bytes:
    """GET and verify chunk ``idx`` with retries, backoff + full jitter and a deadline."""
    cfg, index = config, image.index
    key, length, expected = index.key(idx), index.chunk_len(idx), index.sha256[idx]
    began = timing.clock()
    deadline = began + cfg.fetch_deadline_s
    attempts, why = 0, "retries exhausted"
    last: BaseException | None = None
    while True:
        if attempts > cfg.retries:
            break
        if attempts > 0:
            delay = timing.rng.uniform(0.0, min(cfg.backoff_max_s, cfg.backoff_base_s * 2 ** (attempts - 1)))
            if timing.clock() + delay >= deadline:
                why = "deadline"
                break
            timing.sleep(delay)
        attempts += 1
        metrics.store_gets.inc()
        try:
            data = store.get_range(key, 0, length)
        except ObjectNotFound as err:
            last, why = err, "object not found"
            break
        except StoreError as err:
            last = err
        except Exception as err:  # the store should translate everything; do not retry the unknown
            log.exception("unexpected error fetching %s chunk %d (%s)", image.key, idx, key)
            last, why = err, "unexpected error"
            break
        else:
            if len(data) != length:
                last = StoreError(f"short read: got {len(data)} of {length} bytes")
            elif (digest := hashlib.sha256(data).hexdigest()) != expected:
                last = StoreError(f"sha256 mismatch: got {digest[:16]}..., want {expected[:16]}...")
            else:
                metrics.chunk_fetches.inc()
                metrics.chunk_fetch_seconds.observe(max(0.0, timing.clock() - began))
                if prefetch:
                    metrics.prefetch_chunks.inc()
                return data
        progress(attempts, describe(last))
        if timing.clock() >= deadline:
            why = "deadline"
            break
    elapsed = timing.clock() - began
    failure = ChunkFetchFailed(
        f"chunk {idx} ({key}) of {image.key!r} (generation {index.generation}) not fetched: {attempts} attempt(s) in "
        f"{elapsed:.3f}s, gave up ({why}); last error: {describe(last)}",
        details=failure_details(image, idx, attempts, describe(last), why),
    )
    metrics.chunk_fetch_failures.inc()
    raise failure from last


def check_idx(image: ImageRef, idx: int) -> None:
    if not 0 <= idx < image.index.chunk_count:
        raise InvalidArgument(f"chunk {idx} out of range for {image.key!r} ({image.index.chunk_count} chunks)")


def wait_failure(image: ImageRef, idx: int, waited_s: float, attempts: int, last_error: str) -> ChunkFetchFailed:
    """A waiter's failure: the leader's fetch did not finish within the waiter's own deadline."""
    return ChunkFetchFailed(
        f"chunk {idx} of {image.key!r} (generation {image.index.generation}) not fetched: gave up "
        f"after waiting {waited_s:g}s for the in-flight fetch "
        f"({attempts} attempt(s) so far; last error: {last_error or 'none'})",
        details=failure_details(image, idx, attempts, last_error, "wait deadline"),
    )


def failure_details(image: ImageRef, idx: int, attempts: int, last_error: str, reason: str) -> dict[str, object]:
    return {
        "key": image.key,
        "object": image.index.key(idx),
        "generation": image.index.generation,
        "identity": image.identity,
        "chunk": idx,
        "attempts": attempts,
        "last_error": last_error,
        "reason": reason,
    }


def describe(err: BaseException | None) -> str:
    if err is None:
        return "none"
    return f"{type(err).__name__}: {err}"
