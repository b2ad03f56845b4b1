/**
 * One error tree, mirroring the API's (`src/cryobox/errors.py`): every error response is raised as the class of
 * its wire `code` (`{"error", "code", "details"}`), a body without a known code by its HTTP status where that is
 * unambiguous, else as a plain {@link CryoboxError}. Aborts and timeouts of a call are not translated: they are
 * the platform's `AbortError` / `TimeoutError` (a `DOMException`), as with `fetch` itself.
 */

export type Details = Record<string, unknown>;

export interface ErrorInit {
  details?: Details;
  /** The HTTP status of the response this error came from (absent for errors raised without one). */
  status?: number;
  cause?: unknown;
}

/** Root of every error cryobox raises on purpose (`code` `internal`, HTTP 500). */
export class CryoboxError extends Error {
  static readonly code: string = "internal";
  static readonly httpStatus: number = 500;
  /** The wire code of this error (`not_found`, `wrong_state`, ...). */
  readonly code: string;
  readonly details: Details;
  readonly status: number | undefined;

  constructor(message: string, init: ErrorInit = {}) {
    super(message, init.cause === undefined ? undefined : { cause: init.cause });
    const ctor = new.target as unknown as { code: string; name: string };
    this.name = ctor.name;
    this.code = ctor.code;
    this.details = { ...(init.details ?? {}) };
    this.status = init.status;
  }
}

export class InvalidArgument extends CryoboxError {
  static override readonly code: string = "invalid_argument";
  static override readonly httpStatus: number = 400;
}

export class Unauthorized extends CryoboxError {
  static override readonly code: string = "unauthorized";
  static override readonly httpStatus: number = 401;
}

export class NotFound extends CryoboxError {
  static override readonly code: string = "not_found";
  static override readonly httpStatus: number = 404;
}

/** An operation was asked of an object in a state that does not allow it (`details.state`, `details.required`). */
export class StateError extends CryoboxError {
  static override readonly code: string = "wrong_state";
  static override readonly httpStatus: number = 409;
  get state(): string {
    return String(this.details["state"] ?? "");
  }
  get required(): string {
    return String(this.details["required"] ?? "");
  }
}

/** A server-side job was cancelled, or could not start, because the server is stopping. */
export class JobCancelled extends CryoboxError {
  static override readonly code: string = "cancelled";
  static override readonly httpStatus: number = 409;
}

export class Forbidden extends CryoboxError {
  static override readonly code: string = "forbidden";
  static override readonly httpStatus: number = 403;
}

export class CsrfRefused extends Forbidden {
  static override readonly code: string = "csrf";
}

export class PayloadTooLarge extends CryoboxError {
  static override readonly code: string = "payload_too_large";
  static override readonly httpStatus: number = 413;
}

export class ImageTooLarge extends PayloadTooLarge {
  static override readonly code: string = "image_too_large";
}

/** Rate limited: retry after `retryAfterS` (the SDK already retried within its budget). */
export class QuotaExceeded extends CryoboxError {
  static override readonly code: string = "rate_limited";
  static override readonly httpStatus: number = 429;
  retryAfterS = 1;
}

/** A workspace limit would be exceeded; nothing was created and waiting does not help. */
export class WorkspaceQuotaExceeded extends CryoboxError {
  static override readonly code: string = "quota_exceeded";
  static override readonly httpStatus: number = 429;
}

export class BuildQueueFull extends QuotaExceeded {
  static override readonly code: string = "build_queue_full";
}

/** Capacity refusal (or the API could not be reached): nothing was created; retry after `retryAfterS`. */
export class HostUnavailable extends CryoboxError {
  static override readonly code: string = "capacity";
  static override readonly httpStatus: number = 503;
  retryAfterS = 1;
}

/** A command (or a wait) ran past its `timeoutSeconds`. */
export class SandboxTimeout extends CryoboxError {
  static override readonly code: string = "timeout";
  static override readonly httpStatus: number = 504;
}

export class VmmError extends CryoboxError {
  static override readonly code: string = "vmm_error";
}

/** The sandbox's guest failed to do what was asked: the tenant's machine is the failing upstream (a 502). */
export class GuestError extends CryoboxError {
  static override readonly code: string = "guest_error";
  static override readonly httpStatus: number = 502;
}

export class ResumeHookFailed extends GuestError {
  static override readonly code: string = "resume_hook_failed";
  static override readonly httpStatus: number = 424;
}

export class ImageBuildError extends CryoboxError {
  static override readonly code: string = "image_build_failed";
}

export class ImagePullFailed extends CryoboxError {
  static override readonly code: string = "image_pull_failed";
  static override readonly httpStatus: number = 502;
}

export class ImageDigestMismatch extends ImagePullFailed {
  static override readonly code: string = "image_digest_mismatch";
}

export class SecretUnreadable extends CryoboxError {
  static override readonly code: string = "secret_unreadable";
}

export class PortUnreachable extends CryoboxError {
  static override readonly code: string = "port_unreachable";
  static override readonly httpStatus: number = 502;
}

export class StoreError extends CryoboxError {
  static override readonly code: string = "store_error";
  static override readonly httpStatus: number = 502;
}

export class ObjectNotFound extends StoreError {
  static override readonly code: string = "object_not_found";
}

export class StoreThrottled extends StoreError {
  static override readonly code: string = "store_throttled";
  static override readonly httpStatus: number = 503;
}

export class ChunkFetchFailed extends StoreError {
  static override readonly code: string = "chunk_fetch_failed";
}

export class IntegrityError extends StoreError {
  static override readonly code: string = "store_integrity";
}

/** A template build failed (raised by `Build.wait()`; never an HTTP status). */
export class TemplateBuildFailed extends CryoboxError {
  static override readonly code: string = "build_failed";
  static override readonly httpStatus: number = 200;
  logTail: string[] = [];
}

/** `exec(cmd, { check: true })` saw a non-zero exit code (raised by the SDK, never sent on the wire). */
export class CommandFailed extends CryoboxError {
  static override readonly code: string = "command_failed";
  static override readonly httpStatus: number = 200;
  constructor(
    message: string,
    readonly exitCode: number,
    readonly stdout: string,
    readonly stderr: string,
  ) {
    super(message, { details: { exit_code: exitCode } });
  }
}

type ErrorClass = (new (message: string, init?: ErrorInit) => CryoboxError) & { code: string; httpStatus: number };

const WIRE_CLASSES: ErrorClass[] = [
  CryoboxError,
  InvalidArgument,
  Unauthorized,
  NotFound,
  JobCancelled,
  StateError,
  CsrfRefused,
  Forbidden,
  ImageTooLarge,
  PayloadTooLarge,
  WorkspaceQuotaExceeded,
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
  PortUnreachable,
  StoreError,
  ObjectNotFound,
  StoreThrottled,
  ChunkFetchFailed,
  IntegrityError,
];

/** Every error class the API sends, by its wire code. */
export const ERRORS_BY_CODE: ReadonlyMap<string, ErrorClass> = new Map(WIRE_CLASSES.map((cls) => [cls.code, cls]));

// for bodies without a known code (a proxy's page, say): only the statuses the Python SDK maps too
// (a bare 502 is ambiguous: the guest, a port, the store, an image registry; a store's 503 is never guessed either)
const BY_STATUS: ReadonlyMap<number, ErrorClass> = new Map<number, ErrorClass>(
  [
    InvalidArgument,
    Unauthorized,
    Forbidden,
    NotFound,
    StateError,
    PayloadTooLarge,
    QuotaExceeded,
    HostUnavailable,
    SandboxTimeout,
    ResumeHookFailed,
  ].map((cls) => [cls.httpStatus, cls]),
);

/** The error a wire body (`{"error", "code", "details"}`) stands for; `status` is the HTTP status, if any. */
export function errorFromBody(body: unknown, status?: number, retryAfterS?: number): CryoboxError {
  const object = body !== null && typeof body === "object" && !Array.isArray(body) ? (body as Details) : {};
  const raw = object["error"];
  const message = typeof raw === "string" && raw ? raw : status !== undefined ? `HTTP ${status}` : "request failed";
  const rawDetails = object["details"];
  const details =
    rawDetails !== null && typeof rawDetails === "object" && !Array.isArray(rawDetails) ? (rawDetails as Details) : {};
  const code = typeof object["code"] === "string" ? object["code"] : "";
  const cls =
    ERRORS_BY_CODE.get(code) ?? (status !== undefined ? (BY_STATUS.get(status) ?? CryoboxError) : CryoboxError);
  const error = new cls(message, { details, ...(status !== undefined ? { status } : {}) });
  if (error instanceof QuotaExceeded || error instanceof HostUnavailable) {
    error.retryAfterS = retryAfterS ?? 1;
  }
  return error;
}
