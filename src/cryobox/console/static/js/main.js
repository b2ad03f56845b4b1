// The console's entry point: session check, hash router, top bar, logout.
import { Api, errorText } from "./api.js";
import { Live } from "./live.js";
import { replace } from "./dom.js";
import { toast } from "./ui.js";
import { loginPage } from "./pages/login.js";
import { sandboxesPage } from "./pages/sandboxes.js";
import { sandboxPage } from "./pages/sandbox.js";
import { snapshotsPage } from "./pages/snapshots.js";
import { snapshotPage } from "./pages/snapshot.js";
import { templatesPage } from "./pages/templates.js";
import { volumesPage } from "./pages/volumes.js";
import { fleetPage } from "./pages/fleet.js";

const ROUTES = [
  [/^#\/login$/, loginPage, false],
  [/^#\/sandboxes$/, sandboxesPage, true],
  [/^#\/sandboxes\/([^/]+)$/, sandboxPage, true],
  [/^#\/snapshots$/, snapshotsPage, true],
  [/^#\/snapshots\/([^/]+)$/, snapshotPage, true],
  [/^#\/volumes$/, volumesPage, true],
  [/^#\/templates$/, templatesPage, true],
  [/^#\/fleet$/, fleetPage, true],
];

class App {
  constructor() {
    this.api = new Api();
    this.root = document.getElementById("app");
    this.topbar = document.querySelector("[data-testid=topbar]");
    this.live = new Live(document.querySelector("[data-testid=live-status]"));
    this.cleanup = null;
    this.loggedIn = false;
    this.api.onUnauthorized = () => this.sessionEnded();
    this.live.onUnauthorized = () => this.sessionEnded();
    document.querySelector("[data-testid=logout]").addEventListener("click", () => this.logout());
    window.addEventListener("hashchange", () => this.route());
  }

  async start() {
    // on #/login the form shows at once, while the session check runs (a live session then moves on; without
    // one the form stays as it is: rendering it again would drop what the user typed or submitted meanwhile)
    const shown = location.hash === "#/login";
    if (shown) this.route();
    try {
      const session = await this.api.get("/ui/session", { noRedirect: true });
      this.loggedInAs(session);
    } catch {
      this.loggedIn = false;
      if (shown && location.hash === "#/login") return;
    }
    this.route();
  }

  loggedInAs(session) {
    this.api.setSession(session);
    this.loggedIn = true;
    document.querySelector("[data-testid=workspace]").textContent = session.workspace || "";
    this.topbar.hidden = false;
    this.live.start();
  }

  sessionEnded() {
    if (!this.loggedIn) return;
    this.loggedIn = false;
    this.api.setSession(null);
    this.live.stop();
    this.topbar.hidden = true;
    toast("Your session ended; log in again.", "error");
    this.go("#/login");
  }

  async logout() {
    try {
      await this.api.request("POST", "/ui/logout", { noRedirect: true });
    } catch (err) {
      toast(errorText(err), "error");
    }
    this.loggedIn = false;
    this.api.setSession(null);
    this.live.stop();
    this.topbar.hidden = true;
    this.go("#/login");
  }

  go(hash) {
    if (location.hash === hash) this.route();
    else location.hash = hash;
  }

  route() {
    const hash = location.hash || "";
    if (!this.loggedIn && hash !== "#/login") return this.go("#/login");
    if (this.loggedIn && (hash === "" || hash === "#/" || hash === "#/login")) return this.go("#/sandboxes");
    const match = ROUTES.map(([re, page, auth]) => [hash.match(re), page, auth]).find(([m]) => m);
    if (this.cleanup) {
      try {
        this.cleanup();
      } catch (err) {
        console.error(err);
      }
      this.cleanup = null;
    }
    this.topbar.hidden = !this.loggedIn;
    for (const a of this.topbar.querySelectorAll("nav a")) {
      a.classList.toggle("active", hash.startsWith(a.getAttribute("href")));
    }
    replace(this.root);
    if (!match) {
      this.root.append(document.createTextNode("No such page."));
      return undefined;
    }
    const [m, page] = match;
    const params = m.slice(1).map((p) => decodeURIComponent(p));
    const result = page(this, this.root, ...params);
    this.cleanup = typeof result === "function" ? result : null;
    return undefined;
  }
}

const app = new App();
app.start();
