"""One error tree for cryobox, with stable wire codes.

::

    CryoboxError (code "internal", HTTP 500)
     ├── InvalidArgument     invalid_argument   400
     ├── Unauthorized        unauthorized       401
     ├── NotFound            not_found          404
     ├── StateError          wrong_state        409
     ├── JobCancelled        cancelled          409  (a server-side job ended because the server is stopping)
     ├── Forbidden           forbidden          403
     │    └── CsrfRefused    csrf               403  (a console session's write without its X-CSRF-Token)
     ├── PayloadTooLarge     payload_too_large  413
     │    └── ImageTooLarge  image_too_large    413  (an OCI image exceeds a pull limit: layers, bytes)
     ├── QuotaExceeded       rate_limited       429  (the request rate: retry after ``Retry-After``)
     ├── WorkspaceQuotaExceeded quota_exceeded  429  (a workspace limit: no ``Retry-After``, nothing created)
     ├── HostUnavailable     capacity           503
     ├── SandboxTimeout      timeout            504
     ├── VmmError            vmm_error          500  (QEMU / QMP failures)
     ├── GuestError          guest_error        500  (the guest agent failed or vanished)
     ├── ImageBuildError     image_build_failed 500
     ├── ImagePullFailed     image_pull_failed  502  (a registry or image source failed or refused)
     │    └── ImageDigestMismatch image_digest_mismatch 502  (a blob is not what its digest says)
     ├── SecretUnreadable    secret_unreadable  500  (a sealed secret at rest: wrong key, or tampered)
     ├── PortUnreachable     port_unreachable   502  (nothing accepted the proxy's connection to a sandbox port)
     └── StoreError          store_error        502  (the object store failed)
          ├── ObjectNotFound     object_not_found   502  (a key the platform needs is missing)
          ├── StoreThrottled     store_throttled    503  (the store said slow down, retries exhausted)
          ├── ChunkFetchFailed   chunk_fetch_failed 502  (a memory chunk could not be fetched in time)
          └── IntegrityError     store_integrity    502  (a fetched object does not match its pinned sha256)

Foreign exceptions are translated at one boundary per layer and re-raised ``from`` the original.
"""

from __future__ import annotations

from typing import Any, ClassVar


class CryoboxError(Exception):
    """Root of every error cryobox raises on purpose."""

    code: ClassVar[str] = "internal"
    http_status: ClassVar[int] = 500

    def __init__(self, message: str, *, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = dict(details or {})

    def to_wire(self) -> dict[str, Any]:
        return {"error": self.message, "code": self.code, "details": self.details}


class InvalidArgument(CryoboxError):
    code = "invalid_argument"
    http_status = 400


class Unauthorized(CryoboxError):
    code = "unauthorized"
    http_status = 401


class NotFound(CryoboxError):
    code = "not_found"
    http_status = 404


class StateError(CryoboxError):
    """An operation was asked of an object in a state that does not allow it."""

    code = "wrong_state"
    http_status = 409

    def __init__(self, message: str, *, state: str = "", required: str = "", **kw: Any) -> None:
        details = dict(kw.pop("details", None) or {})
        # explicit arguments win; otherwise keep what came over the wire in ``details``
        state = state or str(details.get("state", ""))
        required = required or str(details.get("required", ""))
        details.update({"state": state, "required": required})
        super().__init__(message, details=details)
        self.state = state
        self.required = required


class JobCancelled(CryoboxError):
    """A server-side job (a bisect) was cancelled, or could not start, because the server is stopping."""

    code = "cancelled"
    http_status = 409


class Forbidden(CryoboxError):
    """The key is valid but this host's operator does not allow what it asked (e.g. a package outside the
    template build allowlist); nothing was changed."""

    code = "forbidden"
    http_status = 403


class CsrfRefused(Forbidden):
    """A request authenticated by the console's session cookie changes something without the session's
    ``X-CSRF-Token`` header (or with another value); nothing was changed."""

    code = "csrf"


class PayloadTooLarge(CryoboxError):
    code = "payload_too_large"
    http_status = 413


class QuotaExceeded(CryoboxError):
    """Rate limited: retry after ``retry_after_s``."""

    code = "rate_limited"
    http_status = 429

    def __init__(self, message: str, *, retry_after_s: float = 1.0, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retry_after_s = retry_after_s


class WorkspaceQuotaExceeded(CryoboxError):
    """A workspace limit (sandboxes, vCPUs, memory, snapshot bytes, custom templates) would be exceeded; nothing
    was created. Waiting does not help (no ``Retry-After``): delete something or raise the limit. ``details``:
    ``{resource, limit, used, requested}``."""

    code = "quota_exceeded"
    http_status = 429


class BuildQueueFull(QuotaExceeded):
    """Template builds are bounded per host: this many wait already. Nothing was created; retry later."""

    code = "build_queue_full"


class HostUnavailable(CryoboxError):
    """Capacity refusal: nothing was created; retry after ``retry_after_s``."""

    code = "capacity"
    http_status = 503

    def __init__(self, message: str, *, retry_after_s: float = 1.0, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retry_after_s = retry_after_s


class SandboxTimeout(CryoboxError):
    code = "timeout"
    http_status = 504


class VmmError(CryoboxError):
    code = "vmm_error"


class GuestError(CryoboxError):
    """The sandbox's guest failed to do what was asked (its agent, interpreter or kernel broke or did not answer):
    the tenant's machine is the failing upstream, so a 502, never the 500 of a cryobox bug."""

    code = "guest_error"
    http_status = 502


class ResumeHookFailed(GuestError):
    """A resume hook of the guest's own (``/etc/cryobox/resume.d``) failed: the sandbox did not become ready."""

    code = "resume_hook_failed"
    http_status = 424


class ImageBuildError(CryoboxError):
    code = "image_build_failed"


class ImageTooLarge(PayloadTooLarge):
    """An OCI image exceeds one of the host's pull limits (layer count, a layer's compressed or uncompressed size,
    the image's total). Nothing of it is kept. ``details``: ``{limit, max}`` (the limit's name and value)."""

    code = "image_too_large"


class ImagePullFailed(CryoboxError):
    """An OCI image could not be pulled or loaded: the registry is unreachable, refused the credentials, answered
    with an error, or the image (or local archive) is malformed or has no ``linux/amd64`` variant."""

    code = "image_pull_failed"
    http_status = 502


class ImageDigestMismatch(ImagePullFailed):
    """A blob (manifest, config or layer) does not hash to the digest that names it; the partial file is gone.
    ``details``: ``{expected, actual}``."""

    code = "image_digest_mismatch"


class SecretUnreadable(CryoboxError):
    """A secret sealed at rest (a sandbox's ``env`` in the registry or in an agent's record) cannot be opened: it
    was sealed with another key than the one configured (``CRYOBOX_SECRET_KEY`` or the key file), or it was
    tampered with. Never answered with an empty value instead; restore the key that sealed it."""

    code = "secret_unreadable"


class PortUnreachable(CryoboxError):
    """The port proxy could not reach a sandbox's port: nothing accepted the connection (refused, nothing
    listening, or the connect timed out) or it closed before answering. Its message names the port and says
    "port is not open" (the phrase the E2B SDK recognises); ``details: {port}``."""

    code = "port_unreachable"
    http_status = 502


class StoreError(CryoboxError):
    """The object store failed (unreachable, refused, or answered with an error)."""

    code = "store_error"
    http_status = 502


class ObjectNotFound(StoreError):
    """A key the platform needs is not in the object store."""

    code = "object_not_found"


class StoreThrottled(StoreError):
    """The object store kept answering "slow down" (HTTP 503/429) until the retries ran out."""

    code = "store_throttled"
    http_status = 503


class ChunkFetchFailed(StoreError):
    """A memory chunk could not be fetched (and verified) within its retries and deadline."""

    code = "chunk_fetch_failed"


class IntegrityError(StoreError):
    """An object fetched from the store is not what its manifest pinned (size or sha256), or the manifest pins
    nothing for it. Nothing was installed: the partial download is gone. Retrying fetches the same bytes; the
    stored object (or the manifest) must be republished."""

    code = "store_integrity"


ERRORS_BY_CODE: dict[str, type[CryoboxError]] = {
    cls.code: cls
    for cls in (
        CryoboxError,
        InvalidArgument,
        Unauthorized,
        NotFound,
        JobCancelled,  # before StateError: a bare 409 (no code) still maps to StateError
        StateError,
        CsrfRefused,  # before Forbidden: a bare 403 still maps to Forbidden
        Forbidden,
        ImageTooLarge,  # before PayloadTooLarge: a bare 413 (no code) still maps to PayloadTooLarge
        PayloadTooLarge,
        WorkspaceQuotaExceeded,  # before QuotaExceeded: a bare 429 (no code) still maps to QuotaExceeded
        BuildQueueFull,
        QuotaExceeded,
        HostUnavailable,
        SandboxTimeout,
        VmmError,
        GuestError,
        ResumeHookFailed,
        ImageBuildError,
        ImagePullFailed,
        ImageDigestMismatch,
        SecretUnreadable,
        StoreError,
        ObjectNotFound,
        StoreThrottled,
        ChunkFetchFailed,
        IntegrityError,
    )
}


class TemplateBuildFailed(CryoboxError):
    """A template build from a Dockerfile or an image ended in failure (raised by the SDK when it waits for one,
    and the code of a build log stream's ``error`` event; never an HTTP status): ``step`` is where it stopped
    (``base``, ``1``.., ``finalize``), ``line`` and ``instruction`` the Dockerfile's, ``log_tail`` its last lines."""

    code = "build_failed"
    http_status = 200

    def __init__(
        self,
        message: str,
        *,
        build_id: str,
        template: str,
        step: str | None = None,
        line: int | None = None,
        instruction: str | None = None,
        log_tail: tuple[str, ...] = (),
    ) -> None:
        details = {"build_id": build_id, "template": template, "step": step, "line": line, "instruction": instruction}
        super().__init__(message, details=details)
        self.build_id, self.template = build_id, template
        self.step, self.line, self.instruction = step, line, instruction
        self.log_tail = log_tail


class CommandFailed(CryoboxError):
    """``exec(..., check=True)`` saw a non-zero exit code (raised by the SDK, never sent on the wire)."""

    code = "command_failed"
    http_status = 200

    def __init__(self, message: str, *, exit_code: int, stdout: str, stderr: str) -> None:
        super().__init__(message, details={"exit_code": exit_code})
        self.exit_code = exit_code
        self.stdout = stdout
        self.stderr = stderr
