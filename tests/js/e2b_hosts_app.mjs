// An application written against E2B's JavaScript SDK (npm `e2b`, pinned), run unchanged against `cryobox serve`
// set up as E2B itself is: only E2B_API_URL, E2B_DOMAIN and E2B_API_KEY (no E2B_SANDBOX_URL), so envd is
// https://49983-{id}.{domain} (HTTPS, where the SDK's undici agent offers HTTP/2) and `getHost(port)` is
// {port}-{id}.{domain}. It trusts the test CA through node's own NODE_EXTRA_CA_CERTS, as any user of a private CA
// would. Prints one JSON report (report.mjs); one sandbox, killed in `finally`.

import { Sandbox } from 'e2b'

import { REPORT, runApp, sleep, step } from './report.mjs'

const PAGE = '<h1>from the guest, by its host</h1>\n'
const PORT = 8000

async function fetchUntilUp(url, deadlineMs) {
  const deadline = Date.now() + deadlineMs
  for (;;) {
    try {
      const response = await fetch(url)
      if (response.status === 200) return { status: response.status, body: await response.text() }
      if (Date.now() > deadline) return { status: response.status, body: await response.text() }
    } catch (err) {
      if (Date.now() > deadline) throw err
    }
    await sleep(500)
  }
}

async function main() {
  const sbx = await step('create', () => Sandbox.create({ timeoutMs: 600_000, metadata: { app: 'e2b-js-hosts' } }))
  try {
    if (!sbx) return 1
    REPORT.sandbox_id = sbx.sandboxId
    REPORT.domain = sbx.sandboxDomain
    REPORT.envd_url = sbx.envdApiUrl
    REPORT.host = sbx.getHost(PORT)
    await step('run', async () => (await sbx.commands.run('echo out; echo err >&2')).stdout)
    await step('on_stdout', async () => {
      const chunks = []
      await sbx.commands.run('echo a; sleep 0.2; echo b', { onStdout: (data) => chunks.push(data) })
      return chunks.join('')
    })
    await step('write', async () => (await sbx.files.write('/tmp/www/index.html', PAGE)).path)
    await step('read', async () => await sbx.files.read('/tmp/www/index.html'))
    await step('list', async () => (await sbx.files.list('/tmp/www')).map((e) => e.name))
    await step('signed_urls', async () => {
      // the sandbox's own host: a plain fetch, no key, no token, no header
      const upload = await sbx.uploadUrl('/tmp/www/up.txt')
      const form = new FormData()
      form.append('file', new Blob(['signed upload\n']), 'up.txt')
      const uploaded = await fetch(upload, { method: 'POST', body: form })
      const download = await sbx.downloadUrl('/tmp/www/up.txt')
      const downloaded = await fetch(download)
      const unsigned = await fetch(`${sbx.envdApiUrl}/files?path=/tmp/www/up.txt`)
      return { host: new URL(download).host, upload: uploaded.status, download: downloaded.status, body: await downloaded.text(), unsigned: unsigned.status }
    })
    await step('watch', async () => {
      const names = []
      const handle = await sbx.files.watchDir('/tmp/www', (e) => names.push(`${e.name}:${e.type}`))
      await sbx.commands.run('touch /tmp/www/touched')
      const deadline = Date.now() + 20000
      while (Date.now() < deadline && !names.includes('touched:create')) await sleep(100)
      await handle.stop()
      return names.includes('touched:create')
    })
    await step('pty', async () => {
      const chunks = []
      const handle = await sbx.pty.create({ cols: 80, rows: 24, onData: (data) => chunks.push(new TextDecoder().decode(data)) })
      await sbx.pty.sendInput(handle.pid, new TextEncoder().encode('echo pty-$((6*7))\n'))
      const deadline = Date.now() + 20000
      while (Date.now() < deadline && !chunks.join('').includes('pty-42')) await sleep(100)
      await sbx.pty.kill(handle.pid)
      return chunks.join('').includes('pty-42')
    })
    await step('serve', async () => (await sbx.commands.run(`python3 -m http.server ${PORT}`, { cwd: '/tmp/www', background: true })).pid)
    await step('get_host', async () => await fetchUntilUp(`https://${sbx.getHost(PORT)}/index.html`, 120000))
    await step('connect', async () => (await (await Sandbox.connect(sbx.sandboxId)).commands.run('echo again')).stdout)
    await step('kill', () => sbx.kill())
  } finally {
    if (sbx) await sbx.kill().catch(() => undefined)
  }
  return 0
}

runApp(main)
