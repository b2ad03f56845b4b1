// #/snapshots/<id>: facts, provenance (failure.json), evidence viewer (streamed), restore, bisect x16, fork tree.
import { errorText, snapPath } from "../api.js";
import { fmtBytes, fmtTime, h, link, pairs, replace, table } from "../dom.js";
import { drawForkTree } from "../forktree.js";
import { confirmDialog, toast } from "../ui.js";

const PROVENANCE_KEYS = ["kind", "command", "exit_code", "seed", "commit", "captured_at", "host", "template", "pid"];
const EVIDENCE_VIEW_LIMIT = 4 * 1024 * 1024; // characters shown; the rest is left to "download"
const BISECT_COUNT = 16;

function facts(s) {
  return table(
    ["id", "sandbox", "template", "created", "retain", "size", "unique", "shared", "pause", "where", "parent"],
    [
      [
        s.id,
        s.sandbox_id ? link(s.sandbox_id, "sandboxes", s.sandbox_id) : "–",
        s.template,
        fmtTime(s.created_at),
        s.retain ? "yes" : "no",
        fmtBytes(s.size_bytes),
        fmtBytes(s.unique_bytes),
        fmtBytes(s.shared_bytes),
        s.pause_ms !== null && s.pause_ms !== undefined ? `${Math.round(s.pause_ms)} ms` : "–",
        `${s.location || "–"}${s.host ? ` (${s.host})` : ""}`,
        s.parent_id || "–",
      ],
    ],
    { class: "grid facts" },
  );
}

function provenanceTable(failure) {
  const keys = [...PROVENANCE_KEYS.filter((k) => k in failure), ...Object.keys(failure).filter((k) => !PROVENANCE_KEYS.includes(k))];
  return table(
    ["field", "value"],
    keys.map((k) => ({
      attrs: { testid: "provenance-row", dataset: { key: k } },
      cells: [k, typeof failure[k] === "string" ? failure[k] : JSON.stringify(failure[k])],
    })),
    { class: "grid kv" },
  );
}

/** Stream an evidence file into `pre` as it arrives (fetch + ReadableStream; Chromium and Firefox). */
async function streamInto(pre, status, url, signal) {
  replace(pre);
  status.textContent = "loading…";
  const response = await fetch(url, { credentials: "same-origin", cache: "no-store", signal });
  if (!response.ok) {
    let message = response.statusText;
    try {
      message = (await response.json()).error || message;
    } catch {
      /* not JSON */
    }
    throw new Error(`${message} (HTTP ${response.status})`);
  }
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let shown = 0;
  let total = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    total += value.byteLength;
    if (shown < EVIDENCE_VIEW_LIMIT) {
      const text = decoder.decode(value, { stream: true });
      shown += text.length;
      pre.append(document.createTextNode(text));
    }
    status.textContent = `${fmtBytes(total)} received…`;
  }
  status.textContent = shown >= EVIDENCE_VIEW_LIMIT ? `${fmtBytes(total)} (shown truncated; download for all)` : fmtBytes(total);
  status.dataset.bytes = String(total);
  status.dataset.done = "1";
}

export function snapshotPage(app, root, id) {
  const path = snapPath(id);
  const info = h("div", { testid: "snapshot-facts" }, h("p", { class: "muted" }, "Loading…"));
  const labels = h("div", { testid: "snapshot-detail-labels" });
  const provenance = h("div", { testid: "provenance" }, h("p", { class: "muted" }, "Loading…"));
  const evidenceList = h("div", { class: "toolbar", testid: "evidence-list" });
  const viewerStatus = h("span", { class: "muted", testid: "evidence-status" });
  const viewerName = h("strong", { testid: "evidence-name" });
  const viewer = h("pre", { class: "output evidence", testid: "evidence-viewer" });
  const restoreButton = h("button", { type: "button", class: "primary", testid: "snapshot-restore" }, "Restore");
  const restoreResult = h("span", { testid: "restore-result" });
  const bisectCommand = h("input", { class: "wide", testid: "bisect-command", placeholder: "command run in each child" });
  const bisectButton = h("button", { type: "button", testid: "bisect-start" }, `Bisect ×${BISECT_COUNT}`);
  const bisectResult = h("span", { testid: "bisect-result" });
  const tree = h("div", { class: "tree-wrap", testid: "snapshot-tree" });
  const deleteButton = h("button", { type: "button", class: "danger", testid: "snapshot-delete" }, "Delete");
  let viewing = null;
  let polling = null;
  let alive = true;

  async function loadFacts() {
    try {
      const snap = await app.api.get(path);
      replace(info, facts(snap));
      replace(labels, h("strong", null, "labels "), pairs(snap.labels, "snapshot-detail-label-chips"));
      return snap;
    } catch (err) {
      replace(info, h("p", { class: "error", testid: "snapshot-error" }, errorText(err)));
      return null;
    }
  }

  async function loadEvidence(snap) {
    let files = [];
    try {
      files = (await app.api.get(`${path}/evidence`)).files;
    } catch (err) {
      replace(evidenceList, h("span", { class: "error" }, errorText(err)));
    }
    replace(
      evidenceList,
      files.length
        ? files.map((f) =>
            h(
              "button",
              { type: "button", testid: "evidence-file", dataset: { name: f.name }, onclick: () => view(f.name) },
              `${f.name} (${fmtBytes(f.size)})`,
            ),
          )
        : h("span", { class: "muted" }, "No evidence files."),
    );
    let failure = null;
    if (files.some((f) => f.name === "failure.json")) {
      try {
        failure = JSON.parse(await app.api.get(`${path}/evidence/failure.json`));
      } catch {
        failure = null;
      }
    }
    if (!failure && snap && (snap.labels || {})["cryobox.capture"]) {
      failure = { ...snap.labels, kind: snap.labels["cryobox.capture"] };
      delete failure["cryobox.capture"];
    }
    if (failure && typeof failure === "object") {
      replace(provenance, provenanceTable(failure));
      if (failure.command && !bisectCommand.value) bisectCommand.value = `cd /work && ${failure.command}`;
    } else {
      replace(provenance, h("p", { class: "muted" }, "Not a captured failure (no failure.json)."));
    }
    const first = ["test.log", "console.log", "qemu.log"].find((n) => files.some((f) => f.name === n));
    if (first && !viewing) view(first);
  }

  async function view(name) {
    if (viewing) viewing.abort();
    const controller = new AbortController();
    viewing = controller;
    viewerName.textContent = name;
    delete viewerStatus.dataset.done;
    delete viewerStatus.dataset.bytes;
    for (const b of evidenceList.querySelectorAll("button")) b.classList.toggle("active", b.dataset.name === name);
    try {
      await streamInto(viewer, viewerStatus, `${path}/evidence/${encodeURIComponent(name)}`, controller.signal);
    } catch (err) {
      if (err.name !== "AbortError") viewerStatus.textContent = `could not read ${name}: ${err.message}`;
    }
  }

  async function loadTree() {
    try {
      const all = (await app.api.get("/v1/snapshots")).snapshots;
      replace(tree, drawForkTree(all, id));
    } catch (err) {
      replace(tree, h("span", { class: "error" }, errorText(err)));
    }
  }

  restoreButton.addEventListener("click", async () => {
    const ok = await confirmDialog({ title: `Restore ${id}`, message: "Start a new sandbox from this snapshot?", confirm: "Restore" });
    if (!ok) return;
    restoreButton.disabled = true;
    replace(restoreResult, "restoring…");
    try {
      const sbx = await app.api.post("/v1/sandboxes", { from_snapshot: id });
      replace(restoreResult, "restored as ", h("span", { testid: "restored-id" }, link(sbx.id, "sandboxes", sbx.id)), ` in ${Math.round(sbx.boot_ms ?? 0)} ms`);
    } catch (err) {
      replace(restoreResult, h("span", { class: "error" }, errorText(err)));
    } finally {
      restoreButton.disabled = false;
    }
  });

  async function poll(bisectId) {
    while (alive) {
      let job;
      try {
        job = await app.api.get(`/v1/bisects/${encodeURIComponent(bisectId)}`);
      } catch (err) {
        replace(bisectResult, h("span", { class: "error" }, errorText(err)));
        break;
      }
      if (job.state !== "running") {
        showBisect(job);
        break;
      }
      replace(bisectResult, `running (${BISECT_COUNT} children)…`);
      await new Promise((resolve) => {
        polling = setTimeout(resolve, 1000);
      });
    }
    bisectButton.disabled = false;
  }

  function showBisect(job) {
    bisectResult.dataset.state = job.state;
    if (job.state === "failed") {
      replace(bisectResult, h("span", { class: "error" }, `bisect failed: ${job.error || "unknown error"}`));
      return;
    }
    const errors = Array.isArray(job.errors) ? job.errors.length : Number(job.errors || 0);
    replace(
      bisectResult,
      h("strong", { testid: "bisect-ratio" }, `${job.reproduced}/${job.count}`),
      ` reproduced (${job.passed} passed${errors ? `, ${errors} not counted` : ""})`,
      job.verdict ? h("span", { class: "muted", testid: "bisect-verdict" }, ` — ${job.verdict}`) : null,
    );
  }

  bisectButton.addEventListener("click", async () => {
    const command = bisectCommand.value.trim();
    if (!command) {
      toast("Give the command to run in each child.", "error");
      return;
    }
    const ok = await confirmDialog({
      title: `Bisect ${id} ×${BISECT_COUNT}`,
      message: `Restore this snapshot, fork it ${BISECT_COUNT} times and run the command in every child?`,
      confirm: "Start bisect",
    });
    if (!ok) return;
    bisectButton.disabled = true;
    delete bisectResult.dataset.state;
    replace(bisectResult, "starting…");
    try {
      const job = await app.api.post(`${path}/bisect`, { command, count: BISECT_COUNT, timeout_seconds: 60 });
      poll(job.id);
    } catch (err) {
      replace(bisectResult, h("span", { class: "error" }, errorText(err)));
      bisectButton.disabled = false;
    }
  });

  deleteButton.addEventListener("click", async () => {
    const ok = await confirmDialog({ title: `Delete ${id}`, message: "Delete this snapshot everywhere?", confirm: "Delete", danger: true });
    if (!ok) return;
    try {
      await app.api.del(path);
      app.go("#/snapshots");
    } catch (err) {
      toast(errorText(err), "error");
    }
  });

  root.append(
    h(
      "section",
      { testid: "page-snapshot", dataset: { id } },
      h("h2", null, link("Snapshots", "snapshots"), " / ", h("span", { testid: "snapshot-id" }, id)),
      info,
      labels,
      h("div", { class: "toolbar actions" }, restoreButton, restoreResult, h("span", { class: "spacer" }), deleteButton),
      h("div", { class: "toolbar card" }, h("strong", null, "Bisect"), bisectCommand, bisectButton, bisectResult),
      h("div", { class: "columns" },
        h("div", { class: "card col-narrow" }, h("h3", null, "Provenance"), provenance),
        h("div", { class: "card col-wide" }, h("h3", null, "Evidence"), evidenceList, h("div", null, viewerName, " ", viewerStatus), viewer),
      ),
      h("div", { class: "card" }, h("h3", null, "Fork tree"), tree),
    ),
  );
  loadFacts().then((snap) => loadEvidence(snap));
  loadTree();
  return () => {
    alive = false;
    if (viewing) viewing.abort();
    clearTimeout(polling);
  };
}
