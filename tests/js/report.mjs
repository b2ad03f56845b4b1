// The report an E2B JS application prints for its test: one JSON line, each step's value (or the error it threw,
// as {error, class, trace}) under its name, so one broken method never hides the others.

export const REPORT = { _ms: {} }

export async function step(name, fn) {
  const started = performance.now()
  try {
    const value = await fn()
    REPORT[name] = value === undefined ? null : plain(value) ? value : `<${value.constructor.name}>`
    REPORT._ms[name] = Math.round(performance.now() - started)
    return value
  } catch (err) {
    REPORT[name] = { error: `${err?.name ?? typeof err}: ${err?.message ?? err}`, class: err?.constructor?.name, trace: String(err?.stack ?? '').split('\n').slice(0, 6).join('\n') }
    return undefined
  }
}

const plain = (value) => typeof value !== 'object' || value === null || [Object, Array].includes(value.constructor)

// The report, then exit: the SDK leaves request-timeout timers armed (up to its 60 s default) that would keep node
// running long after the last step.
export function printAndExit(code) {
  process.stdout.write(JSON.stringify(REPORT) + '\n', () => process.exit(code))
}

// Run an application's main() (its exit code) and print the report, a thrown error recorded as `fatal`.
export function runApp(main) {
  main()
    .catch((err) => {
      REPORT.fatal = String(err?.stack ?? err)
      return 1
    })
    .then(printAndExit)
}

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

export async function until(check, timeoutMs = 20000, everyMs = 100) {
  const deadline = Date.now() + timeoutMs
  while (Date.now() < deadline) {
    if (await check()) return true
    await sleep(everyMs)
  }
  return false
}
