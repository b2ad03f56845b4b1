import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { HostUnavailable, QuotaExceeded, Sandbox, WorkspaceQuotaExceeded, parseRetryAfter } from "../../src/index.js";
import type { RetryPolicy } from "../../src/index.js";
import { ScriptedServer, json } from "./server.js";

const SANDBOX = { id: "sbx-r", template: "base", status: "running" };

/** A retry policy on a fake clock: sleeps advance it and are recorded, jitter is `random()`'s fraction. */
function fakeRetry(budgetMs: number, random = 0): { policy: Partial<RetryPolicy>; slept: number[] } {
  let now = 0;
  const slept: number[] = [];
  return {
    slept,
    policy: {
      budgetMs,
      random: () => random,
      now: () => now,
      sleep: async (ms: number) => {
        slept.push(ms);
        now += ms;
      },
    },
  };
}

describe("retries of refusals", () => {
  const server = new ScriptedServer();
  before(() => server.start());
  after(() => server.stop());

  it("retries 429 and 503 refusals after Retry-After plus jitter, then succeeds", async () => {
    const { policy, slept } = fakeRetry(60_000, 0.5);
    server.answer(
      json(429, { error: "rate limited", code: "rate_limited" }, { "Retry-After": "2" }),
      json(503, { error: "no capacity", code: "capacity" }, { "Retry-After": "1" }),
      json(201, SANDBOX),
    );
    const before = server.seen.length;
    const sbx = await Sandbox.create({ apiUrl: server.url, retry: policy, metadata: { a: "b" } });
    assert.equal(sbx.id, "sbx-r");
    // jitter caps 1 s then 2 s; random() = 0.5 of them
    assert.deepEqual(slept, [2000 + 500, 1000 + 1000]);
    const bodies = server.seen.slice(before).map((seen) => seen.body);
    assert.equal(bodies.length, 3);
    assert.ok(bodies.every((body) => body === bodies[0]), "every attempt sends the same request");
  });

  it("gives up when the next wait would overrun the budget, raising the last refusal", async () => {
    const { policy, slept } = fakeRetry(5_000);
    server.answer(
      json(503, { error: "no capacity", code: "capacity" }, { "Retry-After": "3" }),
      json(503, { error: "still none", code: "capacity" }, { "Retry-After": "3" }),
    );
    const error = await Sandbox.create({ apiUrl: server.url, retry: policy }).catch((e: unknown) => e);
    assert.ok(error instanceof HostUnavailable);
    assert.equal(error.message, "still none");
    assert.equal(error.retryAfterS, 3);
    assert.deepEqual(slept, [3000]);
  });

  it("does not retry what waiting cannot fix, nor a proxy's bare 503, nor without Retry-After", async () => {
    const { policy, slept } = fakeRetry(60_000);
    server.answer(json(429, { error: "3 of 3 sandboxes", code: "quota_exceeded" }, { "Retry-After": "1" }));
    await assert.rejects(Sandbox.create({ apiUrl: server.url, retry: policy }), WorkspaceQuotaExceeded);
    server.answer((_req, res) => void res.writeHead(503, { "Retry-After": "1" }).end("<html>down</html>"));
    await assert.rejects(Sandbox.create({ apiUrl: server.url, retry: policy }), HostUnavailable);
    server.answer(json(429, { error: "rate limited", code: "rate_limited" }));
    await assert.rejects(Sandbox.create({ apiUrl: server.url, retry: policy }), QuotaExceeded);
    assert.deepEqual(slept, []);
  });

  it("budgetMs 0 disables retrying", async () => {
    const { policy, slept } = fakeRetry(0);
    server.answer(json(429, { error: "rate limited", code: "rate_limited" }, { "Retry-After": "1" }));
    await assert.rejects(Sandbox.create({ apiUrl: server.url, retry: policy }), QuotaExceeded);
    assert.deepEqual(slept, []);
  });

  it("an abort during the wait ends the call", async () => {
    server.answer(json(429, { error: "rate limited", code: "rate_limited" }, { "Retry-After": "30" }));
    const controller = new AbortController();
    const call = Sandbox.create({ apiUrl: server.url, signal: controller.signal });
    setTimeout(() => controller.abort(), 100);
    const started = performance.now();
    const error = await call.catch((e: unknown) => e);
    assert.ok(error instanceof DOMException && error.name === "AbortError", String(error));
    assert.ok(performance.now() - started < 5000);
  });

  it("parses Retry-After as seconds or an HTTP date", () => {
    assert.equal(parseRetryAfter("2"), 2000);
    assert.equal(parseRetryAfter("0.5"), 500);
    assert.equal(parseRetryAfter(null), undefined);
    assert.equal(parseRetryAfter("soon"), undefined);
    const now = Date.parse("Sun, 06 Dec 2026 01:00:00 GMT");
    assert.equal(parseRetryAfter("Sun, 06 Dec 2026 01:00:04 GMT", now), 4000);
    assert.equal(parseRetryAfter("Sun, 06 Dec 2026 00:59:00 GMT", now), 0);
  });
});
