/** `sbx.files`: files inside a sandbox's guest (paths are guest paths). */
import { NotFound } from "./errors.js";
import { type BodyInit, type CallOptions, type Http, sandboxPath } from "./http.js";
import { messages, objectData, streamError } from "./sse.js";
import type { FileEntry, FileUrl, FsWatchEvent } from "./types.js";

/** What the sandbox's parts need of it. */
export interface SandboxRef {
  readonly id: string;
  readonly http: Http;
}

/** What `write` takes: text (UTF-8), bytes, a Blob, or a stream of bytes (sent as it is read, never retried). */
export type WriteData = string | Uint8Array | ArrayBuffer | Blob | ReadableStream<Uint8Array>;

export class Filesystem {
  constructor(private readonly sbx: SandboxRef) {}

  private fs(method: string, path: string, suffix = "", options: CallOptions = {}) {
    return { method, path: sandboxPath(this.sbx.id, `/fs${suffix}`), query: { path }, ...options };
  }

  /** The file's bytes. @throws {NotFound} no such file. */
  async read(path: string, options: CallOptions = {}): Promise<Uint8Array> {
    return this.sbx.http.bytes(this.fs("GET", path, "", options));
  }

  async readText(path: string, options: CallOptions = {}): Promise<string> {
    return new TextDecoder().decode(await this.read(path, options));
  }

  /** The file as a stream of bytes, read as it arrives (the call's deadline covers the headers only). */
  async readStream(path: string, options: CallOptions = {}): Promise<ReadableStream<Uint8Array>> {
    const { body, done } = await this.sbx.http.stream(this.fs("GET", path, "", options));
    const reader = body.getReader();
    return new ReadableStream<Uint8Array>({
      async pull(controller) {
        const { value, done: ended } = await reader.read();
        if (ended) {
          done();
          controller.close();
        } else {
          controller.enqueue(value);
        }
      },
      async cancel(reason) {
        done();
        await reader.cancel(reason);
      },
    });
  }

  /** Write `data`, creating parent directories; returns the bytes written.
   * @throws {PayloadTooLarge} more than the server accepts (64 MiB). */
  async write(path: string, data: WriteData, options: CallOptions = {}): Promise<number> {
    const body = typeof data === "string" ? new TextEncoder().encode(data) : data;
    const answer = await this.sbx.http.json<{ bytes: number }>({
      ...this.fs("PUT", path, "", options),
      body: body as BodyInit,
      headers: { "Content-Type": "application/octet-stream" },
    });
    return answer.bytes;
  }

  /** The entries of the directory `path`. */
  async list(path: string, options: CallOptions = {}): Promise<FileEntry[]> {
    return (await this.sbx.http.json<{ entries: FileEntry[] }>(this.fs("GET", path, "/dir", options))).entries;
  }

  async stat(path: string, options: CallOptions = {}): Promise<FileEntry> {
    return this.sbx.http.json<FileEntry>(this.fs("GET", path, "/stat", options));
  }

  /** `false` only when the path does not exist; any other failure is raised. */
  async exists(path: string, options: CallOptions = {}): Promise<boolean> {
    try {
      await this.stat(path, options);
      return true;
    } catch (error) {
      if (error instanceof NotFound) return false;
      throw error;
    }
  }

  async remove(path: string, options: CallOptions = {}): Promise<void> {
    await this.sbx.http.empty(this.fs("DELETE", path, "", options));
  }

  /** A URL that reads (`GET`) or writes (`PUT` raw bytes) the file without an API key until it expires. */
  async signedUrl(
    path: string,
    operation: "read" | "write" = "read",
    options: CallOptions & { expiresIn?: number; user?: string } = {},
  ): Promise<FileUrl> {
    const { expiresIn, user, ...call } = options;
    return this.sbx.http.json<FileUrl>({
      method: "POST",
      path: sandboxPath(this.sbx.id, "/files/url"),
      json: { path, operation, ...(expiresIn !== undefined ? { expires_in: expiresIn } : {}), ...(user ? { user } : {}) },
      ...call,
    });
  }

  /**
   * Changes under the directory `path`: first a `start` event once the watch is in place (make changes after
   * it), then `create` / `write` / `remove` / `rename` / `chmod` of entries relative to `path`. Runs until the
   * loop is left (or `signal` aborts), which ends the watch in the guest. @throws {NotFound} no such directory.
   */
  async *watch(
    path: string,
    options: CallOptions & { recursive?: boolean } = {},
  ): AsyncGenerator<FsWatchEvent, void, undefined> {
    const { recursive = false, ...call } = options;
    const { body, done } = await this.sbx.http.stream({
      method: "GET",
      path: sandboxPath(this.sbx.id, "/fs/watch"),
      query: { path, recursive },
      ...call,
    });
    for await (const message of messages(body, done)) {
      const data = objectData(message, "watch event");
      if (message.event === "error") throw streamError(data, "the watch failed");
      const kind = typeof data["kind"] === "string" ? data["kind"] : message.event;
      const name = typeof data["name"] === "string" ? data["name"] : String(data["name"] ?? "");
      yield { kind, name };
    }
    throw streamError({ code: "guest_error" }, "the watch stream ended without an error event");
  }
}
