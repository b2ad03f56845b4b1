// #/templates: built-in and custom templates with build progress and errors; a form to build a custom one from
// packages, and one to build from a Dockerfile (+ a context tar) or an image, whose build log is shown live (SSE).
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
  const dfName = h("input", { testid: "dockerfile-name", placeholder: "my-template", required: true });
  const dockerfile = h("textarea", { testid: "dockerfile-text", rows: 8, class: "wide", placeholder: "FROM debian:bookworm\nRUN …" });
  const image = h("input", { testid: "dockerfile-image", class: "wide", placeholder: "or an image: registry/name:tag" });
  const contextFile = h("input", { type: "file", testid: "dockerfile-context", accept: ".tar,.tar.gz,.tgz" });
  const buildArgs = h("input", { testid: "dockerfile-build-args", class: "wide", placeholder: "build args: KEY=VALUE …" });
  const dfSubmit = h("button", { type: "submit", class: "primary", testid: "dockerfile-build" }, "Build from Dockerfile");
  const dfError = h("p", { class: "error", testid: "dockerfile-error" });
  const logStatus = h("p", { class: "muted", testid: "build-log-status" });
  const logView = h("pre", { class: "output", testid: "build-log" });
  const dfForm = h(
    "form",
    { class: "card form-grid", testid: "dockerfile-form" },
    h("h3", null, "Build from a Dockerfile or an image"),
    h("label", null, "name", dfName),
    h("label", null, "Dockerfile", dockerfile),
    h("label", null, "image", image),
    h("label", null, "context (tar)", contextFile),
    h("label", null, "build args", buildArgs),
    dfSubmit,
    dfError,
    logStatus,
    logView,
  );
  let stream = null;
  let lastText = "";

  function followLog(build) {
    if (stream) stream.close();
    logView.textContent = "";
    logStatus.textContent = `build ${build.id} of ${build.name}: ${build.status}`;
    const url = `/v1/templates/${encodeURIComponent(build.name)}/builds/${encodeURIComponent(build.id)}/logs/stream`;
    stream = new EventSource(url);
    stream.addEventListener("log", (event) => {
      const line = JSON.parse(event.data);
      logView.append(document.createTextNode(`[${line.step}] ${line.message}\n`));
      logView.scrollTop = logView.scrollHeight;
    });
    const end = (text) => {
      logStatus.textContent = text;
      stream.close();
      stream = null;
      load();
    };
    stream.addEventListener("done", () => end(`build ${build.id} of ${build.name}: done`));
    stream.addEventListener("error", (event) => {
      if (!event.data) return; // a dropped connection: EventSource reconnects (Last-Event-ID resumes)
      const data = JSON.parse(event.data);
      const step = data.build && data.build.failed_step;
      const where = step ? ` at step ${step.step}${step.line ? ` (line ${step.line}: ${step.instruction})` : ""}` : "";
      end(`build ${build.id} of ${build.name}: failed${where}: ${data.error}`);
    });
  }

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

  dfForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    dfError.textContent = "";
    const fd = new FormData();
    fd.append("name", dfName.value.trim());
    if (image.value.trim()) fd.append("image", image.value.trim());
    else fd.append("dockerfile", dockerfile.value);
    const args = {};
    for (const pair of words(buildArgs.value)) {
      const at = pair.indexOf("=");
      if (at > 0) args[pair.slice(0, at)] = pair.slice(at + 1);
    }
    if (Object.keys(args).length) fd.append("build_args", JSON.stringify(args));
    const file = contextFile.files && contextFile.files[0];
    if (file) {
      const type = file.name.endsWith(".tar") ? "application/x-tar" : "application/gzip";
      fd.append("context", new Blob([file], { type }), file.name);
    }
    dfSubmit.disabled = true;
    try {
      const build = await app.api.request("POST", "/v1/templates/build", { body: fd });
      toast(`building ${build.name}`);
      followLog(build);
      load();
    } catch (err) {
      dfError.textContent = errorText(err);
    } finally {
      dfSubmit.disabled = false;
    }
  });

  root.append(h("section", { testid: "page-templates" }, h("h2", null, "Templates"), list, form, dfForm));
  load();
  // then live, build progress included: the server's `templates` event (on every change, polled every 2 s)
  const off = app.live.on("templates", (data) => apply(data.templates));
  return () => {
    if (stream) stream.close();
    if (typeof off === "function") off();
  };
}
