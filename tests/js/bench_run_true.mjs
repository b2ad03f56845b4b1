// `commands.run("true")` through E2B's JavaScript SDK (npm `e2b`, pinned): N runs on one sandbox after a few warm-up
// runs, against whatever E2B_API_URL / E2B_SANDBOX_URL / E2B_API_KEY name. Not part of `make test`:
//   E2B_API_URL=$URL/e2b E2B_SANDBOX_URL=$URL/e2b/sandbox E2B_API_KEY=$KEY node tests/js/bench_run_true.mjs [N]
// Prints one JSON line: milliseconds (p50, p95, min, max) over N runs.

import { Sandbox } from 'e2b'

const N = Number(process.argv[2] ?? 30)
const WARMUP = 3

const quantile = (sorted, q) => sorted[Math.min(sorted.length - 1, Math.ceil(q * sorted.length) - 1)]
const round = (ms) => Math.round(ms * 100) / 100

const sbx = await Sandbox.create({ metadata: { app: 'e2b-js-bench' } })
let code = 0
try {
  for (let i = 0; i < WARMUP; i++) await sbx.commands.run('true')
  const ms = []
  for (let i = 0; i < N; i++) {
    const started = performance.now()
    await sbx.commands.run('true')
    ms.push(performance.now() - started)
  }
  ms.sort((a, b) => a - b)
  const out = { sdk: 'e2b-js 2.51.0', n: N, p50: round(quantile(ms, 0.5)), p95: round(quantile(ms, 0.95)), min: round(ms[0]), max: round(ms[N - 1]) }
  process.stdout.write(JSON.stringify(out) + '\n')
} catch (err) {
  console.error(err)
  code = 1
} finally {
  await sbx.kill()
}
process.exit(code)
