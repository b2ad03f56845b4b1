/**
 * The TypeScript SDK against a real `cryobox serve` (CRYOBOX_API_URL / CRYOBOX_API_KEY, required): create ->
 * exec -> streamed exec (and its cancellation) -> background processes -> files -> terminal -> snapshot ->
 * restore -> forkTree -> runCode -> kill, the API's errors as classes, and retries of refusals (through a loopback
 * proxy that refuses the first requests). Few sandboxes, never more than two at once, all killed in `after`.
 */
import assert from "node:assert/strict";
import { type IncomingMessage, type ServerResponse, createServer, request as httpRequest } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, describe, it } from "node:test";

import {
  InvalidArgument,
  NotFound,
  Sandbox,
  SandboxTimeout,
  Snapshots,
  StateError,
  Unauthorized,
} from "../../src/index.js";
import type { ForkTree, SnapshotInfo, StreamEvent } from "../../src/index.js";

const apiUrl = process.env["CRYOBOX_API_URL"];
const apiKey = process.env["CRYOBOX_API_KEY"];
if (!apiUrl || !apiKey) throw new Error("the integration tests need CRYOBOX_API_URL and CRYOBOX_API_KEY");
const api = { apiUrl, apiKey };
const run = `sdkts-${process.pid}-${Date.now()}`;

async function collect<T>(events: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const event of events) out.push(event);
  return out;
}

describe("the TypeScript SDK on a real server", () => {
  let sbx: Sandbox;
  let restored: Sandbox | undefined;
  let tree: ForkTree | undefined;
  let snapshot: SnapshotInfo;

  before(async () => {
    sbx = await Sandbox.create({ ...api, template: "code-interpreter", ttlSeconds: 900, metadata: { run } });
  });

  after(async () => {
    await Promise.allSettled([sbx?.kill(), restored?.kill(), tree?.killAll()]);
  });

  it("creates, finds and lists the sandbox", async () => {
    assert.equal(sbx.info.status, "running");
    assert.equal(sbx.info.template, "code-interpreter");
    assert.deepEqual((await Sandbox.list({ ...api, metadata: { run } })).map((s) => s.id), [sbx.id]);
    assert.equal((await Sandbox.get(sbx.id, api)).id, sbx.id);
    const lifecycle = await sbx.setTimeout(1200);
    assert.equal(lifecycle.ttl_seconds, 1200);
    assert.equal((await sbx.lifecycle()).persistent, false);
    assert.equal((await sbx.getNetwork()).default, "deny");
  });

  it("runs commands: output, exit codes, env, cwd, stdin, timeouts", async () => {
    const result = await sbx.exec("echo out; echo err >&2; exit 3");
    assert.deepEqual([result.stdout, result.stderr, result.exitCode], ["out\n", "err\n", 3]);
    const shaped = await sbx.exec('echo "$GREETING $(pwd)"; cat', { env: { GREETING: "hi" }, cwd: "/tmp", stdin: "fed" });
    assert.equal(shaped.stdout, "hi /tmp\nfed");
    await assert.rejects(sbx.exec("sleep 10", { timeoutSeconds: 1 }), SandboxTimeout);
  });

  it("streams a command's output as it comes, then its exit", async () => {
    const seen: string[] = [];
    const events = await collect(
      sbx.execStream("for i in 1 2 3; do echo $i; sleep 0.2; done; echo bad >&2; exit 4", { onStdout: (c) => seen.push(c) }),
    );
    const text = (kind: StreamEvent["kind"]) =>
      events.map((e) => (e.kind === kind && "chunk" in e ? e.chunk : "")).join("");
    assert.equal(text("stdout"), "1\n2\n3\n");
    assert.equal(text("stderr"), "bad\n");
    assert.deepEqual(events.at(-1), { kind: "exit", exitCode: 4 });
    assert.equal(seen.join(""), "1\n2\n3\n");
  });

  it("cancels a streamed command with an AbortSignal", async () => {
    const controller = new AbortController();
    const started = performance.now();
    const error = await (async () => {
      for await (const event of sbx.execStream("echo begin; sleep 60", { signal: controller.signal })) {
        if (event.kind === "stdout") controller.abort();
      }
    })().catch((e: unknown) => e);
    assert.ok(error instanceof DOMException && error.name === "AbortError", String(error));
    assert.ok(performance.now() - started < 20_000);
  });

  it("runs background processes", async () => {
    const job = await sbx.exec("sort", { background: true, stdin: "b\na\n" });
    const done = await job.wait({ timeoutSeconds: 30 });
    assert.equal(done.exit_code, 0);
    assert.equal(done.stdout, "a\nb\n");
    const server = await sbx.processes.start("echo ready; sleep 120", { tag: `tag-${run}` });
    for await (const event of server.stream()) {
      assert.deepEqual(event, { kind: "stdout", chunk: "ready\n" });
      break; // detaches: it keeps running
    }
    const listed = await sbx.processes.list();
    assert.ok(listed.some((p) => p.pid === server.pid && p.running && p.tag === `tag-${run}`));
    await server.kill();
    const ended = await server.wait({ timeoutSeconds: 30 });
    assert.notEqual(ended.exit_code, 0);
  });

  it("reads and writes files, as text, bytes and streams; lists, stats and watches", async () => {
    assert.equal(await sbx.files.write("/work/ts/hello.txt", "hello from ts"), 13);
    assert.equal(await sbx.files.readText("/work/ts/hello.txt"), "hello from ts");
    const bytes = Uint8Array.from({ length: 256 }, (_, i) => i);
    await sbx.files.write("/work/ts/bytes.bin", bytes);
    assert.deepEqual(await sbx.files.read("/work/ts/bytes.bin"), bytes);
    const big = new Uint8Array(3 << 20).map((_, i) => (i * 7) % 251);
    const upload = new ReadableStream<Uint8Array>({
      start(controller) {
        for (let at = 0; at < big.length; at += 1 << 20) controller.enqueue(big.subarray(at, at + (1 << 20)));
        controller.close();
      },
    });
    assert.equal(await sbx.files.write("/work/ts/big.bin", upload), big.length);
    let read = 0;
    let same = true;
    for await (const chunk of await sbx.files.readStream("/work/ts/big.bin")) {
      same &&= chunk.every((value, i) => value === big[read + i]);
      read += chunk.length;
    }
    assert.ok(same && read === big.length, `streamed back ${read} bytes`);
    const names = (await sbx.files.list("/work/ts")).map((e) => e.name).sort();
    assert.deepEqual(names, ["big.bin", "bytes.bin", "hello.txt"]);
    const stat = await sbx.files.stat("/work/ts/bytes.bin");
    assert.equal(stat.size, 256);
    assert.equal(stat.is_dir, false);
    await sbx.files.remove("/work/ts/big.bin");
    assert.equal(await sbx.files.exists("/work/ts/big.bin"), false);
    await assert.rejects(sbx.files.read("/work/ts/missing"), NotFound);

    await sbx.exec("mkdir -p /work/watched");
    const controller = new AbortController();
    const seen: string[] = [];
    const watching = (async () => {
      for await (const event of sbx.files.watch("/work/watched", { signal: controller.signal })) {
        seen.push(`${event.kind}:${event.name}`);
        if (event.kind === "start") await sbx.files.write("/work/watched/new.txt", "x");
        if (event.name === "new.txt") return;
      }
    })();
    const timer = setTimeout(() => controller.abort(), 30_000);
    await watching.finally(() => clearTimeout(timer));
    assert.equal(seen[0], "start:");
    assert.ok(seen.some((s) => s.endsWith(":new.txt")), seen.join(","));
  });

  it("opens a terminal over WebSocket", async () => {
    let output = "";
    let sawAnswer: () => void = () => undefined;
    const answered = new Promise<void>((resolve) => (sawAnswer = resolve));
    const pty = await sbx.pty({
      cmd: "/bin/sh",
      cols: 100,
      rows: 30,
      onData: (data) => {
        output += new TextDecoder().decode(data);
        if (output.includes("pty-42")) sawAnswer();
      },
    });
    assert.ok(pty.session);
    pty.resize(120, 40);
    pty.write("echo pty-$((6 * 7)); stty size\n");
    await answered;
    pty.write("exit 5\n");
    assert.equal(await pty.exited, 5);
    assert.match(output, /40 120/);
  });

  it("runs code with state, contexts and rich results", async () => {
    assert.equal((await sbx.runCode("x = 41")).error, undefined);
    assert.equal((await sbx.runCode("x + 1")).text, "42");
    const frame = (await sbx.runCode("import pandas as pd\npd.DataFrame({'a': [1, 2]})")).results[0];
    assert.ok(frame?.html?.includes("<table") && frame.is_main_result);
    const failed = await sbx.runCode("raise KeyError('missing')");
    assert.equal(failed.error?.name, "KeyError");
    const context = await sbx.codeContexts.create();
    const printed: string[] = [];
    const inContext = await sbx.runCode("x = 1\nprint('in ctx')\nx", { context, onStdout: (c) => printed.push(c) });
    assert.equal(inContext.text, "1");
    assert.deepEqual(printed, ["in ctx\n"]);
    assert.equal((await sbx.runCode("x")).text, "41"); // the default context kept its own
    assert.ok((await sbx.codeContexts.list()).some((c) => c.id === context.id));
    await sbx.codeContexts.remove(context);
  });

  it("snapshots and restores memory and disk", async () => {
    snapshot = await sbx.snapshot({ labels: { run } });
    const snapshots = new Snapshots(api);
    assert.deepEqual((await snapshots.list({ labels: { run } })).map((s) => s.id), [snapshot.id]);
    assert.equal((await snapshots.get(snapshot.id)).sandbox_id, sbx.id);
    restored = await Sandbox.create({ ...api, fromSnapshot: snapshot.id, metadata: { run, restored: "1" } });
    assert.equal(restored.info.from_snapshot, snapshot.id);
    assert.equal(await restored.files.readText("/work/ts/hello.txt"), "hello from ts");
    assert.equal((await restored.runCode("x")).text, "41"); // the kernel's memory came back too
    await restored.kill();
    await assert.rejects(Sandbox.get(restored.id, api), NotFound);
  });

  it("forks a tree of children from one snapshot", async () => {
    await sbx.exec("echo parent-state > /work/ts/state");
    tree = await sbx.forkTree({ count: 1, metadata: { run } });
    assert.equal(tree.children.length, 1, JSON.stringify(tree.errors));
    const child = tree.children[0]!;
    assert.equal((await child.exec("cat /work/ts/state")).stdout, "parent-state\n");
    await child.exec("echo child > /work/ts/state");
    assert.equal((await sbx.exec("cat /work/ts/state")).stdout, "parent-state\n");
    const promoted = await tree.promote(child);
    assert.equal(promoted.winner, child.id);
    await child.kill();
  });

  it("raises the API's errors as their classes", async () => {
    await assert.rejects(Sandbox.connect("sbx-does-not-exist", api), NotFound);
    await assert.rejects(Sandbox.list({ apiUrl, apiKey: "not-a-key" }), Unauthorized);
    await assert.rejects(sbx.forkTree({ count: 99 }), InvalidArgument);
    await sbx.pause();
    try {
      const refused = await sbx.exec("echo while paused").catch((e: unknown) => e);
      assert.ok(refused instanceof StateError, String(refused));
      assert.equal(refused.state, "paused");
    } finally {
      await sbx.resume();
    }
    assert.equal((await sbx.exec("echo back")).stdout, "back\n");
  });

  it("retries refusals (429 with Retry-After) until the server answers", async () => {
    let refusals = 2;
    const proxy = createServer((req: IncomingMessage, res: ServerResponse) => {
      if (refusals > 0) {
        refusals--;
        res.writeHead(429, { "Content-Type": "application/json", "Retry-After": "0.2" });
        res.end(JSON.stringify({ error: "rate limited (test proxy)", code: "rate_limited" }));
        return;
      }
      const target = new URL(req.url ?? "/", apiUrl);
      const forward = httpRequest(target, { method: req.method, headers: { ...req.headers, host: target.host } }, (up) => {
        res.writeHead(up.statusCode ?? 502, up.headers);
        up.pipe(res);
      });
      req.pipe(forward);
    });
    await new Promise<void>((resolve) => proxy.listen(0, "127.0.0.1", resolve));
    try {
      const slept: number[] = [];
      const viaProxy = await Sandbox.connect(sbx.id, {
        apiUrl: `http://127.0.0.1:${(proxy.address() as AddressInfo).port}`,
        apiKey,
        retry: {
          random: () => 0,
          sleep: async (ms) => {
            slept.push(ms);
            await new Promise((resolve) => setTimeout(resolve, ms));
          },
        },
      });
      assert.equal(viaProxy.id, sbx.id);
      assert.deepEqual(slept, [200, 200]);
      assert.equal((await viaProxy.exec("echo through")).stdout, "through\n");
    } finally {
      proxy.closeAllConnections();
      proxy.close();
    }
  });

  it("kills the sandbox", async () => {
    await sbx.kill();
    assert.equal(sbx.info.status, "stopped");
    await assert.rejects(Sandbox.get(sbx.id, api), NotFound);
    await Sandbox.kill(sbx.id, api); // killing a deleted sandbox is not an error
  });
});
