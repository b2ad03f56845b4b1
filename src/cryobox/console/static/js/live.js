// One EventSource per logged-in page on GET /ui/api/events (cookie-authenticated). Pages subscribe to event
// types ("sandboxes", "metrics", "agents", "snapshots", "templates"); the last payload of each type is replayed to a new subscriber.

export class Live {
  constructor(statusEl) {
    this.statusEl = statusEl;
    this.source = null;
    this.subscribers = new Map();
    this.last = new Map();
    this.retry = null;
    this.onUnauthorized = null;
  }

  start() {
    if (this.source) return;
    const source = new EventSource("/ui/api/events", { withCredentials: true });
    this.source = source;
    this.setStatus("connecting");
    source.onopen = () => this.setStatus("live");
    source.onerror = (event) => {
      if (event.data) {
        // the server's own `error` event: the session ended or the key was revoked
        this.stop();
        if (this.onUnauthorized) this.onUnauthorized();
        return;
      }
      if (source.readyState !== EventSource.CLOSED) {
        this.setStatus("reconnecting");
        return;
      }
      // the browser gave up (an HTTP error such as a restart's 502): try again later, unless stopped
      this.setStatus("offline");
      if (this.source === source) {
        this.source = null;
        this.retry = setTimeout(() => this.start(), 5000);
      }
    };
    for (const type of ["sandboxes", "metrics", "agents", "snapshots", "templates"]) {
      source.addEventListener(type, (event) => {
        let data;
        try {
          data = JSON.parse(event.data);
        } catch {
          return;
        }
        this.last.set(type, data);
        for (const fn of this.subscribers.get(type) || []) fn(data);
      });
    }
  }

  stop() {
    clearTimeout(this.retry);
    if (this.source) this.source.close();
    this.source = null;
    this.last.clear();
    this.setStatus("offline");
  }

  /** Call `fn(data)` for each event of `type`; returns the unsubscribe function. */
  on(type, fn) {
    if (!this.subscribers.has(type)) this.subscribers.set(type, new Set());
    this.subscribers.get(type).add(fn);
    if (this.last.has(type)) fn(this.last.get(type));
    return () => this.subscribers.get(type).delete(fn);
  }

  setStatus(text) {
    if (!this.statusEl) return;
    this.statusEl.textContent = text;
    this.statusEl.dataset.state = text;
  }
}
