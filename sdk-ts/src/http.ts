/**
 * The SDK's single boundary to `fetch`: configuration, the API key, per-call timeouts and `AbortSignal`s, error
 * mapping ({@link errorFromBody}) and retries of the API's refusals (429 / 503 with `Retry-After`, which by the
 * API's contract were sent before anything changed) with jittered backoff. Runs wherever `fetch` does
 * (Node >= 18, Deno, Bun, browsers).
 */
import { CryoboxError, HostUnavailable, errorFromBody } from "./errors.js";

export const DEFAULT_URL = "http://127.0.0.1:8080";
/** An exec's deadline is at least the command's own timeout plus this margin (as in the Python SDK). */
export const EXEC_MARGIN_MS = 30_000;

/** How the client retries refusals. Inject `sleep`, `random` and `now` in tests. */
export interface RetryPolicy {
  /** Total time (from the first attempt) retries may take; 0 disables retrying. */
  budgetMs: number;
  /** The random jitter added to `Retry-After` starts at up to this and doubles per retry... */
  baseJitterMs: number;
  /** ...up to this. */
  maxJitterMs: number;
  sleep: (ms: number, signal?: AbortSignal) => Promise<void>;
  /** A number in [0, 1). */
  random: () => number;
  /** Milliseconds on a monotonic clock. */
  now: () => number;
}

/** `setTimeout` as a promise that rejects with the signal's reason when it is aborted. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

export const DEFAULT_RETRY: RetryPolicy = {
  budgetMs: 60_000,
  baseJitterMs: 1_000,
  maxJitterMs: 15_000,
  sleep,
  random: Math.random,
  now: () => performance.now(),
};

/** A `WebSocket` constructor (the global one where the platform has it: Node >= 22, Deno, Bun, browsers). */
export type WebSocketConstructor = new (url: string | URL, protocols?: string | string[]) => WebSocket;

/** Where the API is and how to talk to it; every SDK entry point takes these. */
export interface ClientOptions {
  /** Default: `$CRYOBOX_API_URL`, else `http://127.0.0.1:8080`. */
  apiUrl?: string;
  /** Default: `$CRYOBOX_API_KEY`. */
  apiKey?: string;
  /** Deadline of one call (until its whole answer is read; a stream's until its headers). Default 300 s. */
  timeoutMs?: number;
  /** Overrides of {@link DEFAULT_RETRY}. */
  retry?: Partial<RetryPolicy>;
  /** The `fetch` to use (default: the global one). */
  fetch?: typeof fetch;
  /** The `WebSocket` constructor for terminals (default: the global one). */
  webSocket?: WebSocketConstructor;
  /** Extra headers sent with every request. */
  headers?: Record<string, string>;
}

/** What every call takes besides its own arguments. */
export interface CallOptions {
  /** Cancels the call (a stream: stops reading it and releases the connection). */
  signal?: AbortSignal;
  /** This call's deadline, instead of the client's `timeoutMs`. */
  timeoutMs?: number;
}

function env(name: string): string | undefined {
  try {
    const value = (globalThis as { process?: { env?: Record<string, string | undefined> } }).process?.env?.[name];
    if (value !== undefined) return value;
    const deno = (globalThis as { Deno?: { env: { get(name: string): string | undefined } } }).Deno;
    return deno?.env.get(name);
  } catch {
    return undefined; // Deno without --allow-env
  }
}

export interface ResolvedConfig {
  apiUrl: string;
  apiKey: string;
  timeoutMs: number;
  retry: RetryPolicy;
  fetch: typeof fetch;
  webSocket: WebSocketConstructor | undefined;
  headers: Record<string, string>;
}

/** Argument, else environment, else default. */
export function resolveConfig(options: ClientOptions = {}): ResolvedConfig {
  const apiUrl = (options.apiUrl || env("CRYOBOX_API_URL") || DEFAULT_URL).replace(/\/+$/, "");
  const fetchImpl = options.fetch ?? globalThis.fetch;
  if (typeof fetchImpl !== "function") {
    throw new CryoboxError("no fetch: this platform has no global fetch (Node >= 18 has one); pass options.fetch");
  }
  return {
    apiUrl,
    apiKey: options.apiKey || env("CRYOBOX_API_KEY") || "",
    timeoutMs: options.timeoutMs ?? 300_000,
    retry: { ...DEFAULT_RETRY, ...options.retry },
    fetch: fetchImpl,
    webSocket: options.webSocket ?? (globalThis as { WebSocket?: WebSocketConstructor }).WebSocket,
    headers: { ...options.headers },
  };
}

/** `Retry-After` in milliseconds (delta-seconds or an HTTP date); `undefined` when absent or unparseable. */
export function parseRetryAfter(value: string | null, nowMs: number = Date.now()): number | undefined {
  if (value === null || !value.trim()) return undefined;
  const trimmed = value.trim();
  if (/^\d+(\.\d+)?$/.test(trimmed)) return Number(trimmed) * 1000;
  const when = Date.parse(trimmed);
  if (Number.isNaN(when)) return undefined;
  return Math.max(0, when - nowMs);
}

/** The random jitter cap of the `retriesDone + 1`-th wait: 1, 2, 4, 8, 15, 15... seconds by default. */
export function jitterCap(policy: RetryPolicy, retriesDone: number): number {
  return Math.min(policy.baseJitterMs * 2 ** Math.min(retriesDone, 32), policy.maxJitterMs);
}

/** What a request body may be (`fetch`'s `BodyInit`, which Node's types do not name globally). */
export type BodyInit = NonNullable<RequestInit["body"]>;

type Query = Record<string, string | number | boolean | undefined | null>;

export interface RequestSpec extends CallOptions {
  method: string;
  path: string;
  query?: Query;
  /** Sent as JSON. */
  json?: unknown;
  /** Sent as is (bytes, text, a form, or a stream: a stream is sent once, never retried). */
  body?: BodyInit;
  headers?: Record<string, string>;
  /** Keep the deadline only until the headers arrive (a stream the caller reads for as long as it lasts). */
  stream?: boolean;
}

/** A successful response and the cleanup of its deadline (call `done()` once its body is read or abandoned). */
export interface Answer {
  response: Response;
  done: () => void;
}

/** Signals combined by hand (`AbortSignal.any` is Node >= 20.3); `release()` detaches the listeners. */
function combine(signals: (AbortSignal | undefined)[]): { signal: AbortSignal; release: () => void } {
  const controller = new AbortController();
  const detach: (() => void)[] = [];
  for (const signal of signals) {
    if (signal === undefined) continue;
    if (signal.aborted) {
      controller.abort(signal.reason);
      break;
    }
    const onAbort = (): void => controller.abort(signal.reason);
    signal.addEventListener("abort", onAbort, { once: true });
    detach.push(() => signal.removeEventListener("abort", onAbort));
  }
  return { signal: controller.signal, release: () => detach.forEach((fn) => fn()) };
}

const CONNECT_FAILURES = new Set([
  "ECONNREFUSED",
  "ENOTFOUND",
  "EAI_AGAIN",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "UND_ERR_CONNECT_TIMEOUT",
]);

/** Only a failure to connect (nothing was sent) is a {@link HostUnavailable}; anything else may have had effects. */
function transportError(error: unknown, apiUrl: string): Error {
  if (error instanceof DOMException && (error.name === "AbortError" || error.name === "TimeoutError")) {
    return error;
  }
  const cause = (error as { cause?: { code?: unknown } } | null)?.cause;
  const code = typeof cause?.code === "string" ? cause.code : "";
  const text = error instanceof Error ? `${error.message}${code ? ` (${code})` : ""}` : String(error);
  if (CONNECT_FAILURES.has(code)) {
    return new HostUnavailable(`cannot reach the cryobox API at ${apiUrl}: ${text}`, { cause: error });
  }
  return new CryoboxError(`request to the cryobox API at ${apiUrl} failed: ${text}`, { cause: error });
}

async function readJson(response: Response): Promise<unknown> {
  const text = await response.text();
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return undefined;
  }
}

/** One API endpoint: sends requests with the key, deadlines, retries and error mapping. */
export class Http {
  readonly config: ResolvedConfig;

  constructor(config: ResolvedConfig) {
    this.config = config;
  }

  static from(options: ClientOptions = {}): Http {
    return new Http(resolveConfig(options));
  }

  url(path: string, query?: Query): string {
    const url = new URL(this.config.apiUrl + path);
    for (const [key, value] of Object.entries(query ?? {})) {
      if (value !== undefined && value !== null) url.searchParams.set(key, String(value));
    }
    return url.toString();
  }

  /** Send `spec` and return its successful response: refusals are retried, errors raised as their classes. */
  async send(spec: RequestSpec): Promise<Answer> {
    const { retry } = this.config;
    const started = retry.now();
    const replayable = !(spec.body instanceof ReadableStream);
    for (let retries = 0; ; retries++) {
      const timeoutMs = spec.timeoutMs ?? this.config.timeoutMs;
      const deadline = new AbortController();
      const timer = setTimeout(
        () => deadline.abort(new DOMException(`${spec.method} ${spec.path} took more than ${timeoutMs} ms`, "TimeoutError")),
        timeoutMs,
      );
      const { signal, release } = combine([spec.signal, deadline.signal]);
      const done = (): void => {
        clearTimeout(timer);
        release();
      };
      let response: Response;
      try {
        response = await this.config.fetch(this.url(spec.path, spec.query), this.init(spec, signal));
      } catch (error) {
        done();
        throw transportError(error, this.config.apiUrl);
      }
      if (response.ok) {
        if (spec.stream) {
          clearTimeout(timer); // the caller reads it as long as it lasts; its own signal still applies
        }
        return { response, done };
      }
      let body: unknown;
      try {
        body = await readJson(response);
      } finally {
        done();
      }
      const retryAfter = parseRetryAfter(response.headers.get("retry-after"));
      const error = errorFromBody(body, response.status, retryAfter === undefined ? undefined : retryAfter / 1000);
      const delay = replayable ? this.retryDelay(response.status, body, retryAfter, retries, started) : undefined;
      if (delay === undefined) throw error;
      await retry.sleep(delay, spec.signal);
    }
  }

  /** The wait before the next attempt, or `undefined`: raise this refusal. */
  private retryDelay(
    status: number,
    body: unknown,
    retryAfterMs: number | undefined,
    retriesDone: number,
    started: number,
  ): number | undefined {
    const policy = this.config.retry;
    if (policy.budgetMs <= 0 || retryAfterMs === undefined) return undefined;
    const code = (body as { code?: unknown } | undefined)?.code;
    const message = (body as { error?: unknown } | undefined)?.error;
    // 429 rate_limited (not a workspace quota: waiting does not help); 503 only as cryobox sends it (a JSON
    // refusal, not a proxy's bare page)
    const retryable =
      (status === 429 && code !== "quota_exceeded") || (status === 503 && typeof message === "string" && !!message);
    if (!retryable) return undefined;
    const delay = retryAfterMs + policy.random() * jitterCap(policy, retriesDone);
    const remaining = policy.budgetMs - (policy.now() - started);
    return delay > remaining ? undefined : delay;
  }

  private init(spec: RequestSpec, signal: AbortSignal): RequestInit {
    const headers: Record<string, string> = { "User-Agent": "cryobox-typescript", ...this.config.headers };
    if (this.config.apiKey) headers["Authorization"] = `Bearer ${this.config.apiKey}`;
    let body: BodyInit | undefined = spec.body;
    if (spec.json !== undefined) {
      headers["Content-Type"] = "application/json";
      body = JSON.stringify(spec.json);
    }
    Object.assign(headers, spec.headers);
    const init: RequestInit & { duplex?: "half" } = { method: spec.method, headers, signal };
    if (body !== undefined) init.body = body;
    if (body instanceof ReadableStream) init.duplex = "half"; // a streamed upload (Node's fetch needs it said)
    return init;
  }

  /** The JSON answer of a call. */
  async json<T>(spec: RequestSpec): Promise<T> {
    const { response, done } = await this.send(spec);
    try {
      const text = await response.text();
      try {
        return JSON.parse(text) as T;
      } catch (error) {
        throw new CryoboxError(
          `unexpected response to ${spec.method} ${spec.path} (HTTP ${response.status}): ${text.slice(0, 200)}`,
          { status: response.status, cause: error },
        );
      }
    } finally {
      done();
    }
  }

  /** A call answered without a body (204), or whose body does not matter. */
  async empty(spec: RequestSpec): Promise<void> {
    const { response, done } = await this.send(spec);
    try {
      await response.arrayBuffer();
    } finally {
      done();
    }
  }

  /** The raw bytes of an answer. */
  async bytes(spec: RequestSpec): Promise<Uint8Array> {
    const { response, done } = await this.send(spec);
    try {
      return new Uint8Array(await response.arrayBuffer());
    } finally {
      done();
    }
  }

  /** A streamed answer's body (the deadline covers the headers, `spec.signal` the whole stream); call `done()`
   * when it is read or abandoned. */
  async stream(spec: RequestSpec): Promise<{ body: ReadableStream<Uint8Array>; done: () => void }> {
    const { response, done } = await this.send({ ...spec, stream: true });
    if (response.body === null) {
      done();
      throw new CryoboxError(`no body in the answer to ${spec.method} ${spec.path}`, { status: response.status });
    }
    return { body: response.body, done };
  }
}

/** `/v1/sandboxes/{id}{suffix}` with the id escaped. */
export function sandboxPath(sandboxId: string, suffix = ""): string {
  return `/v1/sandboxes/${encodeURIComponent(sandboxId)}${suffix}`;
}

/** An exec's deadline: never cut a command short (its own timeout plus a margin, at least the client's). */
export function execTimeoutMs(clientTimeoutMs: number, timeoutSeconds: number | null | undefined): number {
  if (timeoutSeconds === null) return 2_147_483_647; // no limit: setTimeout's maximum (~24.8 days)
  return Math.max(clientTimeoutMs, (timeoutSeconds ?? 60) * 1000 + EXEC_MARGIN_MS);
}
