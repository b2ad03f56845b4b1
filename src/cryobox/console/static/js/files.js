// The sandbox file browser: list a directory (GET .../fs/dir), download (a same-origin link; GET needs only the
// cookie), upload (PUT .../fs?path= with the file as the raw body).
import { errorText, sbxPath } from "./api.js";
import { fmtBytes, fmtTime, h, replace, table } from "./dom.js";
import { toast } from "./ui.js";

function join(dir, name) {
  return dir.endsWith("/") ? dir + name : `${dir}/${name}`;
}

function parent(dir) {
  const trimmed = dir.replace(/\/+$/, "");
  const cut = trimmed.lastIndexOf("/");
  return cut <= 0 ? "/" : trimmed.slice(0, cut);
}

function modeText(mode) {
  return (Number(mode) & 0o7777).toString(8).padStart(4, "0");
}

export class FilesPanel {
  constructor(api, sandboxId, start = "/root") {
    this.api = api;
    this.sandboxId = sandboxId;
    this.path = h("input", { testid: "files-path", value: start, class: "wide" });
    this.list = h("div", { testid: "files-list" });
    this.upload = h("input", { type: "file", testid: "files-upload-input", multiple: true });
    const go = h("button", { type: "submit", testid: "files-go" }, "List");
    const up = h("button", { type: "button", testid: "files-up" }, "Up");
    const form = h("form", { class: "toolbar" }, this.path, go, up, h("label", null, "Upload to this directory: ", this.upload));
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      this.load();
    });
    up.addEventListener("click", () => {
      this.path.value = parent(this.path.value);
      this.load();
    });
    this.upload.addEventListener("change", () => this.uploadFiles());
    this.el = h("div", { class: "files-panel" }, form, this.list);
  }

  async load() {
    const dir = this.path.value || "/";
    try {
      const listing = await this.api.get(`${sbxPath(this.sandboxId, "/fs/dir")}?${new URLSearchParams({ path: dir })}`);
      const entries = [...listing.entries].sort(
        (a, b) => Number(b.is_dir) - Number(a.is_dir) || a.name.localeCompare(b.name),
      );
      const rows = entries.map((entry) => {
        const full = join(dir, entry.name);
        const name = entry.is_dir
          ? h("a", { href: "#", class: "dir", testid: "file-name", onclick: (e) => this.open(e, full) }, `${entry.name}/`)
          : h("span", { testid: "file-name" }, entry.name);
        const download = entry.is_dir
          ? ""
          : h(
              "a",
              {
                href: `${sbxPath(this.sandboxId, "/fs")}?${new URLSearchParams({ path: full })}`,
                download: entry.name,
                testid: "file-download",
              },
              "download",
            );
        return {
          attrs: { testid: "file-row", dataset: { name: entry.name, dir: entry.is_dir ? "1" : "0" } },
          cells: [name, entry.is_dir ? "–" : fmtBytes(entry.size), modeText(entry.mode), fmtTime(entry.mtime), download],
        };
      });
      replace(
        this.list,
        rows.length ? table(["name", "size", "mode", "modified", ""], rows, { class: "grid" }) : h("p", { class: "muted" }, "(empty)"),
      );
    } catch (err) {
      replace(this.list, h("p", { class: "error", testid: "files-error" }, errorText(err)));
    }
  }

  open(event, path) {
    event.preventDefault();
    this.path.value = path;
    this.load();
  }

  async uploadFiles() {
    const dir = this.path.value || "/";
    for (const file of [...this.upload.files]) {
      try {
        const url = `${sbxPath(this.sandboxId, "/fs")}?${new URLSearchParams({ path: join(dir, file.name) })}`;
        const result = await this.api.request("PUT", url, {
          body: file,
          headers: { "Content-Type": "application/octet-stream" },
        });
        toast(`uploaded ${result.path} (${fmtBytes(result.bytes)})`);
      } catch (err) {
        toast(`upload of ${file.name} failed: ${errorText(err)}`, "error");
      }
    }
    this.upload.value = "";
    this.load();
  }
}
