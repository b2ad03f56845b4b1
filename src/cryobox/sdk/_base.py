"""The IO-free core of the SDK, shared by ``Sandbox`` (sync) and ``AsyncSandbox`` (async).

Everything here is plain computation: resolving configuration, parsing responses, mapping error bodies to the
:mod:`cryobox.errors` tree, and planning capacity retries (requests are built in :mod:`._requests`, server-sent
events decoded in :mod:`._sse`). The two clients (``_async/``, hand-written, and ``_sync/``, generated from it
by ``scripts/unasync.py``) only send those requests and feed the responses back; they never interpret the wire
format themselves.
"""

from __future__ import annotations

import asyncio
import email.utils
import os
import random
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import httpx
from pydantic import BaseModel

from .. import models
from ..errors import (
    ERRORS_BY_CODE,
    CommandFailed,
    CryoboxError,
    GuestError,
    HostUnavailable,
    ImagePullFailed,
    QuotaExceeded,
    StoreError,
)
from ..util.tls import default_tls_context

DEFAULT_URL = "http://127.0.0.1:8080"
CONNECT_TIMEOUT_S = 10.0
# an exec's HTTP read timeout is at least the command's own timeout plus this margin
EXEC_READ_MARGIN_S = 30.0

# --- configuration ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClientConfig:
    """Where the API is and how to talk to it. ``resolve`` applies: argument, else environment, else default."""

    api_url: str
    api_key: str
    timeout_s: float = 300.0

    @classmethod
    def resolve(cls, api_url: str | None = None, api_key: str | None = None, timeout_s: float = 300.0) -> ClientConfig:
        url = api_url or os.environ.get("CRYOBOX_API_URL") or DEFAULT_URL
        key = api_key or os.environ.get("CRYOBOX_API_KEY") or ""
        return cls(api_url=url.rstrip("/"), api_key=key, timeout_s=timeout_s)

    def client_options(self) -> dict[str, Any]:
        """Keyword arguments for ``httpx.Client`` / ``httpx.AsyncClient``."""
        headers = {"User-Agent": "cryobox-python"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return {
            "base_url": self.api_url,
            "headers": headers,
            "timeout": httpx.Timeout(self.timeout_s, connect=CONNECT_TIMEOUT_S),
            "verify": tls_context(),
        }

    def client(self) -> httpx.Client:
        return httpx.Client(**self.client_options())

    def async_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(**self.client_options())


def tls_context() -> ssl.SSLContext:
    """The process's one default TLS context (:func:`cryobox.util.tls.default_tls_context`), shared by every client
    the SDK makes: ``httpx.Client()`` builds a new one each time, which every ``Sandbox.create`` paid (29 ms)."""
    return default_tls_context()


class SharedClient:
    """Counts the SDK objects using one HTTP client (a sandbox and its forks): the last one out closes it."""

    def __init__(self) -> None:
        self.holders = 1

    def join(self) -> SharedClient:
        self.holders += 1
        return self

    def leave(self) -> bool:
        """Drop one holder; ``True`` when it was the last (close the client now)."""
        self.holders -= 1
        return self.holders == 0


# --- results ---------------------------------------------------------------------------------------------------

StreamKind = Literal["stdout", "stderr", "exit"]


@dataclass(frozen=True)
class ExecResult:
    stdout: str
    stderr: str
    exit_code: int
    duration_ms: float


@dataclass(frozen=True)
class StreamEvent:
    """``kind`` is ``stdout``, ``stderr`` (with ``chunk``) or ``exit`` (with ``exit_code``)."""

    kind: StreamKind
    chunk: str = ""
    exit_code: int | None = None


@dataclass(frozen=True)
class Lifecycle:
    """``GET /v1/sandboxes/{id}/lifecycle``: ``ttl_seconds`` is ``None`` when the sandbox has no TTL."""

    ttl_seconds: int | None
    persistent: bool
    idle_seconds: float
    expires_at: str | None
    on_timeout: str = "kill"
    """What the TTL's expiry does: ``kill`` or ``hibernate``."""
    auto_wake: bool = True
    """Whether any request wakes it when hibernated (else only ``resume()``)."""
    hibernated_at: str | None = None
    retained_until: str | None = None
    """When a hibernated sandbox is deleted (the server's paused retention) unless resumed before."""


# --- capacity retry --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RetryPolicy:
    """How long ``create`` keeps retrying capacity refusals (503 / 429 with ``Retry-After``).

    Each retry waits ``Retry-After + uniform(0, jitter)``; ``jitter`` starts at ``base_jitter_s`` and doubles per
    retry up to ``max_jitter_s``. A retry whose wait would overrun ``budget_s`` (measured by ``clock`` from the
    first attempt) is not attempted and the last refusal is raised. ``budget_s=0`` disables retrying.

    ``sleep`` is used by ``Sandbox``, ``async_sleep`` by ``AsyncSandbox``; ``rand`` and ``clock`` by both.
    Inject fakes for tests.
    """

    budget_s: float = 60.0
    base_jitter_s: float = 1.0
    max_jitter_s: float = 15.0
    sleep: Callable[[float], None] = time.sleep
    async_sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    rand: Callable[[float, float], float] = random.uniform
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        for name in ("budget_s", "base_jitter_s", "max_jitter_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"RetryPolicy.{name} must be >= 0")

    def jitter_cap(self, retries_done: int) -> float:
        """The upper bound of the random jitter added to the ``retries_done + 1``-th wait: 1, 2, 4, 8, 15, 15…"""
        return min(self.base_jitter_s * 2.0 ** min(retries_done, 32), self.max_jitter_s)


DEFAULT_RETRY = RetryPolicy()


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """``Retry-After`` in seconds (delta-seconds or an HTTP date); ``None`` when absent or unparseable."""
    if value is None or not value.strip():
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if seconds != seconds:  # NaN
        return None
    return max(0.0, seconds)


def capacity_retry_after(response: httpx.Response) -> float | None:
    """The wait the server asked for, if ``response`` is a refusal worth retrying; else ``None``.

    Retryable: 429 with ``Retry-After``, and 503 with ``Retry-After`` *and* a JSON body carrying ``error`` (a
    cryobox capacity refusal, sent before anything was created; a bare 503 from a proxy is not one).
    """
    retry_after = parse_retry_after(response.headers.get("retry-after"))
    if retry_after is None:
        return None
    if response.status_code == 429:
        return retry_after
    if response.status_code == 503:
        body = _json_object(response)
        if body is not None and isinstance(body.get("error"), str) and body["error"]:
            return retry_after
    return None


class RetryPlan:
    """The retry state of one logical request: ask ``next_delay`` after each refusal."""

    def __init__(self, policy: RetryPolicy) -> None:
        self._policy = policy
        self._started = policy.clock()
        self.retries = 0

    def next_delay(self, response: httpx.Response) -> float | None:
        """Seconds to sleep before the next attempt, or ``None``: do not retry, raise this refusal."""
        policy = self._policy
        if policy.budget_s <= 0:
            return None
        retry_after = capacity_retry_after(response)
        if retry_after is None:
            return None
        delay = retry_after + policy.rand(0.0, policy.jitter_cap(self.retries))
        remaining = policy.budget_s - (policy.clock() - self._started)
        if delay > remaining:
            return None
        self.retries += 1
        return delay


# --- responses -------------------------------------------------------------------------------------------------

M = TypeVar("M", bound=BaseModel)


def _json_object(response: httpx.Response) -> dict[str, Any] | None:
    try:
        body = response.json()
    except ValueError:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return None
    return body if isinstance(body, dict) else None


def _unexpected(response: httpx.Response, err: Exception) -> CryoboxError:
    request = response.request
    return CryoboxError(
        f"unexpected response to {request.method} {request.url.path} (HTTP {response.status_code}): {err}",
        details={"status": response.status_code},
    )


def parse_model(model: type[M], response: httpx.Response) -> M:
    """Validate a JSON body into a wire model; a malformed body is a :class:`CryoboxError`, not a crash."""
    try:
        return model.model_validate(response.json())
    except ValueError as err:  # includes pydantic.ValidationError and JSONDecodeError
        raise _unexpected(response, err) from err


def parse_sandbox(response: httpx.Response) -> models.Sandbox:
    return parse_model(models.Sandbox, response)


def parse_sandbox_list(response: httpx.Response) -> list[models.Sandbox]:
    return parse_model(models.SandboxList, response).items


def parse_exec(response: httpx.Response, *, cmd: str, check: bool) -> ExecResult:
    """:raises CommandFailed: ``check`` is set and the command exited non-zero."""
    body = parse_model(models.ExecResponse, response)
    result = ExecResult(stdout=body.stdout, stderr=body.stderr, exit_code=body.exit_code, duration_ms=body.duration_ms)
    if check and result.exit_code != 0:
        raise CommandFailed(
            f"command exited with {result.exit_code}: {cmd}",
            exit_code=result.exit_code,
            stdout=result.stdout,
            stderr=result.stderr,
        )
    return result


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def parse_lifecycle(response: httpx.Response) -> Lifecycle:
    body = _json_object(response)
    try:
        if body is None:
            raise ValueError("body is not a JSON object")
        ttl = body.get("ttl_seconds")
        expires_at = body.get("expires_at")
        return Lifecycle(
            ttl_seconds=None if ttl is None else int(ttl),
            persistent=bool(body.get("persistent", False)),
            idle_seconds=float(body.get("idle_seconds") or 0.0),
            expires_at=None if expires_at is None else str(expires_at),
            on_timeout=str(body.get("on_timeout") or "kill"),
            auto_wake=bool(body.get("auto_wake", True)),
            hibernated_at=_opt_str(body.get("hibernated_at")),
            retained_until=_opt_str(body.get("retained_until")),
        )
    except (TypeError, ValueError) as err:
        raise _unexpected(response, err) from err


def parse_write(response: httpx.Response) -> int:
    return parse_model(models.WriteResult, response).bytes


def parse_dir(response: httpx.Response) -> list[models.FileEntry]:
    return parse_model(models.DirListing, response).entries


def parse_entry(response: httpx.Response) -> models.FileEntry:
    return parse_model(models.FileEntry, response)


# --- errors ----------------------------------------------------------------------------------------------------

# a bare 502/503 is ambiguous for these (the guest, the store, an image registry): it stays a plain CryoboxError
_BY_STATUS: dict[int, type[CryoboxError]] = {
    cls.http_status: cls
    for cls in ERRORS_BY_CODE.values()
    if cls.http_status not in (200, 500) and not issubclass(cls, StoreError | ImagePullFailed | GuestError)
}


def _by_status(status: int) -> type[CryoboxError]:
    """For bodies without a known code (a proxy's page, say): only unambiguous statuses map to a subclass."""
    return _BY_STATUS.get(status, CryoboxError)


def _build_error(
    cls: type[CryoboxError], message: str, details: dict[str, Any], retry_after_s: float | None
) -> CryoboxError:
    if issubclass(cls, HostUnavailable | QuotaExceeded):
        return cls(message, retry_after_s=1.0 if retry_after_s is None else retry_after_s, details=details)
    return cls(message, details=details)


def error_from_response(response: httpx.Response) -> CryoboxError | None:
    """The error an HTTP response stands for (``None`` below 400). The body must have been read."""
    if response.status_code < 400:
        return None
    body = _json_object(response) or {}
    message = body.get("error")
    if not isinstance(message, str) or not message:
        message = f"HTTP {response.status_code}"
    details = body.get("details")
    cls = ERRORS_BY_CODE.get(str(body.get("code") or "")) or _by_status(response.status_code)
    retry_after = parse_retry_after(response.headers.get("retry-after"))
    return _build_error(cls, message, details if isinstance(details, dict) else {}, retry_after)


def raise_for_error(response: httpx.Response) -> None:
    """Raise the mapped :class:`CryoboxError` for an error response; do nothing for a success."""
    error = error_from_response(response)
    if error is not None:
        raise error


def transport_error(err: httpx.TransportError, api_url: str) -> CryoboxError:
    """Translate an httpx transport failure; raise the result ``from err``.

    Only a failure to connect (nothing was sent) is a :class:`HostUnavailable`; anything later (a read error, a
    timeout mid-request) may have had effects on the server and is a plain :class:`CryoboxError`.
    """
    if isinstance(err, httpx.ConnectError | httpx.ConnectTimeout):
        return HostUnavailable(f"cannot reach the cryobox API at {api_url}: {err}")
    return CryoboxError(f"request to the cryobox API at {api_url} failed: {type(err).__name__}: {err}")
