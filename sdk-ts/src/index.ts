/**
 * cryobox's TypeScript SDK: microVM sandboxes where every create is a snapshot restore. ESM, typed from the
 * API's OpenAPI document, built on `fetch` (Node >= 18, Deno, Bun), no runtime dependencies.
 */
export { Sandbox, ForkTree, type CreateOptions, type ExecOptions, type ListOptions } from "./sandbox.js";
export { Filesystem, type WriteData } from "./filesystem.js";
export { Process, Processes, type StartOptions } from "./processes.js";
export { Pty, type PtyOptions } from "./pty.js";
export {
  CodeContexts,
  formats,
  type CodeContext,
  type ContextRef,
  type Execution,
  type ExecutionError,
  type Result,
  type RunCodeOptions,
} from "./code.js";
export { ApiClient, Snapshots, Volumes } from "./clients.js";
export { Build, Templates, type DockerfileBuildOptions } from "./templates.js";
export {
  DEFAULT_RETRY,
  DEFAULT_URL,
  Http,
  parseRetryAfter,
  resolveConfig,
  type CallOptions,
  type ClientOptions,
  type RetryPolicy,
  type WebSocketConstructor,
} from "./http.js";
export { SSEDecoder, type SSEMessage } from "./sse.js";
export * from "./errors.js";
export type * from "./types.js";
export type { components, paths } from "./schema.js";
