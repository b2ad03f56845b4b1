// The exec box (POST /v1/sandboxes/{id}/exec) and the exec history (GET /ui/api/sandboxes/{id}/execs).
import { errorText, sbxPath } from "./api.js";
import { fmtTime, h, replace, table, toEpoch } from "./dom.js";

export class ExecPanel {
  constructor(api, sandboxId) {
    this.api = api;
    this.sandboxId = sandboxId;
    this.cmd = h("input", { testid: "exec-cmd", class: "wide", placeholder: "shell command, e.g. uname -a" });
    this.timeout = h("input", { type: "number", min: 1, value: 60, class: "narrow", testid: "exec-timeout" });
    this.run = h("button", { type: "submit", class: "primary", testid: "exec-run" }, "Run");
    this.output = h("pre", { class: "output", testid: "exec-output" });
    this.exit = h("div", { testid: "exec-exit", class: "muted" });
    this.history = h("div", { testid: "exec-history" });
    const form = h("form", { class: "toolbar" }, this.cmd, h("label", null, "timeout (s) ", this.timeout), this.run);
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      this.execute();
    });
    this.el = h(
      "div",
      { class: "exec-panel" },
      form,
      this.exit,
      this.output,
      h("h4", null, "History"),
      this.history,
    );
  }

  async execute() {
    const cmd = this.cmd.value.trim();
    if (!cmd) return;
    this.run.disabled = true;
    this.exit.textContent = "running…";
    replace(this.output);
    try {
      const result = await this.api.post(sbxPath(this.sandboxId, "/exec"), {
        cmd,
        timeout_seconds: Number(this.timeout.value) || 60,
      });
      this.exit.textContent = `exit ${result.exit_code} in ${result.duration_ms} ms`;
      this.exit.dataset.exit = String(result.exit_code);
      replace(this.output, result.stdout, result.stderr ? h("span", { class: "stderr" }, result.stderr) : null);
    } catch (err) {
      this.exit.textContent = errorText(err);
      this.exit.dataset.exit = "error";
      const details = err.details || {};
      replace(this.output, details.stdout || "", details.stderr ? h("span", { class: "stderr" }, details.stderr) : null);
    } finally {
      this.run.disabled = false;
      this.loadHistory();
    }
  }

  async loadHistory() {
    try {
      const body = await this.api.get(`/ui/api/sandboxes/${encodeURIComponent(this.sandboxId)}/execs`);
      const execs = [...body.execs].sort((a, b) => (toEpoch(b.started_at) || 0) - (toEpoch(a.started_at) || 0));
      if (!execs.length) {
        replace(this.history, h("p", { class: "muted" }, "No commands run through the API yet."));
        return;
      }
      const rows = execs.map((e) => ({
        attrs: { testid: "exec-history-row" },
        cells: [
          fmtTime(e.started_at),
          h("code", null, e.command),
          e.timed_out ? "timed out" : String(e.exit_code ?? "–"),
          `${e.duration_ms ?? "–"} ms`,
          h("pre", { class: "tail" }, e.stdout_tail || "", e.stderr_tail ? h("span", { class: "stderr" }, e.stderr_tail) : null),
        ],
      }));
      replace(this.history, table(["started", "command", "exit", "took", "output (tail)"], rows, { class: "grid" }));
    } catch (err) {
      replace(this.history, h("p", { class: "muted" }, `history unavailable: ${errorText(err)}`));
    }
  }
}
