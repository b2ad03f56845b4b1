// A sandbox's usage and log on its page: a small inline SVG chart of CPU and memory from its samples
// (GET /v1/sandboxes/{id}/metrics, refreshed every few seconds while the page is open) and its log, newest first
// (GET /v1/sandboxes/{id}/logs?direction=backward). No chart library: two polylines on a 0–100 % scale.
import { errorText, sbxPath } from "./api.js";
import { fmtBytes, fmtTime, h, replace, table } from "./dom.js";

export const CHART = { width: 600, height: 120, pad: 4 };
export const WINDOW_S = 15 * 60;
export const REFRESH_MS = 5000;
export const LOG_LIMIT = 50;
const SVG = "http://www.w3.org/2000/svg";

/** [[t, cpu %]] and [[t, memory used % of total]] from the API's samples (oldest first). */
export function usageSeries(samples) {
  const cpu = [];
  const memory = [];
  for (const s of samples || []) {
    cpu.push([s.timestamp, clamp(s.cpu_pct)]);
    memory.push([s.timestamp, s.mem_total > 0 ? clamp((100 * s.mem_used) / s.mem_total) : 0]);
  }
  return { cpu, memory };
}

function clamp(pct) {
  const value = Number(pct);
  return Number.isFinite(value) ? Math.min(100, Math.max(0, value)) : 0;
}

/** The polyline `points` of [[t, pct]] between t0 and t1 in a chart of `size` (0 % at the bottom). */
export function polyline(points, t0, t1, size = CHART) {
  const span = Math.max(1e-9, t1 - t0);
  const inner = { w: size.width - 2 * size.pad, h: size.height - 2 * size.pad };
  return points
    .map(([t, pct]) => {
      const x = size.pad + (inner.w * (t - t0)) / span;
      const y = size.pad + inner.h * (1 - pct / 100);
      return `${x.toFixed(1)},${y.toFixed(1)}`;
    })
    .join(" ");
}

/** One line saying the newest sample's figures. */
export function latestText(sample) {
  if (!sample) return "no samples yet (a running sandbox is sampled every few seconds)";
  const guest = `${fmtBytes(sample.mem_used)} of ${fmtBytes(sample.mem_total)}${sample.guest_view ? "" : " (host's figure)"}`;
  const disk = sample.disk_total ? `, disk ${fmtBytes(sample.disk_used)} of ${fmtBytes(sample.disk_total)}` : "";
  return `CPU ${Number(sample.cpu_pct).toFixed(1)} % · memory ${guest}${disk} · host charges ${fmtBytes(sample.memory_bytes)}`;
}

function svg(tag, attrs) {
  const el = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs || {})) el.setAttribute(key, String(value));
  return el;
}

function chart(samples) {
  const { cpu, memory } = usageSeries(samples);
  const root = svg("svg", {
    viewBox: `0 0 ${CHART.width} ${CHART.height}`,
    preserveAspectRatio: "none",
    class: "usage-chart",
    role: "img",
    "aria-label": "CPU and memory use",
    "data-testid": "usage-chart",
  });
  for (const pct of [0, 50, 100]) {
    const y = CHART.pad + (CHART.height - 2 * CHART.pad) * (1 - pct / 100);
    root.append(svg("line", { x1: 0, x2: CHART.width, y1: y, y2: y, class: "usage-grid" }));
  }
  if (cpu.length >= 2) {
    const t0 = cpu[0][0];
    const t1 = cpu[cpu.length - 1][0];
    root.append(svg("polyline", { points: polyline(memory, t0, t1), class: "usage-mem", "data-testid": "usage-mem" }));
    root.append(svg("polyline", { points: polyline(cpu, t0, t1), class: "usage-cpu", "data-testid": "usage-cpu" }));
  }
  return root;
}

export class ObservePanel {
  constructor(api, sandboxId) {
    this.api = api;
    this.sandboxId = sandboxId;
    this.timer = null;
    this.chart = h("div", { testid: "usage" }, h("p", { class: "muted" }, "Loading…"));
    this.latest = h("p", { class: "muted", testid: "usage-latest" });
    this.log = h("div", { testid: "sandbox-log" });
    const reload = h("button", { type: "button", class: "small", testid: "sandbox-log-refresh" }, "Refresh");
    reload.addEventListener("click", () => this.loadLog());
    this.el = h(
      "div",
      { class: "observe-panel" },
      h("p", { class: "muted" }, h("span", { class: "legend-cpu" }, "■ CPU"), " ", h("span", { class: "legend-mem" }, "■ memory"), " (0–100 %, last 15 min)"),
      this.chart,
      this.latest,
      h("div", { class: "toolbar" }, h("h4", null, "Log (newest first)"), reload),
      this.log,
    );
  }

  start() {
    this.load();
    this.timer = setInterval(() => this.loadUsage(), REFRESH_MS);
  }

  stop() {
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
  }

  async load() {
    await Promise.all([this.loadUsage(), this.loadLog()]);
  }

  async loadUsage() {
    try {
      const start = Date.now() / 1000 - WINDOW_S;
      const body = await this.api.get(sbxPath(this.sandboxId, `/metrics?start=${start.toFixed(0)}`));
      const samples = body.samples || [];
      replace(this.chart, chart(samples));
      replace(this.latest, latestText(samples[samples.length - 1]));
    } catch (err) {
      replace(this.chart, h("p", { class: "muted" }, `usage unavailable: ${errorText(err)}`));
    }
  }

  async loadLog() {
    try {
      const body = await this.api.get(sbxPath(this.sandboxId, `/logs?direction=backward&limit=${LOG_LIMIT}`));
      const entries = body.logs || [];
      if (!entries.length) {
        replace(this.log, h("p", { class: "muted" }, "Nothing logged yet."));
        return;
      }
      const rows = entries.map((e) => ({
        attrs: { testid: "sandbox-log-row", dataset: { source: e.source, level: e.level } },
        cells: [fmtTime(e.timestamp), h("span", { class: `badge level-${e.level}` }, e.level), e.source, h("code", null, e.message)],
      }));
      replace(this.log, table(["time", "level", "source", "message"], rows, { class: "grid" }));
    } catch (err) {
      replace(this.log, h("p", { class: "muted" }, `log unavailable: ${errorText(err)}`));
    }
  }
}
