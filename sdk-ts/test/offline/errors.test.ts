import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import {
  CryoboxError,
  ERRORS_BY_CODE,
  GuestError,
  HostUnavailable,
  ImageTooLarge,
  InvalidArgument,
  NotFound,
  PayloadTooLarge,
  PortUnreachable,
  QuotaExceeded,
  Sandbox,
  SandboxTimeout,
  StateError,
  StoreError,
  StoreThrottled,
  Unauthorized,
  WorkspaceQuotaExceeded,
  errorFromBody,
} from "../../src/index.js";
import { ScriptedServer, json } from "./server.js";

describe("errors by wire code", () => {
  it("maps every code to its class, with message, details and status", () => {
    const error = errorFromBody({ error: "sandbox is paused", code: "wrong_state", details: { state: "paused", required: "running" } }, 409);
    assert.ok(error instanceof StateError && error instanceof CryoboxError);
    assert.equal(error.message, "sandbox is paused");
    assert.equal(error.code, "wrong_state");
    assert.equal(error.status, 409);
    assert.equal(error.state, "paused");
    assert.equal(error.required, "running");
    assert.ok(errorFromBody({ error: "x", code: "image_too_large" }, 413) instanceof ImageTooLarge);
    assert.ok(errorFromBody({ error: "x", code: "image_too_large" }, 413) instanceof PayloadTooLarge);
    assert.ok(errorFromBody({ error: "x", code: "store_throttled" }, 503) instanceof StoreThrottled);
    assert.ok(errorFromBody({ error: "x", code: "quota_exceeded" }, 429) instanceof WorkspaceQuotaExceeded);
    for (const [code, cls] of ERRORS_BY_CODE) {
      const made = errorFromBody({ error: "m", code }, 418);
      assert.equal(made.constructor, cls, code);
      assert.equal(made.code, code);
    }
  });

  it("maps a body without a known code by its status where that is unambiguous", () => {
    assert.ok(errorFromBody("<html>bad gateway</html>", 404) instanceof NotFound);
    assert.ok(errorFromBody(undefined, 401) instanceof Unauthorized);
    assert.ok(errorFromBody({ error: "full" }, 503) instanceof HostUnavailable);
    assert.equal(errorFromBody(undefined, 502).constructor, CryoboxError); // the guest, a port, the store: ambiguous
    assert.ok(errorFromBody({ error: "x", code: "port_unreachable" }, 502) instanceof PortUnreachable);
    assert.ok(errorFromBody({ error: "x", code: "guest_error" }, 502) instanceof GuestError);
    assert.ok(errorFromBody({ error: "x", code: "store_error" }, 502) instanceof StoreError);
    const plain = errorFromBody(undefined, 500);
    assert.equal(plain.constructor, CryoboxError);
    assert.equal(plain.message, "HTTP 500");
  });

  it("keeps Retry-After on the refusals", () => {
    const error = errorFromBody({ error: "slow down", code: "rate_limited" }, 429, 7);
    assert.ok(error instanceof QuotaExceeded);
    assert.equal(error.retryAfterS, 7);
  });
});

describe("errors from a server", () => {
  const server = new ScriptedServer();
  before(() => server.start());
  after(() => server.stop());

  it("raises the class of an error response and sends the key", async () => {
    server.answer(json(404, { error: "no sandbox sbx-1", code: "not_found", details: { id: "sbx-1" } }));
    const failure = await Sandbox.connect("sbx-1", { apiUrl: server.url, apiKey: "k-123" }).catch((e: unknown) => e);
    assert.ok(failure instanceof NotFound);
    assert.deepEqual(failure.details, { id: "sbx-1" });
    const seen = server.seen.at(-1);
    assert.equal(seen?.url, "/v1/sandboxes/sbx-1");
    assert.equal(seen?.headers.authorization, "Bearer k-123");
    assert.equal(seen?.headers["user-agent"], "cryobox-typescript");
  });

  it("takes the URL and key from CRYOBOX_API_URL / CRYOBOX_API_KEY", async () => {
    const saved = { url: process.env["CRYOBOX_API_URL"], key: process.env["CRYOBOX_API_KEY"] };
    process.env["CRYOBOX_API_URL"] = `${server.url}/`;
    process.env["CRYOBOX_API_KEY"] = "from-env";
    try {
      server.answer(json(200, { items: [] }));
      assert.deepEqual(await Sandbox.list({ metadata: { job: "a b" }, status: "running" }), []);
      const seen = server.seen.at(-1);
      assert.equal(seen?.url, "/v1/sandboxes?status=running&metadata.job=a+b");
      assert.equal(seen?.headers.authorization, "Bearer from-env");
    } finally {
      for (const [name, value] of [["CRYOBOX_API_URL", saved.url], ["CRYOBOX_API_KEY", saved.key]] as const) {
        if (value === undefined) delete process.env[name];
        else process.env[name] = value;
      }
    }
  });

  it("raises InvalidArgument before sending a bad port, and CommandFailed for check", async () => {
    server.answer(json(201, { id: "s1", template: "base", status: "running" }));
    const sbx = await Sandbox.create({ apiUrl: server.url, template: "base" });
    assert.throws(() => sbx.portUrl(70000), InvalidArgument);
    assert.equal(sbx.portUrl(8080, "x"), `${server.url}/v1/sandboxes/s1/ports/8080/x`);
    server.answer(json(200, { stdout: "", stderr: "nope\n", exit_code: 3, duration_ms: 1 }));
    const failed = await sbx.exec("false", { check: true }).catch((e: unknown) => e);
    assert.ok(failed instanceof CryoboxError && failed.code === "command_failed");
    assert.equal((failed as unknown as { exitCode: number }).exitCode, 3);
    const body = JSON.parse(server.seen.at(-1)?.body ?? "{}") as Record<string, unknown>;
    assert.deepEqual(body, { cmd: "false", timeout_seconds: 60, env: {}, cwd: null, stdin: null });
  });

  it("is a HostUnavailable when nothing listens, and a TimeoutError past the deadline", async () => {
    const closed = new ScriptedServer();
    await closed.start();
    const url = closed.url;
    await closed.stop();
    const refused = await Sandbox.connect("x", { apiUrl: url }).catch((e: unknown) => e);
    assert.ok(refused instanceof HostUnavailable, String(refused));
    server.answer((_req, res) => {
      setTimeout(() => res.writeHead(200).end("{}"), 2000);
    });
    const started = performance.now();
    const late = await Sandbox.connect("x", { apiUrl: server.url, timeoutMs: 100 }).catch((e: unknown) => e);
    assert.ok(late instanceof DOMException && late.name === "TimeoutError", String(late));
    assert.ok(performance.now() - started < 1500);
  });

  it("maps an exec timeout (504) to SandboxTimeout", async () => {
    server.answer(json(201, { id: "s2", template: "base", status: "running" }));
    server.answer(json(504, { error: "command timed out after 1s", code: "timeout" }));
    const sbx = await Sandbox.create({ apiUrl: server.url });
    await assert.rejects(sbx.exec("sleep 9", { timeoutSeconds: 1 }), SandboxTimeout);
  });
});
