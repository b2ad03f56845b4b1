// #/volumes: the workspace's volumes (size, bytes used, which sandboxes have them attached and how), a create
// form, grow and delete. Every refusal shows the API's own message (a shrink's 400, a delete's or grow's 409 while
// attached) in the page's error line; nothing is swallowed. Refreshed every 10 s and after each action.
import { errorText } from "../api.js";
import { fmtBytes, fmtTime, h, link, replace, statusBadge, table } from "../dom.js";
import { confirmDialog, toast } from "../ui.js";

const UNITS = { MiB: 1, GiB: 1024 };
const REFRESH_MS = 10_000;

export function volPath(name) {
  return `/v1/volumes/${encodeURIComponent(name)}`;
}

/** The form's size in MiB (an integer), or an Error saying why not. */
export function sizeMb(amount, unit) {
  const value = Number(amount) * (UNITS[unit] || 0);
  if (!String(amount).trim() || !Number.isInteger(value) || value <= 0) {
    return new Error(`"${amount} ${unit}" is not a whole number of MiB`);
  }
  return value;
}

/** "<sandbox> at <path> (read-write)" for each attachment, the sandbox linked to its page. */
export function attachments(volume) {
  const list = volume.attached_to || [];
  if (!list.length) return h("span", { class: "muted", testid: "volume-free" }, "–");
  return h(
    "span",
    { class: "chips" },
    list.map((a) =>
      h(
        "span",
        { class: "chip", testid: "volume-attachment", dataset: { sandbox: a.sandbox_id, mode: a.read_only ? "ro" : "rw" } },
        link(a.sandbox_id, "sandboxes", a.sandbox_id),
        " at ",
        h("span", { testid: "volume-attachment-path" }, a.path),
        ` (${a.read_only ? "read-only" : "read-write"})`,
      ),
    ),
  );
}

export function volumesPage(app, root) {
  let lastText = "";
  const list = h("div", { testid: "volume-list" }, h("p", { class: "muted" }, "Loading…"));
  const count = h("span", { class: "muted", testid: "volume-count" });
  const error = h("p", { class: "error", testid: "volume-error" });
  const name = h("input", { testid: "volume-name", placeholder: "name: A-Z a-z 0-9 . _ -", required: true });
  const size = h("input", { type: "number", min: 1, value: 1, class: "narrow", testid: "volume-size" });
  const unit = h("select", { testid: "volume-unit" }, Object.keys(UNITS).map((u) => h("option", { value: u, selected: u === "GiB" }, u)));
  const submit = h("button", { type: "submit", class: "primary", testid: "volume-create" }, "Create volume");
  const refresh = h("button", { type: "button", testid: "volume-refresh" }, "Refresh");
  const form = h(
    "form",
    { class: "toolbar card", testid: "volume-form" },
    h("strong", null, "New volume"),
    h("label", null, "name ", name),
    h("label", null, "size ", size, " ", unit),
    submit,
  );

  /** Run an action; its failure goes to the error line (as the API said it) and a toast; then reload. */
  async function act(button, what, fn) {
    button.disabled = true;
    error.textContent = "";
    try {
      const done = await fn();
      if (done) toast(done);
    } catch (err) {
      error.textContent = `${what}: ${errorText(err)}`;
      toast(error.textContent, "error");
    } finally {
      button.disabled = false;
      await load();
    }
  }

  function row(v) {
    const grow = h("button", { type: "button", class: "small", testid: "volume-grow" }, "Grow");
    const del = h("button", { type: "button", class: "small danger", testid: "volume-delete" }, "Delete");
    grow.addEventListener("click", async () => {
      const answer = await confirmDialog({
        title: `Grow volume ${v.name}`,
        message: `Now ${v.size_mb} MiB. Volumes only grow; the guest's file system grows when a sandbox next mounts it.`,
        confirm: "Grow",
        input: { label: "new size (MiB)", value: v.size_mb, type: "number" },
      });
      if (answer === null) return;
      await act(grow, `grow "${v.name}"`, async () => {
        const body = await app.api.patch(volPath(v.name), { size_mb: Number(answer) });
        return `${body.name} is now ${body.size_mb} MiB`;
      });
    });
    del.addEventListener("click", async () => {
      const ok = await confirmDialog({
        title: `Delete volume ${v.name}`,
        message: "Delete this volume and all its data?",
        confirm: "Delete",
        danger: true,
      });
      if (ok === null) return;
      await act(del, `delete "${v.name}"`, async () => {
        await app.api.del(volPath(v.name));
        return `deleted ${v.name}`;
      });
    });
    return {
      attrs: { testid: "volume-row", dataset: { name: v.name, sizeMb: v.size_mb } },
      cells: [
        h("span", { testid: "volume-name-cell" }, v.name),
        statusBadge(v.status, "volume-status"),
        h("span", { class: "nowrap", testid: "volume-size-cell" }, fmtBytes(v.size_bytes)),
        h("span", { class: "nowrap", testid: "volume-used", title: v.used_bytes === null ? "its agent did not answer" : null }, fmtBytes(v.used_bytes)),
        attachments(v),
        v.host || "–",
        fmtTime(v.created_at),
        h("span", { class: "row-actions" }, grow, del),
      ],
    };
  }

  function apply(volumes) {
    const text = JSON.stringify(volumes);
    if (text === lastText) return; // unchanged: keep the DOM (and the user's focus) as it is
    lastText = text;
    count.textContent = `${volumes.length}`;
    replace(
      list,
      volumes.length
        ? table(["name", "status", "size", "used", "attached to", "host", "created", ""], volumes.map(row), { class: "grid" })
        : h("p", { class: "muted", testid: "volume-empty" }, "No volumes."),
    );
  }

  async function load() {
    try {
      apply((await app.api.get("/v1/volumes")).items);
    } catch (err) {
      lastText = "";
      replace(list, h("p", { class: "error", testid: "volume-list-error" }, errorText(err)));
    }
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const wanted = name.value;
    act(submit, `create "${wanted}"`, async () => {
      const mb = sizeMb(size.value, unit.value);
      if (mb instanceof Error) throw mb;
      const body = await app.api.post("/v1/volumes", { name: wanted, size_mb: mb });
      name.value = "";
      return `created ${body.name} (${body.size_mb} MiB)`;
    });
  });
  refresh.addEventListener("click", () => act(refresh, "refresh", async () => null));

  root.append(
    h(
      "section",
      { testid: "page-volumes" },
      h("h2", null, "Volumes ", count),
      form,
      h("div", { class: "toolbar" }, refresh),
      error,
      list,
    ),
  );
  load();
  const timer = setInterval(load, REFRESH_MS);
  return () => clearInterval(timer);
}
