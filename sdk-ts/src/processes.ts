/**
 * `sbx.processes`: background processes in a sandbox's guest. A process runs until it exits or is signalled,
 * whatever happens to the objects and streams that follow it: `stream()` and `wait()` replay what it printed so
 * far, then follow it live; leaving either only detaches.
 */
import { CryoboxError, GuestError, InvalidArgument, NotFound } from "./errors.js";
import { type CallOptions, execTimeoutMs, sandboxPath } from "./http.js";
import type { SandboxRef } from "./filesystem.js";
import { type OutputHandlers, outputEvents } from "./streams.js";
import type { ProcessEvent, ProcessInfo, ProcessResult } from "./types.js";

export interface StartOptions extends CallOptions {
  env?: Record<string, string>;
  cwd?: string;
  /** Names it for `list()`. */
  tag?: string;
  /** Keep its stdin open for `sendStdin` (otherwise it reads /dev/null). */
  stdin?: boolean;
  /** Run it on a terminal of this size (its output is then `pty` data). */
  pty?: { cols: number; rows: number };
}

function encodeBase64(data: Uint8Array): string {
  let binary = "";
  for (let i = 0; i < data.length; i += 0x8000) {
    binary += String.fromCharCode(...data.subarray(i, i + 0x8000));
  }
  return btoa(binary);
}

const SIGNALS: Record<string, number> = {
  HUP: 1, INT: 2, QUIT: 3, KILL: 9, USR1: 10, USR2: 12, TERM: 15, CONT: 18, STOP: 19, TSTP: 20,
};

function signalNumber(sig: number | string): number {
  if (typeof sig === "number") {
    if (Number.isInteger(sig) && sig >= 1 && sig <= 64) return sig;
  } else {
    const name = sig.toUpperCase().replace(/^SIG/, "");
    const number = SIGNALS[name];
    if (number !== undefined) return number;
  }
  throw new InvalidArgument(`invalid signal ${JSON.stringify(sig)}`);
}

/** One background process (by `pid`) of a sandbox. `info` is what the API said when this object was made. */
export class Process {
  constructor(
    private readonly sbx: SandboxRef,
    readonly info: ProcessInfo,
  ) {}

  get pid(): number {
    return this.info.pid;
  }

  private path(suffix = ""): string {
    return sandboxPath(this.sbx.id, `/processes/${this.pid}${suffix}`);
  }

  /** Its output, from what it printed so far to its live output, then one `exit` event (`-1`: a signal ended
   * it); `pty` data for a process on a terminal. Leaving the loop (or aborting) only detaches. @throws {NotFound} the guest does not know it (any more). */
  async *stream(options: CallOptions & OutputHandlers = {}): AsyncGenerator<ProcessEvent, void, undefined> {
    const { onStdout, onStderr, ...call } = options;
    const { body, done } = await this.sbx.http.stream({ method: "GET", path: this.path("/stream"), ...call });
    yield* outputEvents(body, done, { onStdout, onStderr }, () => new GuestError(
      `the stream of process ${this.pid} ended before the process reported an exit code`,
    ));
  }

  /** Wait for it to end: its exit code, status and everything it printed.
   * @throws {SandboxTimeout} it still runs after `timeoutSeconds` (it keeps running). */
  async wait(options: CallOptions & { timeoutSeconds?: number } = {}): Promise<ProcessResult> {
    const { timeoutSeconds, ...call } = options;
    return this.sbx.http.json<ProcessResult>({
      method: "POST",
      path: this.path("/wait"),
      query: { timeout_seconds: timeoutSeconds },
      timeoutMs: execTimeoutMs(this.sbx.http.config.timeoutMs, timeoutSeconds ?? null),
      ...call,
    });
  }

  /** Write to its stdin (or terminal); text is UTF-8 encoded. */
  async sendStdin(data: string | Uint8Array, options: CallOptions = {}): Promise<void> {
    const bytes = typeof data === "string" ? new TextEncoder().encode(data) : data;
    await this.sbx.http.empty({
      method: "POST", path: this.path("/stdin"), json: { eof: false, data_b64: encodeBase64(bytes) }, ...options,
    });
  }

  /** Close its stdin: it reads end of file. */
  async closeStdin(options: CallOptions = {}): Promise<void> {
    await this.sbx.http.empty({ method: "POST", path: this.path("/stdin"), json: { eof: true }, ...options });
  }

  /** Send a signal: a number or a name (`"SIGTERM"`, `"TERM"`, `"KILL"`...). */
  async signal(sig: number | string, options: CallOptions = {}): Promise<void> {
    const number = signalNumber(sig);
    await this.sbx.http.empty({ method: "POST", path: this.path("/signal"), json: { signal: number }, ...options });
  }

  /** SIGKILL it. @throws {NotFound} it has ended. */
  async kill(options: CallOptions = {}): Promise<void> {
    await this.sbx.http.empty({ method: "DELETE", path: this.path(), ...options });
  }
}

export class Processes {
  constructor(private readonly sbx: SandboxRef) {}

  /** Start `cmd` with `/bin/sh -c` in the background; returns once it runs. */
  async start(cmd: string, options: StartOptions = {}): Promise<Process> {
    const { env, cwd, tag, stdin = false, pty, ...call } = options;
    const info = await this.sbx.http.json<ProcessInfo>({
      method: "POST",
      path: sandboxPath(this.sbx.id, "/processes"),
      json: { cmd, env: env ?? {}, stdin, ...(cwd !== undefined ? { cwd } : {}), ...(tag !== undefined ? { tag } : {}),
        ...(pty !== undefined ? { pty } : {}) },
      ...call,
    });
    return new Process(this.sbx, info);
  }

  /** `exec(cmd, { background: true })`: start it; with `stdin` text, write it and close its stdin. */
  async startFed(cmd: string, options: StartOptions & { input?: string | undefined }): Promise<Process> {
    const { input, ...start } = options;
    const process = await this.start(cmd, { ...start, stdin: input !== undefined });
    if (input === undefined) return process;
    try {
      await process.sendStdin(input, { signal: options.signal });
      await process.closeStdin({ signal: options.signal });
    } catch (error) {
      await process.kill().catch((e: unknown) => (e instanceof CryoboxError ? undefined : Promise.reject(e)));
      throw error;
    }
    return process;
  }

  /** The guest's background processes, running ones and recently ended ones. */
  async list(options: CallOptions = {}): Promise<ProcessInfo[]> {
    const path = sandboxPath(this.sbx.id, "/processes");
    return (await this.sbx.http.json<{ items: ProcessInfo[] }>({ method: "GET", path, ...options })).items;
  }

  /** An object for the process `pid`. @throws {NotFound} the guest does not list it. */
  async connect(pid: number, options: CallOptions = {}): Promise<Process> {
    const info = (await this.list(options)).find((item) => item.pid === pid);
    if (info === undefined) throw new NotFound(`no process ${pid} in sandbox ${this.sbx.id}`, { details: { pid } });
    return new Process(this.sbx, info);
  }
}
