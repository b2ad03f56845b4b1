/**
 * The API's objects as TypeScript types: aliases of the generated {@link components} (`schema.ts`, from the
 * OpenAPI document the server serves), and the request bodies the SDK builds (every field optional: the server
 * fills in its defaults).
 */
import type { components } from "./schema.js";

type Schemas = components["schemas"];
/** A request body: what the API accepts, every field optional (defaults are the server's). */
export type Body<Name extends keyof Schemas> = Partial<Schemas[Name]>;

export type SandboxInfo = Schemas["Sandbox"];
export type SandboxStatus = SandboxInfo["status"];
export type LifecycleInfo = Schemas["Lifecycle"];
export type OnTimeoutAction = NonNullable<Schemas["CreateSandboxRequest"]["on_timeout"]>;
export type SnapshotInfo = Schemas["Snapshot"];
export type ForkTreeError = Schemas["ForkTreeError"];
export type PromoteResult = Schemas["PromoteResponse"];
export type ProcessInfo = Schemas["Process"];
export type ProcessResult = Schemas["ProcessResult"];
export type FileEntry = Schemas["FileEntry"];
export type FileUrl = Schemas["FileUrl"];
export type NetworkPolicy = Schemas["EgressPolicy"];
export type EgressLog = Schemas["EgressLog"];
export type EgressDecision = Schemas["EgressDecision"];
export type TemplateInfo = Schemas["Template"];
export type TemplateBuildInfo = Schemas["TemplateBuild"];
export type BuildLogLine = Schemas["BuildLogLine"];
export type VolumeInfo = Schemas["Volume"];
export type VolumeEntry = Schemas["VolumeEntry"];
export type VolumeRestored = Schemas["VolumeRestored"];
export type VolumeMount = Schemas["VolumeMountRequest"];
export type Info = Schemas["Info"];

/** The answer of `exec`. */
export interface ExecResult {
  stdout: string;
  stderr: string;
  exitCode: number;
  durationMs: number;
}

/** One event of a streamed exec: output chunks, then exactly one `exit`. */
export type StreamEvent =
  | { kind: "stdout"; chunk: string }
  | { kind: "stderr"; chunk: string }
  | { kind: "exit"; exitCode: number };

/** One event of a background process's stream: a process started with `pty` reports its terminal's output as
 * `pty` data instead of `stdout` / `stderr`. */
export type ProcessEvent = StreamEvent | { kind: "pty"; data: Uint8Array };

/** One event of `filesystem.watch`: `start` once the watch is in place, then changes of `name`. */
export interface FsWatchEvent {
  kind: "start" | "create" | "write" | "remove" | "rename" | "chmod" | (string & {});
  name: string;
}

export type OutputCallback = (chunk: string) => unknown;
