// #/fleet: agents (SSE "agents", each with its own herd counters from the latest "metrics" sample's "agents"),
// capacity (GET /v1/info), herd counters as rates over time and the create-latency histogram over time
// (GET /ui/api/metrics/history, then SSE "metrics" samples).
import { errorText } from "../api.js";
import { fmtDuration, h, now, replace, statusBadge, table, toEpoch } from "../dom.js";
import { heatmap, lineChart } from "../charts.js";

const HERD = [
  ["faults", "Page faults served"],
  ["chunk_fetches", "Chunk fetches"],
  ["cache_hits", "Cache hits"],
  ["store_gets", "Object-store GETs"],
];
const WINDOW_S = 600;

function bound(le) {
  if (le === null || le === undefined || le === "+Inf" || le === "Inf" || le === "inf") return Infinity;
  const n = Number(le);
  return Number.isNaN(n) ? Infinity : n;
}

export function rates(samples, key) {
  const out = [];
  for (let i = 1; i < samples.length; i += 1) {
    const a = samples[i - 1];
    const b = samples[i];
    const dt = b.t - a.t;
    if (dt <= 0) continue;
    const dv = Number((b.herd || {})[key] || 0) - Number((a.herd || {})[key] || 0);
    out.push([b.t, Math.max(0, dv) / dt]);
  }
  return out;
}

export function histogramColumns(samples) {
  const columns = [];
  for (let i = 1; i < samples.length; i += 1) {
    const a = (samples[i - 1].creates || {}).buckets || [];
    const b = (samples[i].creates || {}).buckets || [];
    if (!b.length || a.length !== b.length) continue;
    const diffs = b.map(([, cum], j) => Math.max(0, Number(cum) - Number(a[j][1])));
    columns.push({ t: samples[i].t, counts: diffs.map((d, j) => Math.max(0, d - (j ? diffs[j - 1] : 0))) });
  }
  return columns;
}

function capacityTable(info) {
  const c = info.capacity || {};
  return table(
    ["version", "accelerator", "agents", "sandboxes running", "memory committed", "vCPUs", "restores in flight", "prespawned", "queue"],
    [
      [
        info.version,
        h("span", { testid: "fleet-accelerator" }, info.accelerator),
        String(c.agents ?? "–"),
        String(c.sandboxes_running ?? c.sandboxes ?? "–"),
        `${c.memory_committed_mib ?? "–"} / ${c.memory_total_mib ?? "–"} MiB`,
        String(c.vcpus_total ?? "–"),
        `${c.restores_in_flight ?? "–"} (peak ${c.restores_peak ?? "–"}, max ${c.max_concurrent_restores ?? "–"})`,
        String(c.prespawned_vms ?? "–"),
        String(c.admission_queue_depth ?? "–"),
      ],
    ],
    { class: "grid facts", testid: "capacity" },
  );
}

// an agent's herd counters as the control plane last gathered them: "–" when it has none of the agent's (not
// live), the last ones marked when the agent did not answer the last gather
export function counterCells(counters) {
  if (!counters) return HERD.map(() => "–");
  const cells = HERD.map(([key]) => String(counters[key] ?? 0));
  if (!counters.up) cells[cells.length - 1] += " (no answer)";
  return cells;
}

function agentsTable(agents, counters) {
  if (!agents.length) return h("p", { class: "muted" }, "No agents registered.");
  return table(
    ["name", "status", "url", "last heartbeat", "registered", "sandboxes", "memory", "vCPUs", "faults", "chunk fetches", "cache hits", "store GETs"],
    agents.map((a) => {
      const cap = a.capacity || {};
      const beat = toEpoch(a.heartbeat_at);
      return {
        attrs: { testid: "agent-row", dataset: { name: a.name, status: a.status } },
        cells: [
          a.name,
          statusBadge(a.status, "agent-status"),
          a.url || "–",
          h("span", { class: "beat", dataset: { t: beat ?? "" } }, beat === null ? "never" : `${fmtDuration(now() - beat)} ago`),
          a.registered_at ? new Date(toEpoch(a.registered_at) * 1000).toISOString().slice(0, 19) : "–",
          String(cap.sandboxes ?? "–"),
          `${cap.memory_committed_mib ?? "–"} / ${cap.memory_total_mib ?? "–"} MiB`,
          String(cap.vcpus_total ?? "–"),
          ...counterCells((counters || {})[a.name]),
        ],
      };
    }),
    { class: "grid" },
  );
}

export function fleetPage(app, root) {
  let samples = [];
  let agentList = null;
  const capacity = h("div", { testid: "fleet-capacity" }, h("p", { class: "muted" }, "Loading…"));
  const agents = h("div", { testid: "agent-list" }, h("p", { class: "muted" }, "Loading…"));
  const totals = new Map();
  const canvases = new Map();
  const charts = HERD.map(([key, title]) => {
    const canvas = h("canvas", { class: "chart", testid: `chart-${key}` });
    const total = h("span", { class: "total", testid: `herd-total-${key}` }, "–");
    canvases.set(key, canvas);
    totals.set(key, total);
    return h("div", { class: "card chart-card" }, h("h4", null, title, " ", h("span", { class: "muted" }, "total "), total), canvas);
  });
  const histCanvas = h("canvas", { class: "chart tall", testid: "chart-create-latency" });
  const createsTotal = h("span", { class: "total", testid: "creates-total" }, "–");
  const createsMean = h("span", { class: "muted", testid: "creates-mean" });
  const sampleCount = h("span", { class: "muted", testid: "metrics-samples" }, "0 samples");

  function drawAgents() {
    if (agentList === null) return;
    const last = samples[samples.length - 1];
    replace(agents, agentsTable(agentList, last ? last.agents : null));
  }

  function draw() {
    const cutoff = now() - WINDOW_S;
    samples = samples.filter((s) => s.t >= cutoff);
    for (const [key] of HERD) lineChart(canvases.get(key), rates(samples, key));
    const last = samples[samples.length - 1];
    if (last) {
      for (const [key] of HERD) totals.get(key).textContent = String((last.herd || {})[key] ?? 0);
      const creates = last.creates || {};
      createsTotal.textContent = String(creates.count ?? 0);
      createsMean.textContent = creates.count ? `mean ${((creates.sum_s / creates.count) * 1000).toFixed(0)} ms` : "";
      const bounds = (creates.buckets || []).map(([le]) => bound(le));
      heatmap(histCanvas, histogramColumns(samples), bounds);
    } else {
      heatmap(histCanvas, [], []);
    }
    sampleCount.textContent = `${samples.length} samples`;
    drawAgents();
  }

  async function loadInfo() {
    try {
      replace(capacity, capacityTable(await app.api.get("/v1/info")));
    } catch (err) {
      replace(capacity, h("p", { class: "error" }, errorText(err)));
    }
  }

  root.append(
    h(
      "section",
      { testid: "page-fleet" },
      h("h2", null, "Fleet"),
      h("div", { class: "card" }, h("h3", null, "Capacity"), capacity),
      h("div", { class: "card" }, h("h3", null, "Agents"), agents),
      h("h3", null, "Herd counters (rate per second, last 10 min) ", sampleCount),
      h("div", { class: "chart-grid" }, charts),
      h("div", { class: "card" }, h("h4", null, "Create latency over time ", h("span", { class: "muted" }, "creates "), createsTotal, " ", createsMean), histCanvas),
    ),
  );

  app.api
    .get("/v1/agents")
    .then((body) => {
      agentList = body.agents;
      drawAgents();
    })
    .catch((err) => replace(agents, h("p", { class: "error" }, errorText(err))));
  app.api
    .get("/ui/api/metrics/history")
    .then((body) => {
      const seen = new Set(samples.map((s) => s.t));
      samples = [...body.samples.filter((s) => !seen.has(s.t)), ...samples].sort((a, b) => a.t - b.t);
      draw();
    })
    .catch((err) => replace(sampleCount, h("span", { class: "error" }, `history: ${errorText(err)}`)));
  const offAgents = app.live.on("agents", (data) => {
    agentList = data.agents;
    drawAgents();
  });
  const offMetrics = app.live.on("metrics", (sample) => {
    if (!samples.length || sample.t > samples[samples.length - 1].t) samples.push(sample);
    draw();
  });
  loadInfo();
  draw();
  const infoTimer = setInterval(loadInfo, 5000);
  const beatTimer = setInterval(() => {
    for (const el of agents.querySelectorAll("span.beat")) {
      if (el.dataset.t) el.textContent = `${fmtDuration(now() - Number(el.dataset.t))} ago`;
    }
  }, 1000);
  const onResize = () => draw();
  window.addEventListener("resize", onResize);
  return () => {
    offAgents();
    offMetrics();
    clearInterval(infoTimer);
    clearInterval(beatTimer);
    window.removeEventListener("resize", onResize);
  };
}
