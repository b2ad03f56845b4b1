// #/snapshots: every snapshot of the workspace with labels, retain, unique/shared bytes; label filter; the fork
// forest. Refreshed every 5 s.
import { errorText } from "../api.js";
import { fmtBytes, fmtTime, h, link, pairs, parsePairs, replace, table } from "../dom.js";
import { drawForkTree } from "../forktree.js";
import { toast } from "../ui.js";

export function snapshotsPage(app, root) {
  let snapshots = null;
  const filter = h("input", { testid: "snapshot-filter", placeholder: "label filter: key=value, …" });
  const failuresOnly = h("input", { type: "checkbox", testid: "snapshot-failures-only" });
  const list = h("div", { testid: "snapshot-list" }, h("p", { class: "muted" }, "Loading…"));
  const tree = h("div", { class: "tree-wrap", testid: "snapshot-forest" });

  function render() {
    if (snapshots === null) return;
    let wanted = {};
    try {
      wanted = parsePairs(filter.value);
    } catch {
      wanted = {};
    }
    const shown = snapshots.filter((s) => {
      const labels = s.labels || {};
      if (failuresOnly.checked && !labels["cryobox.capture"]) return false;
      return Object.entries(wanted).every(([k, v]) => labels[k] === v);
    });
    const rows = shown.map((s) => {
      const retain = h("input", { type: "checkbox", checked: !!s.retain, testid: "snapshot-retain", title: "retain" });
      retain.addEventListener("change", async () => {
        try {
          await app.api.patch(`/v1/snapshots/${encodeURIComponent(s.id)}`, { retain: retain.checked });
          s.retain = retain.checked;
        } catch (err) {
          retain.checked = !retain.checked;
          toast(errorText(err), "error");
        }
      });
      const kind = (s.labels || {})["cryobox.capture"];
      return {
        attrs: { testid: "snapshot-row", dataset: { id: s.id } },
        cells: [
          link(s.id, "snapshots", s.id),
          kind ? h("span", { class: "badge st-error" }, kind) : "",
          s.sandbox_id ? link(s.sandbox_id, "sandboxes", s.sandbox_id) : "–",
          s.template,
          fmtTime(s.created_at),
          pairs(s.labels, "snapshot-labels"),
          retain,
          fmtBytes(s.size_bytes),
          fmtBytes(s.unique_bytes),
          fmtBytes(s.shared_bytes),
          s.location || "–",
        ],
      };
    });
    replace(
      list,
      rows.length
        ? table(["id", "kind", "sandbox", "template", "created", "labels", "retain", "size", "unique", "shared", "where"], rows, {
            class: "grid",
          })
        : h("p", { class: "muted" }, "No snapshots."),
    );
    replace(tree, snapshots.length ? drawForkTree(shown) : "");
  }

  let lastText = "";
  function apply(fresh) {
    const text = JSON.stringify(fresh);
    if (text === lastText) return; // unchanged: keep the DOM (and the user's focus) as it is
    lastText = text;
    snapshots = fresh;
    render();
  }
  async function load() {
    try {
      apply((await app.api.get("/v1/snapshots")).snapshots);
    } catch (err) {
      replace(list, h("p", { class: "error" }, errorText(err)));
    }
  }

  filter.addEventListener("input", render);
  failuresOnly.addEventListener("change", render);
  root.append(
    h(
      "section",
      { testid: "page-snapshots" },
      h("h2", null, "Snapshots"),
      h("div", { class: "toolbar" }, filter, h("label", null, failuresOnly, " captured failures only")),
      list,
      h("div", { class: "card" }, h("h3", null, "Fork tree (from parent_id)"), tree),
    ),
  );
  load();
  // then live: the server's `snapshots` event (sent on every change, polled every 2 s, at least every 10 s)
  return app.live.on("snapshots", (data) => apply(data.snapshots));
}
