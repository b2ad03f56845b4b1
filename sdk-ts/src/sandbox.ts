/**
 * `Sandbox`: one sandbox (a QEMU microVM restored from a template or a snapshot). Build it with
 * `Sandbox.create()` or `Sandbox.connect(id)`; `kill()` deletes it.
 *
 *     const sbx = await Sandbox.create({ template: "code-interpreter", ttlSeconds: 600 });
 *     try {
 *       await sbx.files.write("/work/task.py", "print(6 * 7)");
 *       console.log((await sbx.exec("python3 /work/task.py")).stdout); // "42\n"
 *     } finally {
 *       await sbx.kill();
 *     }
 */
import { CodeContexts, type Execution, type RunCodeOptions, runCode } from "./code.js";
import { CommandFailed, GuestError, InvalidArgument, NotFound } from "./errors.js";
import { Filesystem } from "./filesystem.js";
import { type CallOptions, type ClientOptions, Http, execTimeoutMs, sandboxPath } from "./http.js";
import { type Process, Processes } from "./processes.js";
import { type Pty, type PtyOptions, openPty } from "./pty.js";
import { STREAM_ENDED_EARLY, type OutputHandlers, outputEvents } from "./streams.js";
import type {
  Body,
  EgressLog,
  ExecResult,
  ForkTreeError,
  LifecycleInfo,
  NetworkPolicy,
  OnTimeoutAction,
  PromoteResult,
  SandboxInfo,
  SandboxStatus,
  SnapshotInfo,
  StreamEvent,
  VolumeMount,
} from "./types.js";

export interface CreateOptions extends ClientOptions, CallOptions {
  /** Default `code-interpreter`. */
  template?: string;
  ttlSeconds?: number;
  persistent?: boolean;
  metadata?: Record<string, string>;
  env?: Record<string, string>;
  /** The sandbox's network policy (none: the server's default, deny), or the older `{egress, allow}`. */
  network?: Body<"EgressPolicy"> | { egress: "allow" | "deny"; allow?: string[] };
  /** Restore this snapshot instead of a template. */
  fromSnapshot?: string;
  /** What the TTL's expiry does: `kill` (default) or `hibernate`. */
  onTimeout?: OnTimeoutAction;
  /** Whether any request wakes it when hibernated (default true). */
  autoWake?: boolean;
  volumes?: VolumeMount[];
}

export interface ListOptions extends ClientOptions, CallOptions {
  status?: SandboxStatus;
  /** Only sandboxes whose metadata contains these. */
  metadata?: Record<string, string>;
}

export interface ExecOptions extends CallOptions, OutputHandlers {
  /** Kill the command's process group after this (`null`: no limit). Default 60. */
  timeoutSeconds?: number | null;
  env?: Record<string, string>;
  cwd?: string;
  /** Text fed to its stdin. */
  stdin?: string;
  /** Throw {@link CommandFailed} on a non-zero exit code. */
  check?: boolean;
}

/** The children of `forkTree`: restored from one snapshot of the parent, memory and disk. */
export class ForkTree {
  constructor(
    readonly treeId: string,
    readonly parentId: string,
    readonly snapshotId: string,
    readonly children: Sandbox[],
    readonly errors: ForkTreeError[],
  ) {}

  /** Keep `winner`; `cleanupSiblings` (default) deletes the other children. */
  async promote(winner: Sandbox, options: CallOptions & { cleanupSiblings?: boolean } = {}): Promise<PromoteResult> {
    const result = await winner.promote(this.treeId, options);
    for (const child of this.children) {
      if (result.deleted.includes(child.id)) child.info = { ...child.info, status: "stopped" };
    }
    return result;
  }

  /** Kill every child (those already gone are skipped). */
  async killAll(options: CallOptions = {}): Promise<void> {
    await Promise.all(this.children.map((child) => child.kill(options)));
  }
}

function createBody(options: CreateOptions): Record<string, unknown> {
  const body: Record<string, unknown> = {
    template: options.template ?? "code-interpreter",
    persistent: options.persistent ?? false,
    metadata: options.metadata ?? {},
    env: options.env ?? {},
  };
  const optional: [string, unknown][] = [
    ["ttl_seconds", options.ttlSeconds],
    ["from_snapshot", options.fromSnapshot],
    ["network", options.network],
    ["on_timeout", options.onTimeout],
    ["auto_wake", options.autoWake],
    ["volumes", options.volumes],
  ];
  for (const [key, value] of optional) if (value !== undefined) body[key] = value;
  return body;
}

function call(options: CallOptions): CallOptions {
  return { ...(options.signal ? { signal: options.signal } : {}), ...(options.timeoutMs ? { timeoutMs: options.timeoutMs } : {}) };
}

export class Sandbox {
  /** Its files (guest paths). */
  readonly files: Filesystem;
  /** Its background processes. */
  readonly processes: Processes;
  /** Its code interpreter's contexts (template `code-interpreter`). */
  readonly codeContexts: CodeContexts;

  constructor(
    public info: SandboxInfo,
    readonly http: Http,
  ) {
    this.files = new Filesystem(this);
    this.processes = new Processes(this);
    this.codeContexts = new CodeContexts(this);
  }

  get id(): string {
    return this.info.id;
  }

  // --- construction ------------------------------------------------------------------------------------------

  /** Create a sandbox (a snapshot restore of `template`, or of `fromSnapshot`). Capacity refusals and rate
   * limits are retried with jitter within the retry budget.
   * @throws {HostUnavailable} no capacity within the budget. @throws {NotFound} unknown template or snapshot. */
  static async create(options: CreateOptions = {}): Promise<Sandbox> {
    const http = Http.from(options);
    const info = await http.json<SandboxInfo>({ method: "POST", path: "/v1/sandboxes", json: createBody(options), ...call(options) });
    return new Sandbox(info, http);
  }

  /** Attach to an existing sandbox. @throws {NotFound} no such sandbox (or another workspace's). */
  static async connect(sandboxId: string, options: ClientOptions & CallOptions = {}): Promise<Sandbox> {
    const http = Http.from(options);
    return new Sandbox(await http.json<SandboxInfo>({ method: "GET", path: sandboxPath(sandboxId), ...call(options) }), http);
  }

  /** The sandbox record. @throws {NotFound} */
  static async get(sandboxId: string, options: ClientOptions & CallOptions = {}): Promise<SandboxInfo> {
    return Http.from(options).json<SandboxInfo>({ method: "GET", path: sandboxPath(sandboxId), ...call(options) });
  }

  /** The workspace's sandboxes, optionally only those in `status` whose metadata contains `metadata`. */
  static async list(options: ListOptions = {}): Promise<SandboxInfo[]> {
    const query: Record<string, string | undefined> = { status: options.status };
    for (const [key, value] of Object.entries(options.metadata ?? {})) query[`metadata.${key}`] = value;
    const http = Http.from(options);
    return (await http.json<{ items: SandboxInfo[] }>({ method: "GET", path: "/v1/sandboxes", query, ...call(options) })).items;
  }

  /** Delete a sandbox by id (an already-deleted one is not an error). */
  static async kill(sandboxId: string, options: ClientOptions & CallOptions & { keepSnapshots?: boolean } = {}): Promise<void> {
    await new Sandbox({ id: sandboxId } as SandboxInfo, Http.from(options)).kill(options);
  }

  // --- state and lifecycle -----------------------------------------------------------------------------------

  private path(suffix = ""): string {
    return sandboxPath(this.id, suffix);
  }

  /** Re-read the sandbox into `info`. */
  async refresh(options: CallOptions = {}): Promise<SandboxInfo> {
    this.info = await this.http.json<SandboxInfo>({ method: "GET", path: this.path(), ...options });
    return this.info;
  }

  async lifecycle(options: CallOptions = {}): Promise<LifecycleInfo> {
    return this.http.json<LifecycleInfo>({ method: "GET", path: this.path("/lifecycle"), ...options });
  }

  /** Change the TTL (`ttlSeconds` from now), persistence, what the TTL's expiry does and whether requests wake
   * it when hibernated; absent fields are unchanged. */
  async setLifecycle(
    change: { ttlSeconds?: number; persistent?: boolean; onTimeout?: OnTimeoutAction; autoWake?: boolean },
    options: CallOptions = {},
  ): Promise<LifecycleInfo> {
    const json: Record<string, unknown> = {};
    if (change.ttlSeconds !== undefined) json["ttl_seconds"] = change.ttlSeconds;
    if (change.persistent !== undefined) json["persistent"] = change.persistent;
    if (change.onTimeout !== undefined) json["on_timeout"] = change.onTimeout;
    if (change.autoWake !== undefined) json["auto_wake"] = change.autoWake;
    const lifecycle = await this.http.json<LifecycleInfo>({ method: "PATCH", path: this.path("/lifecycle"), json, ...options });
    this.info = {
      ...this.info,
      persistent: lifecycle.persistent,
      expires_at: lifecycle.expires_at,
      on_timeout: lifecycle.on_timeout,
      auto_wake: lifecycle.auto_wake,
    };
    return lifecycle;
  }

  /** Reset the time to live to `seconds` from now. */
  async setTimeout(seconds: number, options: CallOptions = {}): Promise<LifecycleInfo> {
    return this.setLifecycle({ ttlSeconds: seconds }, options);
  }

  /** Freeze the vCPUs in place until `resume()`. */
  async pause(options: CallOptions = {}): Promise<void> {
    await this.http.empty({ method: "POST", path: this.path("/pause"), ...options });
    this.info = { ...this.info, status: "paused" };
  }

  /** Continue a paused sandbox (its clock is re-synced). */
  async resume(options: CallOptions = {}): Promise<void> {
    await this.http.empty({ method: "POST", path: this.path("/resume"), ...options });
    this.info = { ...this.info, status: "running" };
  }

  /** Snapshot it to disk and stop it; `wake()` (or any request to it, with auto-wake) brings it back. */
  async hibernate(options: CallOptions = {}): Promise<void> {
    const { status } = await this.http.json<{ status: SandboxStatus }>({ method: "POST", path: this.path("/hibernate"), ...options });
    this.info = { ...this.info, status };
  }

  async wake(options: CallOptions = {}): Promise<void> {
    const { status } = await this.http.json<{ status: SandboxStatus }>({ method: "POST", path: this.path("/wake"), ...options });
    this.info = { ...this.info, status };
  }

  // --- snapshots and forks -----------------------------------------------------------------------------------

  /** Snapshot memory and disk; it keeps running. Restore with `Sandbox.create({ fromSnapshot: snap.id })`.
   * `retain` keeps it when this sandbox is killed; `quiesce` refuses while the guest holds TCP connections. */
  async snapshot(
    options: CallOptions & { labels?: Record<string, string>; retain?: boolean; quiesce?: boolean } = {},
  ): Promise<SnapshotInfo> {
    const { labels = {}, retain = false, quiesce = false, ...rest } = options;
    const json = { labels, retain, quiesce };
    return this.http.json<SnapshotInfo>({ method: "POST", path: this.path("/snapshots"), json, ...rest });
  }

  /** This sandbox's snapshots, newest first. */
  async snapshots(options: CallOptions = {}): Promise<SnapshotInfo[]> {
    const query = { sandbox_id: this.id };
    return (await this.http.json<{ snapshots: SnapshotInfo[] }>({ method: "GET", path: "/v1/snapshots", query, ...options }))
      .snapshots;
  }

  /** A new sandbox booted fresh from a copy of this one's disk (not its memory). */
  async fork(options: CallOptions & { metadata?: Record<string, string> } = {}): Promise<Sandbox> {
    const { metadata = {}, ...rest } = options;
    const forked = await this.http.json<{ parent_id: string; sandbox: SandboxInfo }>({
      method: "POST", path: this.path("/fork"), json: { metadata }, ...rest,
    });
    return new Sandbox(forked.sandbox, this.http);
  }

  /** `count` (1-16) children restored from one snapshot of this sandbox, memory and disk; children that could not
   * be created are in `errors`. Keep one with `ForkTree.promote`. */
  async forkTree(options: CallOptions & { count?: number; metadata?: Record<string, string> } = {}): Promise<ForkTree> {
    const { count = 2, metadata = {}, ...rest } = options;
    const body = await this.http.json<{
      tree_id: string;
      parent_id: string;
      snapshot_id: string;
      children: SandboxInfo[];
      errors?: ForkTreeError[];
    }>({ method: "POST", path: this.path("/fork-tree"), json: { count, metadata }, ...rest });
    const children = body.children.map((info) => new Sandbox(info, this.http));
    return new ForkTree(body.tree_id, body.parent_id, body.snapshot_id, children, body.errors ?? []);
  }

  /** Make this child of fork tree `treeId` the winner; `cleanupSiblings` (default) deletes the others. */
  async promote(treeId: string, options: CallOptions & { cleanupSiblings?: boolean } = {}): Promise<PromoteResult> {
    const { cleanupSiblings = true, ...rest } = options;
    const json = { tree_id: treeId, cleanup_siblings: cleanupSiblings };
    return this.http.json<PromoteResult>({ method: "POST", path: this.path("/promote"), json, ...rest });
  }

  // --- commands ----------------------------------------------------------------------------------------------

  private execBody(cmd: string, options: ExecOptions): Record<string, unknown> {
    const timeoutSeconds = options.timeoutSeconds === undefined ? 60 : options.timeoutSeconds;
    return { cmd, timeout_seconds: timeoutSeconds, env: options.env ?? {}, cwd: options.cwd ?? null, stdin: options.stdin ?? null };
  }

  /** Run `cmd` with `/bin/sh -c` and wait for it; with `background: true`, start it as a {@link Process}.
   * @throws {SandboxTimeout} it ran past `timeoutSeconds`. @throws {CommandFailed} `check` and a non-zero exit. */
  exec(cmd: string, options?: ExecOptions & { background?: false }): Promise<ExecResult>;
  exec(cmd: string, options: Omit<ExecOptions, "check" | "timeoutSeconds"> & { background: true }): Promise<Process>;
  async exec(cmd: string, options: ExecOptions & { background?: boolean } = {}): Promise<ExecResult | Process> {
    if (options.background) {
      const { env, cwd, stdin, signal } = options;
      return this.processes.startFed(cmd, { env: env ?? {}, ...(cwd ? { cwd } : {}), input: stdin, ...(signal ? { signal } : {}) });
    }
    const timeoutMs = options.timeoutMs ?? execTimeoutMs(this.http.config.timeoutMs, options.timeoutSeconds);
    const body = await this.http.json<{ stdout: string; stderr: string; exit_code: number; duration_ms: number }>({
      method: "POST",
      path: this.path("/exec"),
      json: this.execBody(cmd, options),
      timeoutMs,
      ...(options.signal ? { signal: options.signal } : {}),
    });
    const result: ExecResult = { stdout: body.stdout, stderr: body.stderr, exitCode: body.exit_code, durationMs: body.duration_ms };
    if (options.check && result.exitCode !== 0) {
      throw new CommandFailed(`command exited with ${result.exitCode}: ${cmd}`, result.exitCode, result.stdout, result.stderr);
    }
    return result;
  }

  /** `stdout` / `stderr` events as the command produces output, then exactly one `exit` event. Leave the loop
   * or abort `signal` to stop following it (the connection is released).
   * @throws {SandboxTimeout} past `timeoutSeconds`. @throws {GuestError} the stream ended without an exit code. */
  async *execStream(cmd: string, options: ExecOptions = {}): AsyncGenerator<StreamEvent, void, undefined> {
    const timeoutMs = options.timeoutMs ?? execTimeoutMs(this.http.config.timeoutMs, options.timeoutSeconds);
    const { body, done } = await this.http.stream({
      method: "POST",
      path: this.path("/exec/stream"),
      json: this.execBody(cmd, options),
      timeoutMs,
      ...(options.signal ? { signal: options.signal } : {}),
    });
    for await (const event of outputEvents(body, done, options, () => new GuestError(STREAM_ENDED_EARLY))) {
      if (event.kind !== "pty") yield event; // a command run by exec has no terminal
    }
  }

  /** Run a cell in the code interpreter (see {@link runCode}). */
  async runCode(code: string, options: RunCodeOptions = {}): Promise<Execution> {
    return runCode(this, code, options);
  }

  /** Open a terminal (see {@link openPty}). */
  async pty(options: PtyOptions = {}): Promise<Pty> {
    return openPty(this, options);
  }

  // --- network -----------------------------------------------------------------------------------------------

  async getNetwork(options: CallOptions = {}): Promise<NetworkPolicy> {
    return this.http.json<NetworkPolicy>({ method: "GET", path: this.path("/network"), ...options });
  }

  /** Replace the whole policy (omitted fields take their defaults); it applies live. */
  async setNetwork(policy: Body<"EgressPolicy">, options: CallOptions = {}): Promise<NetworkPolicy> {
    this.info = await this.http.json<SandboxInfo>({ method: "PUT", path: this.path("/network"), json: policy, ...options });
    return this.info.network ?? (policy as NetworkPolicy);
  }

  /** The recent egress decisions (0-1000). */
  async egressLog(limit = 100, options: CallOptions = {}): Promise<EgressLog> {
    if (!Number.isInteger(limit) || limit < 0 || limit > 1000) throw new InvalidArgument(`limit must be 0-1000, got ${limit}`);
    return this.http.json<EgressLog>({ method: "GET", path: this.path("/egress"), query: { limit }, ...options });
  }

  // --- ports -------------------------------------------------------------------------------------------------

  /** `{apiUrl}/v1/sandboxes/{id}/ports/{port}{path}`: HTTP (and WebSocket) traffic to `port` in the guest,
   * through the control plane (send `Authorization: Bearer <key>`). */
  portUrl(port: number, path = "/"): string {
    if (!Number.isInteger(port) || port < 1 || port > 65535) throw new InvalidArgument(`port must be 1-65535, got ${port}`);
    return `${this.http.config.apiUrl}${this.path(`/ports/${port}`)}${path.startsWith("/") ? path : `/${path}`}`;
  }

  /** `portUrl(port)` without its scheme and trailing slash (E2B style). */
  getHost(port: number): string {
    const url = new URL(this.portUrl(port, "/"));
    return `${url.host}${url.pathname.replace(/\/$/, "")}`;
  }

  // --- teardown ----------------------------------------------------------------------------------------------

  /** Delete the sandbox (and its non-retained snapshots unless `keepSnapshots`); a deleted one is not an error. */
  async kill(options: CallOptions & { keepSnapshots?: boolean } = {}): Promise<void> {
    if (this.info.status === "stopped") return;
    try {
      await this.http.empty({
        method: "DELETE", path: this.path(), query: { keep_snapshots: options.keepSnapshots ? "true" : undefined }, ...call(options),
      });
    } catch (error) {
      if (!(error instanceof NotFound)) throw error;
    }
    this.info = { ...this.info, status: "stopped" };
  }
}
