// #/sandboxes/<id>: facts, actions (with confirmations), CPU/memory chart + log, terminal, files, exec box + history,
// network policy + egress log.
import { errorText, sbxPath } from "../api.js";
import { fmtTime, h, link, pairs, replace, statusBadge, table } from "../dom.js";
import { confirmDialog, toast } from "../ui.js";
import { TerminalPanel } from "../terminal.js";
import { FilesPanel } from "../files.js";
import { ExecPanel } from "../execs.js";
import { NetworkPanel } from "../network.js";
import { timeoutText } from "../lifecycle.js";
import { ObservePanel } from "../observe.js";

const ACTIONS = [
  // [testid, label, confirmation, run(api, id, answer) -> result node or text]
  ["snapshot", "Snapshot", "Snapshot this sandbox (it keeps running; it pauses briefly)?", snapshot],
  ["fork", "Fork", "Fork this sandbox (a new sandbox booted from a copy of its disk)?", fork],
  ["fork-tree", "Fork tree", "Fork a tree: children restored from one snapshot of memory and disk.", forkTree],
  ["pause", "Pause", "Pause this sandbox (its vCPUs freeze in place)?", simple("/pause")],
  ["resume", "Resume", "Resume this sandbox?", simple("/resume")],
  ["hibernate", "Hibernate", "Hibernate this sandbox (snapshot to disk and stop; Wake, or any request if it auto-wakes, brings it back)?", simple("/hibernate")],
  ["wake", "Wake", "Wake this sandbox?", simple("/wake")],
  ["kill", "Kill", "Kill this sandbox? Its non-retained snapshots are deleted with it.", kill],
];

async function snapshot(app, id) {
  const snap = await app.api.post(sbxPath(id, "/snapshots"), {});
  return h("span", null, "snapshot ", h("span", { testid: "snapshot-id" }, link(snap.id, "snapshots", snap.id)), ` (paused ${snap.pause_ms ?? "?"} ms)`);
}

async function fork(app, id) {
  const body = await app.api.post(sbxPath(id, "/fork"), {});
  return h("span", null, "forked: ", link(body.sandbox.id, "sandboxes", body.sandbox.id));
}

async function forkTree(app, id, count) {
  const body = await app.api.post(sbxPath(id, "/fork-tree"), { count: Number(count) || 2 });
  return h(
    "span",
    null,
    `tree ${body.tree_id} from snapshot `,
    link(body.snapshot_id, "snapshots", body.snapshot_id),
    ": ",
    body.children.map((c) => [link(c.id, "sandboxes", c.id), " "]),
    body.errors.length ? h("span", { class: "error" }, `${body.errors.length} failed`) : null,
  );
}

function simple(suffix) {
  return async (app, id) => {
    const body = await app.api.post(sbxPath(id, suffix), {});
    return body && body.status ? `now ${body.status}` : "done";
  };
}

async function kill(app, id) {
  await app.api.del(sbxPath(id));
  app.go("#/sandboxes");
  return "killed";
}

/** The sandbox's mounted volumes (the `volumes` of its GET view; `null` from a server that does not say). */
function volumesTable(volumes) {
  if (!Array.isArray(volumes)) return h("p", { class: "muted" }, "–");
  if (!volumes.length) return h("p", { class: "muted", testid: "sandbox-volumes-none" }, "No volumes.");
  return table(
    ["volume", "path", "mode"],
    volumes.map((v) => ({
      attrs: { testid: "sandbox-volume-row", dataset: { name: v.name, mode: v.read_only ? "ro" : "rw" } },
      cells: [link(v.name, "volumes"), h("span", { testid: "sandbox-volume-path" }, v.path), v.read_only ? "read-only" : "read-write"],
    })),
    { class: "grid" },
  );
}

function facts(s) {
  return table(
    ["id", "state", "template", "host", "cpu", "memory", "created", "expires", "at timeout", "from snapshot", "boot"],
    [
      [
        s.id,
        statusBadge(s.status, "detail-status"),
        s.template,
        s.host || "–",
        String(s.cpu),
        `${s.memory_mb} MiB`,
        fmtTime(s.created_at),
        s.persistent ? "persistent" : fmtTime(s.expires_at),
        h("span", { testid: "detail-on-timeout" }, timeoutText(s)),
        s.from_snapshot ? link(s.from_snapshot, "snapshots", s.from_snapshot) : "–",
        `${s.boot_mode || "–"} ${s.boot_ms !== undefined && s.boot_ms !== null ? `${Math.round(s.boot_ms)} ms` : ""}`,
      ],
    ],
    { class: "grid facts" },
  );
}

export function sandboxPage(app, root, id) {
  const info = h("div", { testid: "sandbox-facts" }, h("p", { class: "muted" }, "Loading…"));
  const meta = h("div", { testid: "sandbox-detail-metadata" });
  const volumes = h("div", { testid: "sandbox-volumes" }, h("p", { class: "muted" }, "Loading…"));
  const result = h("div", { class: "result", testid: "action-result" });
  const actions = h(
    "div",
    { class: "toolbar actions" },
    ACTIONS.map(([testid, label, message, run]) => {
      const button = h("button", { type: "button", testid: `action-${testid}`, class: testid === "kill" ? "danger" : "" }, label);
      button.addEventListener("click", async () => {
        const answer = await confirmDialog({
          title: `${label} ${id}`,
          message,
          confirm: label,
          danger: testid === "kill",
          input: testid === "fork-tree" ? { label: "children (1–16)", value: 2, type: "number", min: 1, max: 16 } : null,
        });
        if (answer === null) return;
        button.disabled = true;
        replace(result, `${label}…`);
        try {
          replace(result, await run(app, id, answer));
          refresh();
        } catch (err) {
          replace(result, h("span", { class: "error" }, errorText(err)));
          toast(errorText(err), "error");
        } finally {
          button.disabled = false;
        }
      });
      return button;
    }),
  );

  const terminal = new TerminalPanel(app.api, id);
  const files = new FilesPanel(app.api, id);
  const execs = new ExecPanel(app.api, id);
  const network = new NetworkPanel(app.api, id);
  const usage = new ObservePanel(app.api, id);
  let current = null;

  function show(s) {
    current = s;
    replace(info, facts(s));
    replace(meta, h("strong", null, "metadata "), pairs(s.metadata, "detail-metadata"));
  }

  async function refresh() {
    try {
      const s = await app.api.get(sbxPath(id));
      show(s);
      replace(volumes, volumesTable(s.volumes)); // only the GET view carries them (not the live list's rows)
    } catch (err) {
      replace(info, h("p", { class: "error", testid: "sandbox-error" }, errorText(err)));
    }
  }

  root.append(
    h(
      "section",
      { testid: "page-sandbox", dataset: { id } },
      h("h2", null, link("Sandboxes", "sandboxes"), " / ", h("span", { testid: "sandbox-id" }, id)),
      info,
      meta,
      actions,
      result,
      h("div", { class: "card", testid: "volumes-card" }, h("h3", null, "Volumes"), volumes),
      h("div", { class: "card", testid: "usage-card" }, h("h3", null, "Usage"), usage.el),
      h("div", { class: "columns" },
        h("div", { class: "card col-wide" }, h("h3", null, "Terminal"), terminal.el),
        h("div", { class: "card col-narrow" }, h("h3", null, "Files"), files.el),
      ),
      h("div", { class: "card" }, h("h3", null, "Exec"), execs.el),
      h("div", { class: "card", testid: "network-card" }, h("h3", null, "Network"), network.el),
    ),
  );
  terminal.mount();
  const off = app.live.on("sandboxes", (data) => {
    const s = data.sandboxes.find((x) => x.id === id);
    if (s && (!current || s.status !== current.status || s.expires_at !== current.expires_at)) show(s);
    if (s && s.network) network.show(s.network);
  });
  refresh().then(() => {
    if (current && current.status === "running") terminal.connect();
  });
  files.load();
  execs.loadHistory();
  network.load();
  usage.start();
  return () => {
    off();
    usage.stop();
    terminal.dispose();
  };
}
