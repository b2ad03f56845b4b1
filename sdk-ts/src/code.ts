/**
 * The code interpreter of a sandbox (template `code-interpreter`): `sbx.runCode` and `sbx.codeContexts`. Cells
 * run in Jupyter kernels in the guest; a context is one kernel (variables and imports persist across `runCode`
 * calls in it). Results come back rich: `text`, `html` for a DataFrame, `png` for a matplotlib figure...
 */
import { GuestError } from "./errors.js";
import { type CallOptions, execTimeoutMs, sandboxPath } from "./http.js";
import type { SandboxRef } from "./filesystem.js";
import { messages, objectData, streamError } from "./sse.js";
import type { components } from "./schema.js";
import type { OutputCallback } from "./types.js";

/** One rich output of a cell, in every representation IPython made of it (images are base64). */
export type Result = components["schemas"]["CodeResult"];

/** The exception a cell raised (a cell stopped by `timeoutSeconds`: `TimeoutError`; its context keeps state). */
export interface ExecutionError {
  name: string;
  value: string;
  traceback: string;
}

/** One cell's outcome. */
export interface Execution {
  results: Result[];
  logs: { stdout: string[]; stderr: string[] };
  /** `undefined` when the cell ran through. */
  error: ExecutionError | undefined;
  executionCount: number | undefined;
  durationMs: number;
  /** The main result's text (the cell's value), if it had one. */
  text: string | undefined;
}

export type CodeContext = components["schemas"]["CodeContext"];
export type ContextRef = CodeContext | string;

const FORMATS = ["text", "html", "markdown", "svg", "png", "jpeg", "pdf", "latex", "json", "javascript"] as const;

/** The representations a result has (`"text"`, `"html"`, `"png"`..., then `extra`'s types). */
export function formats(result: Result): string[] {
  const own = FORMATS.filter((name) => result[name] !== undefined && result[name] !== null);
  return [...own, ...Object.keys(result.extra ?? {})];
}

export interface RunCodeOptions extends CallOptions {
  /** Default: the `default` context. */
  context?: ContextRef;
  /** Interrupts the cell (`null`: no limit). Default 60. */
  timeoutSeconds?: number | null;
  /** Set in the kernel's `os.environ` before the cell runs. */
  env?: Record<string, string>;
  onStdout?: OutputCallback;
  onStderr?: OutputCallback;
  onResult?: (result: Result) => unknown;
  onError?: (error: ExecutionError) => unknown;
}

function contextId(context: ContextRef): string {
  return typeof context === "string" ? context : context.id;
}

/** Run `code` as one cell; a cell that raises is not an exception here: `execution.error` says what it raised.
 * @throws {StateError} the sandbox runs no code interpreter. @throws {NotFound} no such context. */
export async function runCode(sbx: SandboxRef, code: string, options: RunCodeOptions = {}): Promise<Execution> {
  const { context, timeoutSeconds = 60, env, onStdout, onStderr, onResult, onError, ...call } = options;
  const { body, done } = await sbx.http.stream({
    method: "POST",
    path: sandboxPath(sbx.id, "/code/run/stream"),
    json: { code, timeout_seconds: timeoutSeconds, env: env ?? {}, ...(context ? { context_id: contextId(context) } : {}) },
    timeoutMs: execTimeoutMs(sbx.http.config.timeoutMs, timeoutSeconds),
    ...call,
  });
  const execution: Execution = {
    results: [],
    logs: { stdout: [], stderr: [] },
    error: undefined,
    executionCount: undefined,
    durationMs: 0,
    text: undefined,
  };
  for await (const message of messages(body, done)) {
    const data = objectData(message, "code stream");
    switch (message.event) {
      case "stdout":
      case "stderr": {
        const text = String(data["text"] ?? "");
        execution.logs[message.event].push(text);
        (message.event === "stdout" ? onStdout : onStderr)?.(text);
        break;
      }
      case "result": {
        const result = { ...data, is_main_result: data["is_main_result"] === true } as Result;
        execution.results.push(result);
        if (result.is_main_result && typeof result.text === "string") execution.text = result.text;
        onResult?.(result);
        break;
      }
      case "error":
        execution.error = {
          name: String(data["name"] ?? ""),
          value: String(data["value"] ?? ""),
          traceback: String(data["traceback"] ?? ""),
        };
        onError?.(execution.error);
        break;
      case "failure":
        throw streamError(data, "the code stream failed");
      case "end": {
        const count = data["execution_count"];
        const duration = data["duration_ms"];
        execution.executionCount = typeof count === "number" ? count : undefined;
        execution.durationMs = typeof duration === "number" ? duration : 0;
        return execution;
      }
    }
  }
  throw new GuestError("the code stream ended before the cell finished");
}

/** The contexts (kernels) of a sandbox's code interpreter (`sbx.codeContexts`); `default` is always there. */
export class CodeContexts {
  constructor(private readonly sbx: SandboxRef) {}

  private path(suffix = ""): string {
    return sandboxPath(this.sbx.id, `/code/contexts${suffix}`);
  }

  /** A new kernel (`python`), working in `cwd` (default: the user's home). */
  async create(options: CallOptions & { language?: string; cwd?: string } = {}): Promise<CodeContext> {
    const { language = "python", cwd, ...call } = options;
    return this.sbx.http.json<CodeContext>({
      method: "POST", path: this.path(), json: { language, ...(cwd !== undefined ? { cwd } : {}) }, ...call,
    });
  }

  /** Every context, `default` included. */
  async list(options: CallOptions = {}): Promise<CodeContext[]> {
    return (await this.sbx.http.json<{ items: CodeContext[] }>({ method: "GET", path: this.path(), ...options })).items;
  }

  /** Shut the context's kernel down. @throws {InvalidArgument} it is `default` (restart it instead). */
  async remove(context: ContextRef, options: CallOptions = {}): Promise<void> {
    const path = this.path(`/${encodeURIComponent(contextId(context))}`);
    await this.sbx.http.empty({ method: "DELETE", path, ...options });
  }

  /** A fresh kernel for the context: all its state is gone. */
  async restart(context: ContextRef, options: CallOptions = {}): Promise<void> {
    const path = this.path(`/${encodeURIComponent(contextId(context))}/restart`);
    await this.sbx.http.empty({ method: "POST", path, ...options });
  }
}
