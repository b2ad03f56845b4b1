// An application written against E2B's JavaScript SDK (npm `e2b`, pinned in package.json), run unchanged against
// `cryobox serve` by tests/integration/compat/e2b_js: it sees only the environment a user of a self-hosted E2B
// sets (E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY) and prints one JSON report (report.mjs) the test asserts.
//
// Sandboxes: one made with metadata/envs/timeout that every step uses, one restored from its snapshot, one fork
// child; all killed in `finally`.

import { CommandExitError, FilesystemEventType, NotFoundError, Sandbox, TimeoutError, Volume } from 'e2b'

import { REPORT, runApp, sleep, step, until } from './report.mjs'

const RUN = process.env.E2B_JS_RUN ?? String(Date.now())
const decode = (bytes) => new TextDecoder().decode(bytes)

async function commands(sbx) {
  await step('run', async () => {
    const r = await sbx.commands.run('echo out; echo err >&2; exit 0')
    return { stdout: r.stdout, stderr: r.stderr, exitCode: r.exitCode }
  })
  await step('run_failing', async () => {
    try {
      await sbx.commands.run('echo partial; echo oops >&2; exit 7')
      return { raised: false }
    } catch (err) {
      return { class: err.constructor.name, isCommandExitError: err instanceof CommandExitError, exitCode: err.exitCode, stdout: err.stdout, stderr: err.stderr }
    }
  })
  await step('callbacks', async () => {
    const out = []
    const errs = []
    const r = await sbx.commands.run('for i in 1 2 3; do echo line$i; echo warn$i >&2; done', {
      onStdout: (data) => out.push(data),
      onStderr: (data) => errs.push(data),
    })
    return { stdout: out.join(''), stderr: errs.join(''), result: r.stdout }
  })
  await step('envs_cwd', async () => (await sbx.commands.run('echo $GREETING $(pwd)', { envs: { GREETING: 'hi' }, cwd: '/tmp' })).stdout)
  await step('sandbox_env', async () => (await sbx.commands.run('echo $FROM_CREATE')).stdout)
  await step('whoami', async () => (await sbx.commands.run('whoami')).stdout.trim())
  await step('as_root', async () => (await sbx.commands.run('whoami', { user: 'root' })).stdout.trim())
  await step('background', async () => {
    const handle = await sbx.commands.run('sleep 600', { background: true })
    const listed = (await sbx.commands.list()).map((p) => p.pid)
    const killed = await handle.kill()
    const after = (await sbx.commands.list()).map((p) => p.pid)
    let killedWait
    try {
      killedWait = { result: (await handle.wait()).exitCode }
    } catch (err) {
      killedWait = { class: err.constructor.name, exitCode: err.exitCode }
    }
    const quick = await sbx.commands.run('sleep 1; echo bg-done; exit 3', { background: true })
    let waited
    try {
      waited = { raised: false, result: await quick.wait() }
    } catch (err) {
      waited = { class: err.constructor.name, exitCode: err.exitCode, stdout: err.stdout }
    }
    const ok = await sbx.commands.run('echo fine', { background: true })
    const okResult = await ok.wait()
    return {
      listed: listed.includes(handle.pid),
      killed,
      gone: !after.includes(handle.pid),
      killedWait,
      waited,
      ok: { exitCode: okResult.exitCode, stdout: okResult.stdout },
      killAgain: await sbx.commands.kill(handle.pid),
    }
  })
  await step('stdin', async () => {
    const handle = await sbx.commands.run('read line; echo got:$line', { background: true, stdin: true })
    await sbx.commands.sendStdin(handle.pid, 'typed\n')
    return (await handle.wait()).stdout
  })
  await step('close_stdin', async () => {
    const handle = await sbx.commands.run('cat', { background: true, stdin: true })
    await sbx.commands.sendStdin(handle.pid, 'abc')
    await sbx.commands.closeStdin(handle.pid)
    return (await handle.wait()).stdout
  })
  await step('listed_process', async () => {
    const handle = await sbx.commands.run('sleep 30', { background: true, envs: { A: '1' }, cwd: '/tmp' })
    const seen = (await sbx.commands.list()).find((p) => p.pid === handle.pid)
    await handle.kill()
    return seen
  })
  await step('disconnect_reconnect', async () => {
    const handle = await sbx.commands.run('sleep 1; echo x', { background: true })
    await handle.disconnect()
    return (await (await sbx.commands.connect(handle.pid)).wait()).stdout
  })
  await step('connect_process', async () => {
    const handle = await sbx.commands.run('sleep 1; echo later', { background: true })
    const chunks = []
    const again = await sbx.commands.connect(handle.pid, { onStdout: (data) => chunks.push(data) })
    const result = await again.wait()
    return { stdout: result.stdout, streamed: chunks.join('') }
  })
  await step('command_timeout', async () => {
    const started = Date.now()
    try {
      await sbx.commands.run('sleep 30', { timeoutMs: 2000 })
      return { raised: false }
    } catch (err) {
      return { class: err.constructor.name, isTimeout: err instanceof TimeoutError, seconds: Math.round((Date.now() - started) / 1000) }
    }
  })
  await step('pty', async () => {
    const chunks = []
    const handle = await sbx.pty.create({ cols: 80, rows: 24, onData: (data) => chunks.push(decode(data)) })
    await sbx.pty.resize(handle.pid, { cols: 120, rows: 40 })
    await sbx.pty.sendInput(handle.pid, new TextEncoder().encode('stty size; echo pty-$((6*7))\n'))
    const seen = await until(() => chunks.join('').includes('pty-42') && chunks.join('').includes('40 120'), 20000)
    const listed = (await sbx.commands.list()).some((p) => p.pid === handle.pid)
    const killed = await sbx.pty.kill(handle.pid)
    let ended
    try {
      ended = { exitCode: (await handle.wait()).exitCode }
    } catch (err) {
      ended = { class: err.constructor.name }
    }
    const text = chunks.join('')
    return { seen, size: text.includes('40 120'), echo: text.includes('pty-42'), listed, killed, ended }
  })
  await step('pty_reconnect', async () => {
    const first = await sbx.pty.create({ cols: 80, rows: 24, onData: () => undefined })
    await first.disconnect()
    const chunks = []
    await sbx.pty.connect(first.pid, { onData: (data) => chunks.push(decode(data)) })
    await sbx.pty.sendInput(first.pid, new TextEncoder().encode('echo again-$((2*21))\n'))
    const seen = await until(() => chunks.join('').includes('again-42'))
    await sbx.pty.kill(first.pid)
    return seen
  })
}

async function files(sbx) {
  const base = '/home/user/e2bjs'
  await step('make_dir', async () => [await sbx.files.makeDir(base), await sbx.files.makeDir(base)])
  const blob = new Uint8Array(256 * 64).map((_, i) => i % 256)
  await step('write_text', async () => (await sbx.files.write(`${base}/hello.txt`, 'hello e2b js')).path)
  await step('write_bytes', async () => (await sbx.files.write(`${base}/blob.bin`, blob.buffer)).path)
  await step('write_many', async () =>
    (await sbx.files.write([{ path: `${base}/many/a.txt`, data: 'A' }, { path: `${base}/many/b.txt`, data: 'B' }])).map((e) => e.path).sort(),
  )
  await step('write_stream', async () => {
    const stream = new ReadableStream({
      start(controller) {
        for (let i = 0; i < 4; i++) controller.enqueue(new TextEncoder().encode(`chunk${i}\n`))
        controller.close()
      },
    })
    return (await sbx.files.write(`${base}/many/streamed.txt`, stream)).path
  })
  await step('read_stream', async () => {
    const chunks = []
    for await (const chunk of await sbx.files.read(`${base}/many/streamed.txt`, { format: 'stream' })) chunks.push(decode(chunk))
    return chunks.join('')
  })
  await step('read_text', async () => await sbx.files.read(`${base}/hello.txt`))
  await step('read_bytes', async () => {
    const got = await sbx.files.read(`${base}/blob.bin`, { format: 'bytes' })
    return { type: got.constructor.name, length: got.length, equal: got.length === blob.length && got.every((b, i) => b === blob[i]) }
  })
  await step('read_blob', async () => (await (await sbx.files.read(`${base}/many/a.txt`, { format: 'blob' })).text()))
  await step('read_relative', async () => await sbx.files.read('e2bjs/many/b.txt'))
  await step('list', async () => (await sbx.files.list(base)).map((e) => `${e.name}:${e.type}`).sort())
  await step('exists', async () => [await sbx.files.exists(`${base}/hello.txt`), await sbx.files.exists(`${base}/nope`)])
  await step('get_info', async () => {
    const e = await sbx.files.getInfo(`${base}/hello.txt`)
    return { name: e.name, type: e.type, size: e.size, owner: e.owner, path: e.path }
  })
  await step('rename', async () => (await sbx.files.rename(`${base}/hello.txt`, `${base}/renamed.txt`)).name)
  await step('owner_of_written', async () => (await sbx.commands.run(`stat -c %U ${base}/renamed.txt`)).stdout.trim())
  await step('read_missing', async () => {
    try {
      await sbx.files.read(`${base}/nope`)
      return { raised: false }
    } catch (err) {
      return { class: err.constructor.name, isNotFound: err instanceof NotFoundError }
    }
  })
  await step('watch', async () => {
    const events = []
    const handle = await sbx.files.watchDir(base, (e) => events.push([e.name, e.type]))
    await sbx.files.write(`${base}/watched.txt`, 'x')
    await sbx.files.remove(`${base}/watched.txt`)
    const seen = await until(() => events.some(([name, type]) => name === 'watched.txt' && type === FilesystemEventType.REMOVE))
    await handle.stop()
    return { seen, events }
  })
  await step('signed_urls', async () => {
    // the sandbox URL routes by E2B's header (a URL of its own would not need it: see e2b_hosts_app.mjs)
    const headers = { 'E2b-Sandbox-Id': sbx.sandboxId }
    const upload = await sbx.uploadUrl(`${base}/up.txt`)
    const form = new FormData()
    form.append('file', new Blob(['signed upload\n']), 'up.txt')
    const uploaded = await fetch(upload, { method: 'POST', body: form, headers })
    const download = await sbx.downloadUrl(`${base}/up.txt`)
    const downloaded = await fetch(download, { headers })
    const tampered = await fetch(download.replace('signature=', 'signature=x'), { headers })
    return {
      signed: new URL(download).searchParams.get('signature')?.startsWith('v1_') ?? false,
      upload: uploaded.status,
      download: downloaded.status,
      body: await downloaded.text(),
      tampered: tampered.status,
    }
  })
  await step('remove', async () => {
    await sbx.files.remove(`${base}/blob.bin`)
    return await sbx.files.exists(`${base}/blob.bin`)
  })
}

async function lifecycle(sbx) {
  await step('sandbox_list', async () => {
    const paginator = Sandbox.list({ query: { metadata: { app: 'e2b-js', run: RUN } } })
    const items = await paginator.nextItems()
    const other = await Sandbox.list({ query: { metadata: { app: 'e2b-js', run: 'no-such-run' } } }).nextItems()
    const running = await Sandbox.list({ query: { state: ['running'] }, limit: 100 }).nextItems()
    const paused = await Sandbox.list({ query: { state: ['paused'], metadata: { run: RUN } } }).nextItems()
    return {
      ids: items.map((s) => s.sandboxId),
      states: items.map((s) => s.state),
      other: other.length,
      hasNext: paginator.hasNext,
      inRunning: running.some((s) => s.sandboxId === sbx.sandboxId),
      paused: paused.length,
    }
  })
  await step('sandbox_info', async () => {
    const info = await sbx.getInfo()
    const seconds = Math.round((info.endAt.getTime() - info.startedAt.getTime()) / 1000)
    return { sandboxId: info.sandboxId, metadata: info.metadata, state: info.state, templateId: info.templateId, seconds }
  })
  await step('set_timeout', async () => {
    const before = (await sbx.getInfo()).endAt.getTime()
    await sbx.setTimeout(600_000)
    const after = (await sbx.getInfo()).endAt.getTime()
    return { movedSeconds: Math.round((after - before) / 1000) }
  })
  await step('is_running', async () => await sbx.isRunning())
  await step('update_network', async () => {
    await sbx.updateNetwork({ denyOut: ['10.0.0.0/8'] })
    const network = (await Sandbox.getInfo(sbx.sandboxId)).network
    await sbx.updateNetwork({})
    return { network, after: (await Sandbox.getInfo(sbx.sandboxId)).network ?? null }
  })
  await step('metrics', async () => {
    let samples = await sbx.getMetrics()
    await until(async () => (samples = await sbx.getMetrics()).length >= 2, 30000, 500)
    const s = samples[samples.length - 1]
    return { count: samples.length, cpuCount: s.cpuCount, memOk: s.memUsed > 0 && s.memUsed < s.memTotal, diskOk: s.diskUsed > 0 && s.diskUsed < s.diskTotal }
  })
  await step('connect', async () => (await (await Sandbox.connect(sbx.sandboxId)).commands.run('echo connected')).stdout)
  await step('pause_connect', async () => {
    await sbx.commands.run('echo kept > /tmp/kept; nohup sleep 900 >/dev/null 2>&1 &')
    const paused = await sbx.pause()
    const state = (await Sandbox.getInfo(sbx.sandboxId)).state
    const runningWhilePaused = await sbx.isRunning().catch((err) => err.constructor.name)
    const back = await Sandbox.connect(sbx.sandboxId)
    const after = (await back.commands.run('cat /tmp/kept; pgrep -x sleep >/dev/null && echo alive')).stdout
    return { paused, state, runningWhilePaused, after, stateAfter: (await Sandbox.getInfo(sbx.sandboxId)).state }
  })
  await step('beta_pause_connect', async () => {
    const paused = await sbx.betaPause()
    const state = (await Sandbox.getInfo(sbx.sandboxId)).state
    await sbx.connect()
    return { paused, state, after: (await sbx.commands.run('cat /tmp/kept')).stdout }
  })
}

async function snapshotsAndFork(sbx, extra) {
  await step('snapshot_restore', async () => {
    await sbx.commands.run('echo 1 > /tmp/count')
    const loop = await sbx.commands.run("sh -c 'while true; do sleep 1; done'", { background: true })
    const snap = await sbx.createSnapshot({ name: `e2b-js-${RUN}` })
    const listed = (await sbx.listSnapshots().nextItems()).map((s) => s.snapshotId)
    const all = (await Sandbox.listSnapshots().nextItems()).map((s) => s.snapshotId)
    const stillRuns = (await sbx.commands.run('cat /tmp/count')).stdout
    const restored = await Sandbox.create(snap.snapshotId)
    extra.push(restored)
    const procs = (await restored.commands.list()).map((p) => p.pid)
    const file = (await restored.commands.run('cat /tmp/count')).stdout
    await restored.commands.run('echo 2 > /tmp/count')
    const original = (await sbx.commands.run('cat /tmp/count')).stdout
    return {
      snapshotId: snap.snapshotId,
      listed: listed.includes(snap.snapshotId),
      listedAll: all.includes(snap.snapshotId),
      stillRuns,
      file,
      processAlive: procs.includes(loop.pid),
      original,
      restoredId: restored.sandboxId !== sbx.sandboxId,
    }
  })
  await step('fork', async () => {
    await sbx.commands.run('echo before-fork > /tmp/forked')
    const children = await sbx.fork({ count: 1 })
    const outs = []
    for (const child of children) {
      if (child instanceof Error) {
        outs.push({ error: `${child.constructor.name}: ${child.message}` })
        continue
      }
      extra.push(child)
      await child.commands.run('echo child > /tmp/forked')
      outs.push({ id: child.sandboxId !== sbx.sandboxId, file: (await child.commands.run('cat /tmp/forked')).stdout })
    }
    return { count: children.length, children: outs, parent: (await sbx.commands.run('cat /tmp/forked')).stdout }
  })
  await step('delete_snapshot', async () => {
    const snapshotId = REPORT.snapshot_restore?.snapshotId
    const deleted = await Sandbox.deleteSnapshot(snapshotId)
    const all = (await Sandbox.listSnapshots().nextItems()).map((s) => s.snapshotId)
    return { deleted, listed: all.includes(snapshotId) }
  })
}

async function volumes() {
  // E2B_VOLUME_API_URL: the volume's content API; then mounted in a sandbox of its own
  const vol = await step('volume_create', () => Volume.create(`e2b-js-${RUN}`))
  if (!vol) return
  try {
    await step('volume_files', async () => {
      await vol.makeDir('/docs')
      await vol.writeFile('/docs/hello.txt', 'from js volume')
      const info = await vol.getInfo('/docs/hello.txt')
      return {
        read: await vol.readFile('/docs/hello.txt'),
        list: (await vol.list('/docs')).map((e) => `${e.name}:${e.type}`),
        exists: [await vol.exists('/docs/hello.txt'), await vol.exists('/nope')],
        info: { name: info.name, size: info.size, type: info.type },
        listed: (await Volume.list()).some((v) => v.volumeId === vol.volumeId),
      }
    })
    await step('volume_mount', async () => {
      const mounted = await Sandbox.create({ volumeMounts: { '/mnt/data': vol } })
      let seen
      let killed
      try {
        seen = (await mounted.commands.run('cat /mnt/data/docs/hello.txt')).stdout
        await mounted.commands.run('echo from-guest > /mnt/data/docs/guest.txt')
      } finally {
        killed = await mounted.kill()
      }
      return { seen, killed, afterKill: await vol.readFile('/docs/guest.txt') }
    })
  } finally {
    await step('volume_destroy', () => Volume.destroy(vol.volumeId))
  }
}

async function main() {
  const extra = []
  const sbx = await step('create', () =>
    Sandbox.create({ metadata: { app: 'e2b-js', run: RUN }, envs: { FROM_CREATE: 'set-at-create' }, timeoutMs: 300_000 }),
  )
  try {
    if (!sbx) return 1
    REPORT.sandbox_id = sbx.sandboxId
    await commands(sbx)
    await files(sbx)
    await lifecycle(sbx)
    await snapshotsAndFork(sbx, extra)
    await volumes()
    for (const other of extra.splice(0)) await step(`kill_${other.sandboxId}`, () => other.kill())
    await step('kill', () => sbx.kill())
    await step('is_running_after_kill', () => sbx.isRunning())
    await step('after_kill', async () => {
      try {
        await Sandbox.getInfo(sbx.sandboxId)
        return { raised: false }
      } catch (err) {
        return { class: err.constructor.name, isNotFound: err instanceof NotFoundError }
      }
    })
    await step('kill_again', () => Sandbox.kill(sbx.sandboxId))
  } finally {
    for (const other of extra) await other.kill().catch(() => undefined)
    if (sbx) await sbx.kill().catch(() => undefined)
  }
  return 0
}

runApp(main)
