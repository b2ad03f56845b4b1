// DOM helpers. Every string passed as a child becomes a text node: guest- and user-supplied strings are never
// parsed as HTML anywhere in the console (no innerHTML, no insertAdjacentHTML).

/**
 * Create an element. attrs: `class`, `testid` (data-testid), `on<event>` handlers, `dataset` (object), DOM
 * properties for booleans/numbers (disabled, checked, value), anything else via setAttribute.
 */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") {
      el.addEventListener(key.slice(2), value);
    } else if (key === "class") {
      el.className = value;
    } else if (key === "testid") {
      el.setAttribute("data-testid", value);
    } else if (key === "dataset") {
      for (const [k, v] of Object.entries(value)) el.dataset[k] = String(v);
    } else if (key === "value" || key === "checked" || key === "disabled" || key === "selected") {
      el[key] = value;
    } else {
      el.setAttribute(key, value === true ? "" : String(value));
    }
  }
  append(el, children);
  return el;
}

/** Append children (nodes, strings, numbers, nested arrays; null/undefined/false skipped). */
export function append(el, children) {
  for (const child of [children].flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/** Replace all children of `el`. */
export function replace(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

/** A link to a console route (`#/...`), path segments URL-encoded. */
export function link(text, ...segments) {
  const href = "#/" + segments.map((s) => encodeURIComponent(String(s))).join("/");
  return h("a", { href }, text);
}

export function fmtBytes(n) {
  if (n === null || n === undefined || Number.isNaN(Number(n))) return "–";
  let value = Number(n);
  for (const unit of ["B", "KiB", "MiB", "GiB", "TiB"]) {
    if (Math.abs(value) < 1024 || unit === "TiB") return unit === "B" ? `${value} B` : `${value.toFixed(1)} ${unit}`;
    value /= 1024;
  }
  return String(n);
}

/** "3 s", "5 min", "2 h 10 min", "4 d" */
export function fmtDuration(seconds) {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return "–";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
}

/** Seconds since epoch from an RFC 3339 string or a unix number (either may arrive). */
export function toEpoch(value) {
  if (value === null || value === undefined || value === "") return null;
  if (typeof value === "number") return value > 1e12 ? value / 1000 : value;
  const ms = Date.parse(value);
  return Number.isNaN(ms) ? null : ms / 1000;
}

export function now() {
  return Date.now() / 1000;
}

export function fmtTime(value) {
  const t = toEpoch(value);
  return t === null ? "–" : new Date(t * 1000).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

/** "k=v, k2=v2" -> {k: "v", k2: "v2"}; throws on an entry without "=". */
export function parsePairs(text) {
  const out = {};
  for (const part of String(text || "").split(",")) {
    const item = part.trim();
    if (!item) continue;
    const eq = item.indexOf("=");
    if (eq <= 0) throw new Error(`"${item}" is not key=value`);
    out[item.slice(0, eq).trim()] = item.slice(eq + 1).trim();
  }
  return out;
}

/** Chips for a str->str map (labels, metadata), as text. */
export function pairs(map, testid) {
  const entries = Object.entries(map || {});
  if (!entries.length) return h("span", { class: "muted" }, "–");
  return h(
    "span",
    { class: "chips", testid },
    entries.map(([k, v]) => h("span", { class: "chip" }, h("b", null, k), "=", v)),
  );
}

export function statusBadge(status, testid) {
  return h("span", { class: `badge st-${String(status).replace(/[^a-z_-]/gi, "")}`, testid }, status);
}

/** A table with a header row; rows: arrays of cells (nodes or strings) or {cells, attrs}. */
export function table(headers, rows, attrs) {
  return h(
    "table",
    attrs,
    h("thead", null, h("tr", null, headers.map((t) => h("th", null, t)))),
    h(
      "tbody",
      null,
      rows.map((row) => {
        const spec = Array.isArray(row) ? { cells: row, attrs: null } : row;
        return h("tr", spec.attrs, spec.cells.map((c) => h("td", null, c)));
      }),
    ),
  );
}
