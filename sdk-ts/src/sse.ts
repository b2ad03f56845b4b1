/**
 * Server-sent events (`text/event-stream`), decoded incrementally from a response body: lines split on CR, LF or
 * CRLF (also across chunk boundaries), `event:` / `data:` fields, comments (`:` keepalives) skipped, and a last
 * event whose blank line never came flushed at the end of the stream.
 */
import { CryoboxError, errorFromBody } from "./errors.js";

export interface SSEMessage {
  event: string;
  data: string;
}

/** Feed it lines (without their terminators); a blank line completes a message. */
export class SSEDecoder {
  private event = "";
  private data: string[] = [];

  feed(line: string): SSEMessage | undefined {
    if (line === "") return this.dispatch();
    if (line.startsWith(":")) return undefined;
    const colon = line.indexOf(":");
    const name = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (name === "event") this.event = value;
    else if (name === "data") this.data.push(value);
    return undefined;
  }

  private dispatch(): SSEMessage | undefined {
    const event = this.event || "message";
    const data = this.data;
    this.event = "";
    this.data = [];
    if (data.length === 0) return undefined;
    return { event, data: data.join("\n") };
  }
}

/** The lines of a byte stream, then one `""` (which flushes an event whose final blank line never came).
 * Returning early (or an abort) cancels the stream and releases its connection; `done` runs at the end. */
export async function* lines(body: ReadableStream<Uint8Array>, done?: () => void): AsyncGenerator<string> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  let finished = false;
  try {
    for (;;) {
      const { value, done: ended } = await reader.read();
      if (ended) break;
      buffer += decoder.decode(value, { stream: true });
      let start = 0;
      for (let i = 0; i < buffer.length; i++) {
        const ch = buffer[i];
        if (ch !== "\n" && ch !== "\r") continue;
        if (ch === "\r" && i === buffer.length - 1) break; // maybe the CR of a CRLF split across chunks
        yield buffer.slice(start, i);
        if (ch === "\r" && buffer[i + 1] === "\n") i++;
        start = i + 1;
      }
      buffer = buffer.slice(start);
    }
    buffer += decoder.decode();
    for (const line of buffer.split(/\r\n|\r|\n/)) {
      if (line) yield line;
    }
    finished = true;
    yield "";
  } finally {
    if (!finished) await reader.cancel().catch(() => undefined);
    reader.releaseLock();
    done?.();
  }
}

/** The messages of an event stream. */
export async function* messages(body: ReadableStream<Uint8Array>, done?: () => void): AsyncGenerator<SSEMessage> {
  const decoder = new SSEDecoder();
  for await (const line of lines(body, done)) {
    const message = decoder.feed(line);
    if (message !== undefined) yield message;
  }
}

/** A message's data as a JSON object. @throws {GuestError} malformed data. */
export function objectData(message: SSEMessage, what: string): Record<string, unknown> {
  let data: unknown;
  try {
    data = JSON.parse(message.data);
  } catch {
    data = undefined;
  }
  if (data === null || typeof data !== "object" || Array.isArray(data)) {
    throw errorFromBody({
      error: `malformed ${what} data for ${JSON.stringify(message.event)}: ${message.data.slice(0, 200)}`,
      code: "guest_error",
    });
  }
  return data as Record<string, unknown>;
}

/** The error an `event: error` (or a code stream's `failure`) stands for, by its `code`. */
export function streamError(data: Record<string, unknown>, fallback: string): CryoboxError {
  const message = typeof data["error"] === "string" && data["error"] ? data["error"] : fallback;
  return errorFromBody({ ...data, error: message });
}
