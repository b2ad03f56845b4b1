/** The exec-style output streams (`exec/stream`, a process's `stream`): SSE messages to {@link StreamEvent}s. */
import { GuestError } from "./errors.js";
import { type SSEMessage, messages, objectData, streamError } from "./sse.js";
import type { OutputCallback, ProcessEvent } from "./types.js";

export const STREAM_ENDED_EARLY = "exec stream ended before the command reported an exit code";

/** One message of an exec (or process) stream as an event (`undefined` for events this SDK does not know).
 * @throws the mapped error of an `error` event, or {@link GuestError} for malformed data. */
export function decodeExecMessage(message: SSEMessage): ProcessEvent | undefined {
  if (!["stdout", "stderr", "pty", "exit", "error"].includes(message.event)) return undefined;
  const data = objectData(message, "exec stream");
  if (message.event === "error") throw streamError(data, "exec stream reported an error");
  if (message.event === "exit") {
    const code = data["exit_code"];
    if (typeof code !== "number" || !Number.isInteger(code)) {
      throw new GuestError(`exec stream exit event without an integer exit_code: ${message.data.slice(0, 200)}`);
    }
    return { kind: "exit", exitCode: code };
  }
  if (message.event === "pty") {
    const raw = atob(typeof data["data_b64"] === "string" ? data["data_b64"] : "");
    return { kind: "pty", data: Uint8Array.from(raw, (ch) => ch.charCodeAt(0)) };
  }
  const chunk = data["chunk"];
  const text = typeof chunk === "string" ? chunk : String(chunk ?? "");
  return message.event === "stdout" ? { kind: "stdout", chunk: text } : { kind: "stderr", chunk: text };
}

export interface OutputHandlers {
  onStdout?: OutputCallback | undefined;
  onStderr?: OutputCallback | undefined;
}

/** The events of an output stream up to its `exit`, each chunk handed to its callback too.
 * @throws the mapped error of an `error` event, or `endedEarly()` when the stream ends without `exit`. */
export async function* outputEvents(
  body: ReadableStream<Uint8Array>,
  done: () => void,
  handlers: OutputHandlers,
  endedEarly: () => Error,
): AsyncGenerator<ProcessEvent, void, undefined> {
  for await (const message of messages(body, done)) {
    const event = decodeExecMessage(message);
    if (event === undefined) continue;
    if (event.kind === "stdout") handlers.onStdout?.(event.chunk);
    else if (event.kind === "stderr") handlers.onStderr?.(event.chunk);
    yield event;
    if (event.kind === "exit") return;
  }
  throw endedEarly();
}
