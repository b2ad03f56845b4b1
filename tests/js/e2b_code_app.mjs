// An application written against E2B's JavaScript code-interpreter SDK (npm `@e2b/code-interpreter`, pinned),
// run unchanged against `cryobox serve` (same variables as e2b_app.mjs); prints one JSON report (report.mjs).
// One sandbox of the SDK's default template (`code-interpreter-v1`), killed in `finally`.

import { Sandbox } from '@e2b/code-interpreter'

import { REPORT, runApp, sleep, step } from './report.mjs'

async function main() {
  const sbx = await step('create', () => Sandbox.create({ metadata: { app: 'e2b-js-code' } }))
  try {
    if (!sbx) return 1
    REPORT.sandbox_id = sbx.sandboxId
    await step('template', async () => (await sbx.getInfo()).templateId)
    await step('first_1_plus_1', async () => (await sbx.runCode('1+1')).text)
    await step('state', async () => [(await sbx.runCode('x = 41')).error ?? null, (await sbx.runCode('x + 1')).text])
    await step('rich', async () => {
      const frame = (await sbx.runCode("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})")).results[0]
      const plot = (await sbx.runCode('import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()')).results[0]
      const png = Buffer.from(plot.png ?? '', 'base64')
      return {
        frameFormats: frame.formats(),
        htmlTable: (frame.html ?? '').includes('<table'),
        frameText: frame.text ?? null,
        plotFormats: plot.formats(),
        pngSig: png.subarray(0, 8).toString('hex'),
        pngBytes: png.length,
      }
    })
    await step('error', async () => {
      const { error } = await sbx.runCode("raise ValueError('bad value')")
      const after = (await sbx.runCode('x')).text
      return { name: error?.name, value: error?.value, tb: (error?.traceback ?? '').includes('ValueError'), after }
    })
    await step('callbacks', async () => {
      const out = []
      const errs = []
      const results = []
      const execution = await sbx.runCode("import sys\nprint('a'); print('b'); print('e', file=sys.stderr); 7", {
        onStdout: (m) => out.push(m.line),
        onStderr: (m) => errs.push(m.line),
        onResult: (r) => results.push(r.text),
      })
      return { stdout: out.join(''), stderr: errs.join(''), results, logs: execution.logs }
    })
    await step('envs', async () => (await sbx.runCode("import os\nos.environ.get('PER_RUN')", { envs: { PER_RUN: 'yes' } })).text)
    await step('contexts', async () => {
      const ctx = await sbx.createCodeContext({ cwd: '/tmp' })
      const isolated = (await sbx.runCode('x', { context: ctx })).error?.name ?? null
      const cwd = (await sbx.runCode('import os\nos.getcwd()', { context: ctx })).text
      await sbx.runCode("y = 'in ctx'", { context: ctx })
      const kept = (await sbx.runCode('y', { context: ctx })).text
      const listed = (await sbx.listCodeContexts()).map((c) => c.id)
      await step('context_restart', async () => {
        await sbx.restartCodeContext(ctx)
        return (await sbx.runCode('y', { context: ctx })).error?.name ?? null
      })
      await sbx.removeCodeContext(ctx.id)
      const afterRemove = (await sbx.listCodeContexts()).map((c) => c.id)
      return { isolated, cwd, kept, listed: listed.includes(ctx.id), removed: !afterRemove.includes(ctx.id) }
    })
    await step('language_js', async () => {
      try {
        return { text: (await sbx.runCode('1 + 2', { language: 'js' })).text }
      } catch (err) {
        return { class: err.constructor.name, message: err.message }
      }
    })
    await step('timeout_then_works', async () => {
      let raised = null
      try {
        await sbx.runCode('while True: pass', { timeoutMs: 3000 })
      } catch (err) {
        raised = err.constructor.name
      }
      await sleep(500)
      return { raised, after: (await sbx.runCode('x + 2')).text }
    })
    await step('commands_too', async () => (await sbx.commands.run('echo from-envd')).stdout)
    await step('kill', () => sbx.kill())
  } finally {
    if (sbx) await sbx.kill().catch(() => undefined)
  }
  return 0
}

runApp(main)
