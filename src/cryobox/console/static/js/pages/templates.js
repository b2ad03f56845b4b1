// #/templates: built-in and custom templates with build progress and errors; a form to build a custom one.
import { errorText } from "../api.js";
import { fmtTime, h, replace, statusBadge, table } from "../dom.js";
import { confirmDialog, toast } from "../ui.js";

const BUILT_IN = new Set(["base", "code-interpreter"]);

function words(text) {
  return String(text || "")
    .split(/[\s,]+/)
    .map((w) => w.trim())
    .filter(Boolean);
}

export function templatesPage(app, root) {
  const list = h("div", { testid: "template-list" }, h("p", { class: "muted" }, "Loading…"));
  const name = h("input", { testid: "template-name", placeholder: "my-template", required: true });
  const base = h("select", { testid: "template-base" }, h("option", { value: "base" }, "base"), h("option", { value: "code-interpreter" }, "code-interpreter"));
  const packages = h("input", { testid: "template-packages", class: "wide", placeholder: "Debian packages, e.g. jq curl" });
  const pip = h("input", { testid: "template-pip", class: "wide", placeholder: "pip requirements, e.g. requests==2.32.3" });
  const warmup = h("textarea", { testid: "template-warmup", rows: 3, placeholder: "warm-up commands, one a line" });
  const cpu = h("input", { type: "number", min: 1, max: 8, class: "narrow", testid: "template-cpu", placeholder: "cpu" });
  const memory = h("input", { type: "number", min: 256, max: 16384, class: "narrow", testid: "template-memory", placeholder: "MiB" });
  const submit = h("button", { type: "submit", class: "primary", testid: "template-create" }, "Build template");
  const formError = h("p", { class: "error", testid: "template-create-error" });
  const form = h(
    "form",
    { class: "card form-grid", testid: "template-form" },
    h("h3", null, "New custom template"),
    h("label", null, "name", name),
    h("label", null, "base", base),
    h("label", null, "packages", packages),
    h("label", null, "pip", pip),
    h("label", null, "warm-up", warmup),
    h("label", null, "cpu / memory", h("span", null, cpu, " ", memory)),
    submit,
    formError,
  );
  let lastText = "";

  function render(items) {
    const rows = items.map((t) => {
      const custom = !BUILT_IN.has(t.name);
      const remove = custom
        ? h("button", { type: "button", class: "danger small", testid: "template-delete", onclick: () => removeTemplate(t.name) }, "Delete")
        : "";
      return {
        attrs: { testid: "template-row", dataset: { name: t.name, status: t.status } },
        cells: [
          t.name,
          custom ? "custom" : "built-in",
          statusBadge(t.status, "template-status"),
          h("span", { testid: "template-progress" }, t.progress || ""),
          h("span", { class: "error", testid: "template-error" }, t.error || ""),
          String(t.cpu),
          `${t.memory_mb} MiB`,
          String(t.generation ?? "–"),
          fmtTime(t.created_at),
          remove,
        ],
      };
    });
    replace(
      list,
      table(["name", "kind", "status", "progress", "error", "cpu", "memory", "generation", "created", ""], rows, { class: "grid" }),
    );
  }

  function apply(items) {
    const text = JSON.stringify(items);
    if (text !== lastText) {
      lastText = text;
      render(items);
    }
  }
  async function load() {
    try {
      apply((await app.api.get("/v1/templates")).items);
    } catch (err) {
      replace(list, h("p", { class: "error" }, errorText(err)));
    }
  }

  async function removeTemplate(templateName) {
    const ok = await confirmDialog({ title: `Delete template ${templateName}`, message: "Delete this custom template?", confirm: "Delete", danger: true });
    if (!ok) return;
    try {
      await app.api.del(`/v1/templates/${encodeURIComponent(templateName)}`);
      load();
    } catch (err) {
      toast(errorText(err), "error");
    }
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    formError.textContent = "";
    const body = {
      name: name.value.trim(),
      base: base.value,
      packages: words(packages.value),
      pip: words(pip.value),
      warmup: String(warmup.value || "").split("\n").map((l) => l.trim()).filter(Boolean),
    };
    if (cpu.value) body.cpu = Number(cpu.value);
    if (memory.value) body.memory_mb = Number(memory.value);
    submit.disabled = true;
    try {
      const t = await app.api.post("/v1/templates", body);
      toast(`building ${t.name}`);
      load();
    } catch (err) {
      formError.textContent = errorText(err);
    } finally {
      submit.disabled = false;
    }
  });

  root.append(h("section", { testid: "page-templates" }, h("h2", null, "Templates"), list, form));
  load();
  // then live, build progress included: the server's `templates` event (on every change, polled every 2 s)
  return app.live.on("templates", (data) => apply(data.templates));
}
