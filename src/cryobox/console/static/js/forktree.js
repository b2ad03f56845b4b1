// The fork tree of snapshots, drawn as SVG from their parent_id links (a parent that is not a snapshot in
// this workspace, e.g. a template generation, is drawn as a grey root). Labels are SVG text nodes.
const NS = "http://www.w3.org/2000/svg";
const COL_W = 210;
const ROW_H = 30;

function svg(tag, attrs, text) {
  const el = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  if (text !== undefined) el.textContent = text;
  return el;
}

/** Nodes and edges of the forest that holds `focusId` (or every tree when focusId is null). */
export function forest(snapshots, focusId) {
  const byId = new Map(snapshots.map((s) => [s.id, s]));
  const children = new Map();
  const roots = [];
  for (const s of snapshots) {
    const parent = s.parent_id;
    if (parent && byId.has(parent)) {
      if (!children.has(parent)) children.set(parent, []);
      children.get(parent).push(s.id);
    } else if (parent) {
      const key = `ext:${parent}`;
      if (!children.has(key)) {
        children.set(key, []);
        roots.push(key);
      }
      children.get(key).push(s.id);
    } else {
      roots.push(s.id);
    }
  }
  let keep = roots;
  if (focusId) {
    let top = focusId;
    const seen = new Set();
    while (byId.has(top) && !seen.has(top)) {
      seen.add(top);
      const parent = byId.get(top).parent_id;
      if (!parent) break;
      top = byId.has(parent) ? parent : `ext:${parent}`;
    }
    keep = roots.filter((r) => r === top);
  }
  return { byId, children, roots: keep };
}

export function drawForkTree(snapshots, focusId = null) {
  const { byId, children, roots } = forest(snapshots, focusId);
  const placed = [];
  const edges = [];
  let row = 0;
  const visit = (id, depth, seen) => {
    if (seen.has(id)) return row;
    seen.add(id);
    const kids = children.get(id) || [];
    const first = row;
    let y;
    if (!kids.length) {
      y = row;
      row += 1;
    } else {
      const ys = kids.map((k) => visit(k, depth + 1, seen));
      y = (ys[0] + ys[ys.length - 1]) / 2;
      for (const k of kids) edges.push([id, k]);
    }
    placed.push({ id, depth, y, first });
    return y;
  };
  const seen = new Set();
  for (const r of roots) visit(r, 0, seen);
  const pos = new Map(placed.map((p) => [p.id, p]));
  const depth = Math.max(0, ...placed.map((p) => p.depth));
  const width = (depth + 1) * COL_W + 20;
  const height = Math.max(1, row) * ROW_H + 10;
  const root = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, class: "forktree", "data-testid": "fork-tree" });
  const xy = (p) => [10 + p.depth * COL_W, 5 + p.y * ROW_H + ROW_H / 2];
  for (const [a, b] of edges) {
    const [x1, y1] = xy(pos.get(a));
    const [x2, y2] = xy(pos.get(b));
    root.append(svg("path", { d: `M${x1 + 150} ${y1} C${x1 + 175} ${y1}, ${x2 - 25} ${y2}, ${x2} ${y2}`, class: "edge" }));
  }
  for (const p of placed) {
    const [x, y] = xy(p);
    const external = p.id.startsWith("ext:");
    const snap = byId.get(p.id);
    const failure = snap && (snap.labels || {})["cryobox.capture"];
    const cls = ["node", external ? "external" : "", failure ? "failure" : "", p.id === focusId ? "focus" : ""].join(" ");
    const group = svg("g", { class: cls, "data-testid": "fork-tree-node", "data-id": external ? p.id.slice(4) : p.id });
    group.append(svg("rect", { x, y: y - 11, width: 150, height: 22, rx: 4 }));
    const label = svg("text", { x: x + 6, y: y + 4 }, external ? p.id.slice(4) : p.id);
    if (external) {
      group.append(label);
    } else {
      const anchor = svg("a", { href: `#/snapshots/${encodeURIComponent(p.id)}` });
      anchor.append(label);
      group.append(anchor);
    }
    group.append(svg("title", {}, external ? `parent ${p.id.slice(4)} (not a snapshot here)` : p.id));
    root.append(group);
  }
  return root;
}
