import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { GuestError, NotFound, SSEDecoder, Sandbox, SandboxTimeout, formats } from "../../src/index.js";
import type { StreamEvent } from "../../src/index.js";
import { ScriptedServer, hang, json, pieces } from "./server.js";

const SANDBOX = { id: "sbx-s", template: "base", status: "running" };

async function collect<T>(events: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const event of events) out.push(event);
  return out;
}

describe("the SSE decoder", () => {
  it("joins data lines, skips comments, strips one leading space, defaults the event name", () => {
    const decoder = new SSEDecoder();
    const got = [": keepalive", "event: stdout", "data: {\"chunk\":", "data:  \"x\"}", "", "data: plain", "", ""].map(
      (line) => decoder.feed(line),
    );
    assert.deepEqual(got.filter(Boolean), [
      { event: "stdout", data: "{\"chunk\":\n \"x\"}" },
      { event: "message", data: "plain" },
    ]);
  });
});

describe("streams from a server", () => {
  const server = new ScriptedServer();
  let sbx: Sandbox;
  before(async () => {
    await server.start();
    server.answer(json(201, SANDBOX));
    sbx = await Sandbox.create({ apiUrl: server.url });
  });
  after(() => server.stop());

  it("decodes an exec stream split anywhere, CRLF across chunks included, to its exit", async () => {
    server.answer(
      pieces([
        ": keepalive\r\n\r",
        "\nevent: stdout\r\ndata: {\"chunk\": \"1\\n\"}\r",
        "\n\r\nevent: std",
        "err\ndata: {\"chunk\": \"é",
        "\"}\n\nevent: unknown\ndata: {}\n\n",
        "event: exit\ndata: {\"exit_code\": 7}\n\n",
        "event: stdout\ndata: {\"chunk\": \"after exit\"}\n\n",
      ]),
    );
    const seen: string[] = [];
    const events = await collect(sbx.execStream("echo 1", { onStdout: (c) => seen.push(c), timeoutSeconds: 5 }));
    assert.deepEqual(events, [
      { kind: "stdout", chunk: "1\n" },
      { kind: "stderr", chunk: "é" },
      { kind: "exit", exitCode: 7 },
    ] satisfies StreamEvent[]);
    assert.deepEqual(seen, ["1\n"]);
    const request = server.seen.at(-1);
    assert.equal(request?.url, "/v1/sandboxes/sbx-s/exec/stream");
    assert.equal(JSON.parse(request?.body ?? "{}").timeout_seconds, 5);
  });

  it("flushes a last event whose blank line never came", async () => {
    server.answer(pieces(["event: exit\ndata: {\"exit_code\": 0}"]));
    assert.deepEqual(await collect(sbx.execStream("true")), [{ kind: "exit", exitCode: 0 }]);
  });

  it("raises an error event by its code, and a stream without exit as GuestError", async () => {
    server.answer(pieces(["event: stdout\ndata: {\"chunk\": \"a\"}\n\n", "event: error\ndata: {\"error\": \"command timed out\", \"code\": \"timeout\"}\n\n"]));
    const got: StreamEvent[] = [];
    const error = await (async () => {
      for await (const event of sbx.execStream("sleep 9")) got.push(event);
    })().catch((e: unknown) => e);
    assert.ok(error instanceof SandboxTimeout);
    assert.deepEqual(got, [{ kind: "stdout", chunk: "a" }]);
    server.answer(pieces(["event: stdout\ndata: {\"chunk\": \"a\"}\n\n"]));
    await assert.rejects(collect(sbx.execStream("x")), GuestError);
    server.answer(json(404, { error: "no sandbox", code: "not_found" }));
    await assert.rejects(collect(sbx.execStream("x")), NotFound);
  });

  it("cancels a stream by AbortSignal: the connection is closed", async () => {
    server.answer(hang());
    const closed = server.closedEarly.length;
    const controller = new AbortController();
    const events = sbx.execStream("sleep infinity", { signal: controller.signal });
    setTimeout(() => controller.abort(), 150);
    const error = await collect(events).catch((e: unknown) => e);
    assert.ok(error instanceof DOMException && error.name === "AbortError", String(error));
    await waitFor(() => server.closedEarly.length === closed + 1);
  });

  it("leaving the loop early releases the connection", async () => {
    server.answer(pieces(["event: stdout\ndata: {\"chunk\": \"first\"}\n\n"], { end: false }));
    const closed = server.closedEarly.length;
    for await (const event of sbx.execStream("yes")) {
      assert.deepEqual(event, { kind: "stdout", chunk: "first" });
      break;
    }
    await waitFor(() => server.closedEarly.length === closed + 1);
  });

  it("decodes a code cell's stream into an Execution with rich results", async () => {
    server.answer(
      pieces([
        "event: stdout\ndata: {\"text\": \"hi\\n\"}\n\n",
        "event: result\ndata: {\"text\": \"<Figure>\", \"png\": \"iVBOR\", \"is_main_result\": false}\n\n",
        "event: result\ndata: {\"text\": \"2\", \"html\": \"<b>2</b>\", \"is_main_result\": true, \"extra\": {\"x/y\": 1}}\n\n",
        "event: error\ndata: {\"name\": \"KeyError\", \"value\": \"'k'\", \"traceback\": \"tb\"}\n\n",
        "event: end\ndata: {\"execution_count\": 4, \"duration_ms\": 12.5}\n\n",
      ]),
    );
    const results: string[] = [];
    const execution = await sbx.runCode("1 + 1", { context: "ctx-1", onResult: (r) => results.push(r.text ?? "") });
    assert.equal(execution.text, "2");
    assert.deepEqual(execution.logs, { stdout: ["hi\n"], stderr: [] });
    assert.deepEqual(formats(execution.results[1]!), ["text", "html", "x/y"]);
    assert.deepEqual(execution.error, { name: "KeyError", value: "'k'", traceback: "tb" });
    assert.equal(execution.executionCount, 4);
    assert.deepEqual(results, ["<Figure>", "2"]);
    assert.equal(JSON.parse(server.seen.at(-1)?.body ?? "{}").context_id, "ctx-1");
  });

  it("decodes a process's stream, terminal data included", async () => {
    server.answer(json(201, { pid: 42, cmd: "sh", running: true, started_at: "2026-01-01T00:00:00Z" }));
    const process = await sbx.processes.start("sh", { pty: { cols: 80, rows: 24 } });
    assert.deepEqual(JSON.parse(server.seen.at(-1)?.body ?? "{}"), { cmd: "sh", env: {}, stdin: false, pty: { cols: 80, rows: 24 } });
    server.answer(
      pieces(["event: pty\ndata: {\"data_b64\": \"AP9h\"}\n\n", "event: exit\ndata: {\"exit_code\": -1, \"status\": \"signal\"}\n\n"]),
    );
    assert.deepEqual(await collect(process.stream()), [
      { kind: "pty", data: Uint8Array.from([0, 255, 97]) },
      { kind: "exit", exitCode: -1 },
    ]);
    assert.equal(server.seen.at(-1)?.url, "/v1/sandboxes/sbx-s/processes/42/stream");
  });

  it("decodes a directory watch", async () => {
    server.answer(
      pieces(["event: start\ndata: {\"kind\": \"start\"}\n\n", "event: create\ndata: {\"kind\": \"create\", \"name\": \"a.txt\"}\n\n"], {
        end: false,
      }),
    );
    const events = [];
    for await (const event of sbx.files.watch("/work", { recursive: true })) {
      events.push(event);
      if (events.length === 2) break;
    }
    assert.deepEqual(events, [{ kind: "start", name: "" }, { kind: "create", name: "a.txt" }]);
    assert.equal(server.seen.at(-1)?.url, "/v1/sandboxes/sbx-s/fs/watch?path=%2Fwork&recursive=true");
  });

  it("streams a file's bytes and uploads a stream", async () => {
    server.answer((_req, res) => {
      res.writeHead(200, { "Content-Type": "application/octet-stream" });
      res.write(Buffer.from([0, 1, 2]));
      setTimeout(() => res.end(Buffer.from([255])), 20);
    });
    const chunks: number[] = [];
    for await (const chunk of await sbx.files.readStream("/bin/x")) chunks.push(...chunk);
    assert.deepEqual(chunks, [0, 1, 2, 255]);
    server.answer(json(200, { path: "/up", bytes: 6 }));
    const upload = new ReadableStream<Uint8Array>({
      start(controller) {
        controller.enqueue(new TextEncoder().encode("abc"));
        controller.enqueue(new TextEncoder().encode("def"));
        controller.close();
      },
    });
    assert.equal(await sbx.files.write("/up", upload), 6);
    assert.equal(server.seen.at(-1)?.body, "abcdef");
  });
});

async function waitFor(condition: () => boolean, timeoutMs = 3000): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  while (!condition()) {
    if (performance.now() > deadline) throw new Error("condition not met in time");
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}
