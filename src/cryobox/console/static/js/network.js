// A sandbox's network policy (GET/PUT /v1/sandboxes/{id}/network) and its egress decision log
// (GET /v1/sandboxes/{id}/egress). The form sends the WHOLE policy: a PUT replaces the policy in force, and a field
// left out would be reset to its default, so every field is in the form, filled from the policy in force.
import { errorText, sbxPath } from "./api.js";
import { fmtBytes, fmtTime, h, replace, table } from "./dom.js";

export const LOG_LIMIT = 100;

/** One rule per line (blank lines and surrounding spaces ignored), as the API's list. */
export function parseRules(text) {
  return String(text || "")
    .split("\n")
    .map((line) => line.trim())
    .filter((line) => line !== "");
}

/** "443, 80 8080" -> [443, 80, 8080]; throws on anything that is not a port. */
export function parsePorts(text) {
  return String(text || "")
    .split(/[\s,]+/)
    .filter((item) => item !== "")
    .map((item) => {
      const port = Number(item);
      if (!/^\d+$/.test(item) || port < 1 || port > 65535) throw new Error(`"${item}" is not a port (1–65535)`);
      return port;
    });
}

/** The PUT body: the whole policy from the form's values. */
export function policyFromForm({ defaultAction, allow, deny, ports, publicTraffic, maskHost }) {
  const mask = String(maskHost || "").trim();
  return {
    default: defaultAction === "allow" ? "allow" : "deny",
    allow: parseRules(allow),
    deny: parseRules(deny),
    ports: parsePorts(ports),
    public_traffic: Boolean(publicTraffic),
    mask_request_host: mask === "" ? null : mask,
  };
}

/** The log's items newest first (the API sends them oldest first). */
export function newestFirst(items) {
  return [...(items || [])].reverse();
}

function summary(policy) {
  if (!policy) return h("p", { class: "muted" }, "No policy reported.");
  const list = (rules, none) => (rules.length ? rules.join(" ") : none);
  return table(
    ["default", "allow", "deny", "ports", "public traffic", "request host"],
    [
      {
        attrs: { testid: "network-policy-row" },
        cells: [
          h("span", { class: `badge verdict-${policy.default}`, testid: "network-default" }, policy.default),
          h("code", { testid: "network-allow" }, list(policy.allow, "–")),
          h("code", { testid: "network-deny" }, list(policy.deny, "–")),
          list(policy.ports.map(String), "any"),
          policy.public_traffic ? "yes" : "token needed",
          policy.mask_request_host || "–",
        ],
      },
    ],
    { class: "grid" },
  );
}

export class NetworkPanel {
  constructor(api, sandboxId) {
    this.api = api;
    this.sandboxId = sandboxId;
    this.current = h("div", { testid: "network-policy" }, h("p", { class: "muted" }, "Loading…"));
    this.defaultAction = h(
      "select",
      { testid: "network-form-default" },
      h("option", { value: "deny" }, "deny"),
      h("option", { value: "allow" }, "allow"),
    );
    this.allow = h("textarea", { rows: 4, testid: "network-form-allow", placeholder: "10.0.0.0/8\nexample.org\n*.example.org" });
    this.deny = h("textarea", { rows: 4, testid: "network-form-deny", placeholder: "one rule per line" });
    this.ports = h("input", { testid: "network-form-ports", placeholder: "any (e.g. 80, 443)" });
    this.publicTraffic = h("input", { type: "checkbox", testid: "network-form-public", checked: true });
    this.maskHost = h("input", { testid: "network-form-mask", placeholder: "the caller's Host" });
    this.save = h("button", { type: "submit", class: "primary", testid: "network-form-save" }, "Replace policy");
    this.status = h("div", { testid: "network-form-status", class: "result" });
    const form = h(
      "form",
      { class: "form-grid", testid: "network-form" },
      h("label", null, "default", this.defaultAction),
      h("label", null, "allow (one per line)", this.allow),
      h("label", null, "deny (one per line)", this.deny),
      h("label", null, "ports", this.ports),
      h("label", null, "public traffic", this.publicTraffic),
      h("label", null, "request host", this.maskHost),
      h("p", { class: "muted" }, "Saving replaces the whole policy; connections it no longer allows are cut."),
      this.save,
    );
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      this.submit();
    });
    this.log = h("div", { testid: "egress-log" });
    const reload = h("button", { type: "button", class: "small", testid: "egress-refresh" }, "Refresh");
    reload.addEventListener("click", () => this.loadLog());
    this.el = h(
      "div",
      { class: "network-panel" },
      h("h4", null, "Policy in force"),
      this.current,
      form,
      this.status,
      h("div", { class: "toolbar" }, h("h4", null, "Egress decisions (newest first)"), reload),
      this.log,
    );
  }

  /** Show `policy` as the one in force; `fill` also puts it in the form (not while the user edits it). */
  show(policy, fill = false) {
    replace(this.current, summary(policy));
    if (!policy || !fill) return;
    this.defaultAction.value = policy.default;
    this.allow.value = policy.allow.join("\n");
    this.deny.value = policy.deny.join("\n");
    this.ports.value = policy.ports.join(", ");
    this.publicTraffic.checked = policy.public_traffic;
    this.maskHost.value = policy.mask_request_host || "";
  }

  async load() {
    try {
      this.show(await this.api.get(sbxPath(this.sandboxId, "/network")), true);
    } catch (err) {
      replace(this.current, h("p", { class: "error", testid: "network-error" }, errorText(err)));
    }
    await this.loadLog();
  }

  async submit() {
    let body;
    try {
      body = policyFromForm({
        defaultAction: this.defaultAction.value,
        allow: this.allow.value,
        deny: this.deny.value,
        ports: this.ports.value,
        publicTraffic: this.publicTraffic.checked,
        maskHost: this.maskHost.value,
      });
    } catch (err) {
      replace(this.status, h("span", { class: "error", testid: "network-form-error" }, errorText(err)));
      return;
    }
    this.save.disabled = true;
    replace(this.status, "Saving…");
    try {
      const sandbox = await this.api.put(sbxPath(this.sandboxId, "/network"), body);
      this.show(sandbox.network || body, true);
      replace(this.status, h("span", { testid: "network-form-saved" }, "Policy replaced."));
      this.loadLog();
    } catch (err) {
      // a 400 names the field and what is wrong with it (e.g. "network.allow.0: ...")
      replace(this.status, h("span", { class: "error", testid: "network-form-error" }, errorText(err)));
    } finally {
      this.save.disabled = false;
    }
  }

  async loadLog() {
    try {
      const body = await this.api.get(sbxPath(this.sandboxId, `/egress?limit=${LOG_LIMIT}`));
      const items = newestFirst(body.items);
      const dropped = body.dropped ? h("p", { class: "muted" }, `${body.dropped} older decisions no longer kept.`) : null;
      if (!items.length) {
        replace(this.log, h("p", { class: "muted" }, "No egress decisions recorded yet."), dropped);
        return;
      }
      const rows = items.map((d) => ({
        attrs: { testid: "egress-row", dataset: { allowed: String(Boolean(d.allowed)) } },
        cells: [
          fmtTime(d.time),
          d.name === null || d.name === undefined ? "–" : h("code", null, d.name),
          d.ip || "–",
          String(d.port),
          h("span", { class: `badge verdict-${d.allowed ? "allow" : "deny"}` }, d.allowed ? "allowed" : "denied"),
          d.reason,
          fmtBytes(d.bytes_out),
          fmtBytes(d.bytes_in),
          d.error || "",
        ],
      }));
      replace(
        this.log,
        table(["time", "name", "ip", "port", "verdict", "reason", "out", "in", "error"], rows, { class: "grid" }),
        dropped,
      );
    } catch (err) {
      replace(this.log, h("p", { class: "muted" }, `egress log unavailable: ${errorText(err)}`));
    }
  }
}
