// An application written against E2B's JavaScript SDK (npm `e2b`, pinned) building a template with its `Template`
// builder, unchanged, against `cryobox serve` (same variables as e2b_app.mjs). It builds on cryobox's `base`
// template (`fromTemplate`: no image to pull), then starts a sandbox of the new template. Prints one JSON report
// (report.mjs); the sandbox is killed in `finally`.

import { Sandbox, Template } from 'e2b'

import { REPORT, runApp, step } from './report.mjs'

const NAME = `e2b-js-tpl-${process.env.E2B_JS_RUN ?? Date.now()}`

async function main() {
  const logs = []
  await step('exists_before', () => Template.exists(NAME))
  const template = Template()
    .fromTemplate('base')
    .makeDir('/opt/js')
    .runCmd('echo built-by-js > /opt/js/built')
    .setEnvs({ MODE: 'js' })
    .setWorkdir('/opt/js')
  await step('build', async () => {
    const info = await Template.build(template, NAME, { cpuCount: 1, memoryMB: 512, onBuildLogs: (e) => logs.push(e.message) })
    return { templateId: info.templateId, buildId: Boolean(info.buildId), tags: info.tags }
  })
  REPORT.logs_finished = logs.includes('Build finished')
  await step('exists_after', () => Template.exists(NAME))
  await step('tags', async () => {
    await Template.assignTags(`${NAME}:default`, ['stable'])
    return (await Template.getTags(NAME)).map((t) => t.tag).sort()
  })
  await step('unknown_tag', async () => {
    try {
      await Sandbox.create(`${NAME}:no-such-tag`)
      return { created: true }
    } catch (err) {
      return { class: err.constructor.name, message: err.message }
    }
  })
  const sbx = await step('create', () => Sandbox.create(`${NAME}:stable`))
  try {
    if (!sbx) return 1
    await step('template_id', async () => (await sbx.getInfo()).templateId)
    await step('run', async () => (await sbx.commands.run('cat built; echo $MODE; pwd')).stdout)
    await step('kill', () => sbx.kill())
  } finally {
    if (sbx) await sbx.kill().catch(() => undefined)
  }
  return 0
}

runApp(main)
