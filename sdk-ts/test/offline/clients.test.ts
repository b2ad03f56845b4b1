import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { InvalidArgument, Snapshots, TemplateBuildFailed, Templates, Volumes } from "../../src/index.js";
import type { BuildLogLine } from "../../src/index.js";
import { ScriptedServer, json, pieces } from "./server.js";

const BUILD = { id: "b1", name: "web", status: "running", cpu: 1, memory_mb: 512 };

function log(offset: number, message: string): string {
  const line = { offset, message, level: "info", step: "1", timestamp: "2026-01-01T00:00:00Z" };
  return `event: log\ndata: ${JSON.stringify(line)}\n\n`;
}

describe("workspace clients", () => {
  const server = new ScriptedServer();
  before(() => server.start());
  after(() => server.stop());

  it("builds a template from a Dockerfile, streams its log (resuming a dropped stream) and waits", async () => {
    const templates = new Templates({ apiUrl: server.url, apiKey: "k" });
    server.answer(json(202, BUILD));
    const build = await templates.buildFromDockerfile("web", { dockerfile: "FROM base\nRUN true\n", buildArgs: { A: "1" } });
    assert.deepEqual(JSON.parse(server.seen.at(-1)?.body ?? "{}"), {
      name: "web",
      dockerfile: "FROM base\nRUN true\n",
      no_cache: false,
      build_args: { A: "1" },
    });
    server.answer(
      pieces([log(0, "step 1"), log(1, "step 2")]), // dropped before its end
      pieces([log(2, "step 3"), `event: done\ndata: ${JSON.stringify({ ...BUILD, status: "done" })}\n\n`]),
      json(200, { ...BUILD, status: "done" }),
    );
    const lines: BuildLogLine[] = [];
    const done = await build.wait({ onLog: (line) => lines.push(line) });
    assert.equal(done.status, "done");
    assert.deepEqual(lines.map((l) => l.message), ["step 1", "step 2", "step 3"]);
    const urls = server.seen.slice(-3).map((s) => s.url);
    assert.deepEqual(urls, [
      "/v1/templates/web/builds/b1/logs/stream?offset=0",
      "/v1/templates/web/builds/b1/logs/stream?offset=2",
      "/v1/templates/web/builds/b1",
    ]);
  });

  it("sends a build context as multipart, and raises a failed build with its step and log tail", async () => {
    const templates = new Templates({ apiUrl: server.url });
    server.answer(json(202, BUILD));
    const build = await templates.buildFromDockerfile("web", { dockerfile: "FROM base\nCOPY . /app\n", context: new Uint8Array([31, 139]) });
    const sent = server.seen.at(-1);
    assert.match(String(sent?.headers["content-type"]), /^multipart\/form-data; boundary=/);
    assert.match(sent?.body ?? "", /name="context"; filename="context.tar.gz"/);
    const failed = { ...BUILD, status: "failed", error: "exit 1", failed_step: { step: "2", line: 2, instruction: "COPY . /app" } };
    server.answer(pieces([log(0, "copying"), `event: error\ndata: ${JSON.stringify({ error: "exit 1", build: failed })}\n\n`]));
    const error = await build.wait().catch((e: unknown) => e);
    assert.ok(error instanceof TemplateBuildFailed, String(error));
    assert.equal(error.details["step"], "2");
    assert.deepEqual(error.logTail, ["copying"]);
    assert.match(error.message, /at step 2 \(line 2: COPY \. \/app\): exit 1/);
  });

  it("checks volume names and paths before sending, and sends files raw", async () => {
    const volumes = new Volumes({ apiUrl: server.url });
    const before = server.seen.length;
    await assert.rejects(volumes.create("bad/name"), InvalidArgument);
    await assert.rejects(volumes.readFile("data", ""), InvalidArgument);
    assert.equal(server.seen.length, before);
    server.answer(json(201, { name: "x", path: "/a/b", type: "file", size: 3 }));
    await volumes.writeFile("data", "a/b", "abc", { overwrite: false });
    const sent = server.seen.at(-1);
    assert.equal(sent?.url, "/v1/volumes/data/files?path=%2Fa%2Fb&overwrite=false");
    assert.equal(sent?.body, "abc");
  });

  it("lists snapshots by sandbox and labels", async () => {
    server.answer(json(200, { snapshots: [] }));
    assert.deepEqual(await new Snapshots({ apiUrl: server.url }).list({ sandboxId: "s1", labels: { stage: "a" } }), []);
    assert.equal(server.seen.at(-1)?.url, "/v1/snapshots?sandbox_id=s1&label.stage=a");
  });
});
