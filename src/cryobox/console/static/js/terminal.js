// The sandbox terminal: xterm.js (vendored) over the PTY websocket, authenticated by a single-use ticket
// (POST /v1/sandboxes/{id}/pty/tickets with the session cookie + CSRF header). Frames (server/routes_pty.py):
// server->client binary = output, text = JSON {session}|{exit_code}|{error, code}; client->server binary =
// input, text {"resize": [cols, rows]}.
import { Terminal } from "../vendor/xterm/xterm.js";
import { FitAddon } from "../vendor/addon-fit/addon-fit.js";
import { sbxPath, errorText } from "./api.js";
import { h } from "./dom.js";

/**
 * xterm.js's DOM renderer writes its per-terminal CSS into <style> elements, which the console's CSP
 * (style-src 'self') blocks. Mirror each such element into a constructed stylesheet (CSSOM, allowed by the CSP;
 * Chromium and Firefox both support document.adoptedStyleSheets).
 */
class StyleMirror {
  constructor(container) {
    this.sheets = new Map();
    this.observer = new MutationObserver(() => this.sync(container));
    this.observer.observe(container, { childList: true, subtree: true, characterData: true });
    this.sync(container);
  }

  sync(container) {
    const seen = new Set();
    for (const el of container.querySelectorAll("style")) {
      seen.add(el);
      let entry = this.sheets.get(el);
      if (!entry) {
        entry = { sheet: new CSSStyleSheet(), text: null };
        this.sheets.set(el, entry);
        document.adoptedStyleSheets = [...document.adoptedStyleSheets, entry.sheet];
      }
      if (entry.text !== el.textContent) {
        entry.text = el.textContent;
        entry.sheet.replaceSync(entry.text);
      }
    }
    for (const [el, entry] of [...this.sheets]) {
      if (!seen.has(el)) this.drop(el, entry);
    }
  }

  drop(el, entry) {
    this.sheets.delete(el);
    document.adoptedStyleSheets = document.adoptedStyleSheets.filter((s) => s !== entry.sheet);
  }

  dispose() {
    this.observer.disconnect();
    for (const [el, entry] of [...this.sheets]) this.drop(el, entry);
  }
}

export class TerminalPanel {
  constructor(api, sandboxId) {
    this.api = api;
    this.sandboxId = sandboxId;
    this.ws = null;
    this.status = h("span", { class: "muted", testid: "terminal-status" }, "not connected");
    this.connectButton = h("button", { type: "button", testid: "terminal-connect" }, "Connect");
    this.screen = h("div", { class: "terminal-screen", testid: "terminal" });
    this.el = h(
      "div",
      { class: "terminal-panel" },
      h("div", { class: "toolbar" }, this.connectButton, this.status),
      this.screen,
    );
    this.term = null;
    this.mirror = null;
    this.connectButton.addEventListener("click", () => this.connect());
    this.onWindowResize = () => this.fit();
  }

  /** Call after `el` is in the document. */
  mount() {
    this.mirror = new StyleMirror(this.screen);
    this.term = new Terminal({
      cols: 100,
      rows: 24,
      convertEol: false,
      cursorBlink: true,
      fontFamily: '"DejaVu Sans Mono", monospace',
      fontSize: 14,
      scrollback: 2000,
    });
    this.fitAddon = new FitAddon();
    this.term.loadAddon(this.fitAddon);
    this.term.open(this.screen);
    this.fit();
    const encoder = new TextEncoder();
    this.term.onData((data) => {
      if (this.ws && this.ws.readyState === WebSocket.OPEN) this.ws.send(encoder.encode(data));
    });
    this.term.onResize(({ cols, rows }) => {
      if (this.ws && this.ws.readyState === WebSocket.OPEN) this.ws.send(JSON.stringify({ resize: [cols, rows] }));
    });
    window.addEventListener("resize", this.onWindowResize);
  }

  fit() {
    try {
      this.fitAddon.fit();
    } catch {
      /* not laid out yet */
    }
  }

  setStatus(text, state) {
    this.status.textContent = text;
    this.status.dataset.state = state;
  }

  async connect() {
    this.close();
    this.setStatus("connecting…", "connecting");
    let ticket;
    try {
      ticket = await this.api.post(sbxPath(this.sandboxId, "/pty/tickets"), {});
    } catch (err) {
      this.setStatus(`could not connect: ${errorText(err)}`, "error");
      return;
    }
    const proto = location.protocol === "https:" ? "wss:" : "ws:";
    const query = new URLSearchParams({
      ticket: ticket.ticket,
      cols: String(this.term.cols),
      rows: String(this.term.rows),
    });
    const ws = new WebSocket(`${proto}//${location.host}${sbxPath(this.sandboxId, "/pty")}?${query}`);
    ws.binaryType = "arraybuffer";
    this.ws = ws;
    ws.onmessage = (event) => {
      if (typeof event.data !== "string") {
        this.term.write(new Uint8Array(event.data));
        return;
      }
      let message;
      try {
        message = JSON.parse(event.data);
      } catch {
        return;
      }
      if (message.session !== undefined) {
        this.setStatus("connected", "connected");
        this.term.focus();
      } else if (message.exit_code !== undefined) {
        this.setStatus(`shell exited (${message.exit_code})`, "exited");
      } else if (message.error !== undefined) {
        this.setStatus(`error: ${message.error} (${message.code})`, "error");
      }
    };
    ws.onclose = () => {
      if (this.ws === ws) {
        this.ws = null;
        if (this.status.dataset.state === "connected" || this.status.dataset.state === "connecting") {
          this.setStatus("disconnected", "closed");
        }
      }
    };
  }

  close() {
    if (this.ws) {
      const ws = this.ws;
      this.ws = null;
      ws.close();
    }
  }

  dispose() {
    this.close();
    window.removeEventListener("resize", this.onWindowResize);
    if (this.term) this.term.dispose();
    if (this.mirror) this.mirror.dispose();
  }
}
