// exec("true") through the TypeScript SDK: p50 / p95 over RUNS runs (after WARMUP) on one sandbox of TEMPLATE.
// Needs the built SDK (`npm run build`) and CRYOBOX_API_URL / CRYOBOX_API_KEY. Prints one JSON line.
// SANDBOX_ID: run on that sandbox (left running) instead of a new one, e.g. to compare SDKs on one sandbox.
import { Sandbox } from "../dist/index.js";

const RUNS = Number(process.env.RUNS ?? 30);
const WARMUP = Number(process.env.WARMUP ?? 3);
const TEMPLATE = process.env.TEMPLATE ?? "base";

function percentile(sorted, p) {
  const at = (sorted.length - 1) * p;
  const low = Math.floor(at);
  const high = Math.ceil(at);
  return sorted[low] + (sorted[high] - sorted[low]) * (at - low);
}

const given = process.env.SANDBOX_ID;
const sbx = given
  ? await Sandbox.connect(given)
  : await Sandbox.create({ template: TEMPLATE, ttlSeconds: 600, metadata: { bench: "run_true" } });
try {
  const ms = [];
  for (let i = 0; i < WARMUP + RUNS; i++) {
    const started = performance.now();
    const result = await sbx.exec("true");
    const took = performance.now() - started;
    if (result.exitCode !== 0) throw new Error(`true exited ${result.exitCode}`);
    if (i >= WARMUP) ms.push(took);
  }
  ms.sort((a, b) => a - b);
  const round = (x) => Math.round(x * 10) / 10;
  console.log(JSON.stringify({
    sdk: "cryobox-typescript",
    node: process.version,
    template: sbx.info.template,
    runs: RUNS,
    p50_ms: round(percentile(ms, 0.5)),
    p95_ms: round(percentile(ms, 0.95)),
    min_ms: round(ms[0]),
    max_ms: round(ms[ms.length - 1]),
  }));
} finally {
  if (!given) await sbx.kill();
}
