/**
 * Terminals over WebSocket (`GET /v1/sandboxes/{id}/pty`). The socket authenticates with a single-use ticket
 * (`POST .../pty/tickets`, sent with the API key), so any WebSocket works: the global one of Node >= 22, Deno,
 * Bun and browsers; on Node 18/20 pass `webSocket` (the `ws` package's, or Node 20's with
 * `--experimental-websocket`) in the client options.
 *
 * Server to client: binary = terminal output; text = JSON `{"session"}` (first), `{"exit_code"}` (last) or
 * `{"error", "code"}`. Client to server: binary = input; text `{"resize": [cols, rows]}`.
 */
import { CryoboxError, errorFromBody } from "./errors.js";
import { type CallOptions, sandboxPath } from "./http.js";
import type { SandboxRef } from "./filesystem.js";

export interface PtyOptions extends CallOptions {
  cols?: number;
  rows?: number;
  /** The program (default: a login shell). */
  cmd?: string;
  /** Terminal output as it arrives. */
  onData?: (data: Uint8Array) => unknown;
}

/** One open terminal. */
export class Pty {
  /** Resolves with the program's exit code, or `undefined` when the socket closed without one. */
  readonly exited: Promise<number | undefined>;

  constructor(
    private readonly ws: WebSocket,
    readonly session: string,
    exited: Promise<number | undefined>,
  ) {
    this.exited = exited;
  }

  /** Send input (text is UTF-8 encoded). */
  write(data: string | Uint8Array): void {
    this.ws.send(typeof data === "string" ? new TextEncoder().encode(data) : data);
  }

  resize(cols: number, rows: number): void {
    this.ws.send(JSON.stringify({ resize: [cols, rows] }));
  }

  /** Hang the terminal up (its program gets SIGHUP). */
  close(): void {
    this.ws.close(1000);
  }
}

/** Open a terminal in the sandbox; resolves once the session runs. */
export async function openPty(sbx: SandboxRef, options: PtyOptions = {}): Promise<Pty> {
  const { cols = 80, rows = 24, cmd, onData, signal, ...call } = options;
  const WebSocketImpl = sbx.http.config.webSocket;
  if (WebSocketImpl === undefined) {
    throw new CryoboxError(
      "no WebSocket on this platform (Node < 22): pass options.webSocket (e.g. the `ws` package's WebSocket)",
    );
  }
  const ticket = await sbx.http.json<{ ticket: string }>({
    method: "POST", path: sandboxPath(sbx.id, "/pty/tickets"), signal, ...call,
  });
  const url = new URL(sbx.http.url(sandboxPath(sbx.id, "/pty"), { ticket: ticket.ticket, cols, rows, cmd }));
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  const ws = new WebSocketImpl(url);
  ws.binaryType = "arraybuffer";
  let exitCode: number | undefined;
  let failure: Error | undefined;
  let opened: (session: string) => void = () => undefined;
  let refused: (error: Error) => void = () => undefined;
  const session = new Promise<string>((resolve, reject) => {
    opened = resolve;
    refused = reject;
  });
  const exited = new Promise<number | undefined>((resolve, reject) => {
    ws.addEventListener("close", (event) => {
      const error = failure ?? new CryoboxError(`the terminal closed before it started (code ${event.code})`);
      refused(error);
      if (failure !== undefined) reject(failure);
      else resolve(exitCode);
    });
  });
  exited.catch(() => undefined); // observed through `session` when it fails before starting
  ws.addEventListener("message", (event: MessageEvent) => {
    if (typeof event.data !== "string") {
      onData?.(new Uint8Array(event.data as ArrayBuffer));
      return;
    }
    let message: Record<string, unknown>;
    try {
      message = JSON.parse(event.data) as Record<string, unknown>;
    } catch {
      return;
    }
    if (typeof message["session"] === "string") opened(message["session"]);
    else if (typeof message["exit_code"] === "number") exitCode = message["exit_code"];
    else if (typeof message["error"] === "string") failure = errorFromBody(message);
  });
  ws.addEventListener("error", () => {
    failure ??= new CryoboxError(`the terminal's WebSocket to ${url.host} failed`);
  });
  const onAbort = (): void => ws.close(1000);
  signal?.addEventListener("abort", onAbort, { once: true });
  void exited.finally(() => signal?.removeEventListener("abort", onAbort)).catch(() => undefined);
  return new Pty(ws, await session, exited);
}
