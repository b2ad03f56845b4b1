// #/sandboxes: the live list (SSE "sandboxes" events, first filled by GET /v1/sandboxes) with filters and a
// create form.
import { errorText } from "../api.js";
import { fmtDuration, h, link, now, pairs, parsePairs, replace, statusBadge, table, toEpoch } from "../dom.js";
import { busy, toast } from "../ui.js";

export function templateOptions(select, templates, preferred) {
  const ready = templates.filter((t) => t.status === "ready");
  replace(
    select,
    ready.map((t) => h("option", { value: t.name, selected: t.name === preferred }, t.name)),
  );
}

function matches(sandbox, filter, status) {
  if (status && sandbox.status !== status) return false;
  for (const [k, v] of Object.entries(filter)) {
    if ((sandbox.metadata || {})[k] !== v) return false;
  }
  return true;
}

function ttlText(sandbox) {
  if (sandbox.persistent) return "persistent";
  const expires = toEpoch(sandbox.expires_at);
  return expires === null ? "none" : `${fmtDuration(expires - now())} left`;
}

function ageText(sandbox) {
  return fmtDuration(now() - (toEpoch(sandbox.created_at) || now()));
}

export function sandboxesPage(app, root) {
  let sandboxes = null;
  const filterInput = h("input", { testid: "sandbox-filter", placeholder: "metadata filter: key=value, …" });
  const statusSelect = h(
    "select",
    { testid: "sandbox-status-filter" },
    ["", "starting", "running", "paused", "hibernated", "stopped", "error"].map((s) =>
      h("option", { value: s }, s || "any state"),
    ),
  );
  const filterError = h("span", { class: "error", testid: "sandbox-filter-error" });
  const list = h("div", { testid: "sandbox-list" }, h("p", { class: "muted" }, "Loading…"));
  const count = h("span", { class: "muted", testid: "sandbox-count" });

  const templateSelect = h("select", { testid: "create-template" });
  const ttl = h("input", { type: "number", min: 1, value: 600, testid: "create-ttl", class: "narrow" });
  const onTimeout = h(
    "select",
    { testid: "create-on-timeout" },
    h("option", { value: "kill" }, "kill"),
    h("option", { value: "hibernate" }, "hibernate"),
  );
  const metadata = h("input", { testid: "create-metadata", placeholder: "metadata: key=value, …" });
  const createButton = h("button", { type: "submit", class: "primary", testid: "create-sandbox" }, "Create sandbox");
  const createForm = h(
    "form",
    { class: "toolbar card", testid: "create-form" },
    h("strong", null, "New sandbox"),
    h("label", null, "template ", templateSelect),
    h("label", null, "TTL (s) ", ttl),
    h("label", null, "at timeout ", onTimeout),
    metadata,
    createButton,
  );

  function render() {
    if (sandboxes === null) return;
    let filter = {};
    try {
      filter = parsePairs(filterInput.value);
      filterError.textContent = "";
    } catch (err) {
      filterError.textContent = err.message;
    }
    const shown = sandboxes.filter((s) => matches(s, filter, statusSelect.value));
    count.textContent = `${shown.length} of ${sandboxes.length}`;
    if (!shown.length) {
      replace(list, h("p", { class: "muted", testid: "sandbox-empty" }, "No sandboxes."));
      return;
    }
    const rows = shown.map((s) => ({
      attrs: { testid: "sandbox-row", dataset: { id: s.id, status: s.status } },
      cells: [
        link(s.id, "sandboxes", s.id),
        statusBadge(s.status, "sandbox-status"),
        s.template,
        s.host || "–",
        h("span", { class: "age", dataset: { created: toEpoch(s.created_at) || now() } }, ageText(s)),
        h("span", { class: "ttl", dataset: { id: s.id } }, ttlText(s)),
        pairs(s.metadata, "sandbox-metadata"),
      ],
    }));
    replace(list, table(["id", "state", "template", "host", "age", "TTL", "metadata"], rows, { class: "grid" }));
  }

  function tick() {
    const byId = new Map((sandboxes || []).map((s) => [s.id, s]));
    for (const el of list.querySelectorAll("span.age")) el.textContent = fmtDuration(now() - Number(el.dataset.created));
    for (const el of list.querySelectorAll("span.ttl")) {
      const s = byId.get(el.dataset.id);
      if (s) el.textContent = ttlText(s);
    }
  }

  async function load() {
    try {
      const body = await app.api.get("/v1/sandboxes");
      if (sandboxes === null) sandboxes = body.items;
      render();
    } catch (err) {
      replace(list, h("p", { class: "error" }, errorText(err)));
    }
  }

  createForm.addEventListener("submit", (event) => {
    event.preventDefault();
    busy(
      createButton,
      async () => {
        const body = { template: templateSelect.value, metadata: parsePairs(metadata.value) };
        if (ttl.value) body.ttl_seconds = Number(ttl.value);
        if (onTimeout.value !== "kill") body.on_timeout = onTimeout.value;
        const sbx = await app.api.post("/v1/sandboxes", body);
        toast(`created ${sbx.id}`);
        app.go(`#/sandboxes/${encodeURIComponent(sbx.id)}`);
      },
      errorText,
    );
  });
  filterInput.addEventListener("input", render);
  statusSelect.addEventListener("change", render);

  root.append(
    h(
      "section",
      { testid: "page-sandboxes" },
      h("h2", null, "Sandboxes ", count),
      createForm,
      h("div", { class: "toolbar" }, filterInput, statusSelect, filterError),
      list,
    ),
  );
  app.api
    .get("/v1/templates")
    .then((body) => templateOptions(templateSelect, body.items, "base"))
    .catch((err) => toast(errorText(err), "error"));
  const off = app.live.on("sandboxes", (data) => {
    sandboxes = data.sandboxes;
    render();
  });
  load();
  const timer = setInterval(tick, 1000); // ages and TTLs tick without rebuilding the table
  return () => {
    off();
    clearInterval(timer);
  };
}
