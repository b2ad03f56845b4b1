// The console's HTTP client: same-origin requests with the session cookie (HttpOnly, set by POST /ui/login);
// every non-GET request carries the session's CSRF token. The API key is sent once, in the login body, and never
// stored by the page (not in a URL, not in localStorage, not in a cookie the page can read).

export class ApiError extends Error {
  constructor(status, code, message, details) {
    super(message);
    this.status = status;
    this.code = code;
    this.details = details || {};
  }
}

export class Api {
  constructor() {
    this.csrf = null;
    this.workspace = null;
    this.onUnauthorized = null;
  }

  setSession(session) {
    this.csrf = session ? session.csrf_token : null;
    this.workspace = session ? session.workspace : null;
  }

  async request(method, path, options = {}) {
    const headers = { ...(options.headers || {}) };
    let body = options.body;
    if (method !== "GET" && method !== "HEAD" && this.csrf) headers["X-CSRF-Token"] = this.csrf;
    if (options.json !== undefined) {
      headers["Content-Type"] = "application/json";
      body = JSON.stringify(options.json);
    }
    let response;
    try {
      response = await fetch(path, { method, headers, body, credentials: "same-origin", cache: "no-store" });
    } catch (err) {
      throw new ApiError(0, "network", `network error: ${err.message}`);
    }
    if (!response.ok) {
      let payload = {};
      try {
        payload = await response.json();
      } catch {
        payload = {};
      }
      const error = new ApiError(
        response.status,
        payload.code || `http_${response.status}`,
        payload.error || response.statusText || `HTTP ${response.status}`,
        payload.details,
      );
      if (response.status === 401 && this.onUnauthorized && !options.noRedirect) this.onUnauthorized(error);
      throw error;
    }
    if (options.raw) return response;
    if (response.status === 204) return null;
    const type = response.headers.get("content-type") || "";
    return type.includes("json") ? response.json() : response.text();
  }

  get(path, options) {
    return this.request("GET", path, options);
  }

  post(path, json, options = {}) {
    return this.request("POST", path, { ...options, json: json === undefined ? {} : json });
  }

  patch(path, json) {
    return this.request("PATCH", path, { json });
  }

  put(path, json) {
    return this.request("PUT", path, { json });
  }

  del(path) {
    return this.request("DELETE", path);
  }
}

/** `/v1/sandboxes/<id>...` with the id URL-encoded. */
export function sbxPath(id, rest = "") {
  return `/v1/sandboxes/${encodeURIComponent(id)}${rest}`;
}

export function snapPath(id, rest = "") {
  return `/v1/snapshots/${encodeURIComponent(id)}${rest}`;
}

export function errorText(err) {
  if (err instanceof ApiError) return `${err.message} (${err.code}${err.status ? `, HTTP ${err.status}` : ""})`;
  return String(err && err.message ? err.message : err);
}
