/** The workspace-level clients: `Snapshots`, `Volumes` (templates are in `templates.ts`). */
import { InvalidArgument, SandboxTimeout } from "./errors.js";
import { type CallOptions, type ClientOptions, Http } from "./http.js";
import type { SnapshotInfo, VolumeEntry, VolumeInfo, VolumeRestored } from "./types.js";

/** A client of one API endpoint (`apiUrl` / `apiKey` default to `$CRYOBOX_API_URL` / `$CRYOBOX_API_KEY`). */
export class ApiClient {
  readonly http: Http;

  constructor(options: ClientOptions = {}) {
    this.http = Http.from(options);
  }
}

function labelQuery(prefix: string, labels: Record<string, string> | undefined): Record<string, string> {
  return Object.fromEntries(Object.entries(labels ?? {}).map(([key, value]) => [`${prefix}${key}`, value]));
}

/** The workspace's snapshots. Take one with `sbx.snapshot()`; restore with `Sandbox.create({ fromSnapshot })`. */
export class Snapshots extends ApiClient {
  /** Snapshots, newest first: only `sandboxId`'s when given, only those whose labels contain `labels`. */
  async list(
    options: CallOptions & { sandboxId?: string; labels?: Record<string, string> } = {},
  ): Promise<SnapshotInfo[]> {
    const { sandboxId, labels, ...call } = options;
    const query = { sandbox_id: sandboxId, ...labelQuery("label.", labels) };
    return (await this.http.json<{ snapshots: SnapshotInfo[] }>({ method: "GET", path: "/v1/snapshots", query, ...call }))
      .snapshots;
  }

  /** @throws {NotFound} no such snapshot (or another workspace's). */
  async get(snapshotId: string, options: CallOptions = {}): Promise<SnapshotInfo> {
    return this.http.json<SnapshotInfo>({ method: "GET", path: snapshotPath(snapshotId), ...options });
  }

  /** Delete it: its registry row, its objects in the store and every host's copy. */
  async delete(snapshotId: string, options: CallOptions = {}): Promise<void> {
    await this.http.empty({ method: "DELETE", path: snapshotPath(snapshotId), ...options });
  }

  /** Replace its labels (the whole map) and/or set `retain`; an absent field is unchanged. */
  async update(
    snapshotId: string,
    change: { labels?: Record<string, string>; retain?: boolean },
    options: CallOptions = {},
  ): Promise<SnapshotInfo> {
    return this.http.json<SnapshotInfo>({ method: "PATCH", path: snapshotPath(snapshotId), json: change, ...options });
  }

  /** Wait until the snapshot is in the object store (`location == "stored"`): any host can restore it then.
   * @throws {SandboxTimeout} not stored within `waitMs`. */
  async waitStored(
    snapshotId: string,
    options: CallOptions & { waitMs?: number; pollMs?: number } = {},
  ): Promise<SnapshotInfo> {
    const { waitMs = 300_000, pollMs = 500, ...call } = options;
    const { now, sleep } = this.http.config.retry;
    const deadline = now() + waitMs;
    for (;;) {
      const snapshot = await this.get(snapshotId, call);
      if (snapshot.location === "stored") return snapshot;
      if (now() >= deadline) {
        throw new SandboxTimeout(`snapshot ${snapshotId} was not stored within ${waitMs} ms`, {
          details: { id: snapshotId },
        });
      }
      await sleep(pollMs, call.signal);
    }
  }
}

export function snapshotPath(snapshotId: string, suffix = ""): string {
  return `/v1/snapshots/${encodeURIComponent(snapshotId)}${suffix}`;
}

const VOLUME_NAME = /^[A-Za-z0-9._-]{1,64}$/;

function volumePath(name: string, suffix = ""): string {
  if (!VOLUME_NAME.test(name)) {
    throw new InvalidArgument(`volume name ${JSON.stringify(name.slice(0, 80))} must be 1-64 of A-Z a-z 0-9 . _ -`, {
      details: { name },
    });
  }
  return `/v1/volumes/${encodeURIComponent(name)}${suffix}`;
}

function inVolume(path: string): string {
  if (!path || path.includes("\0") || path.length > 4096) {
    throw new InvalidArgument("a path in a volume is 1-4096 characters without NUL", { details: { path } });
  }
  return path.startsWith("/") ? path : `/${path}`;
}

/** The workspace's volumes: named ext4 file systems that outlive sandboxes (mount them with `create({ volumes })`). */
export class Volumes extends ApiClient {
  async create(name: string, options: CallOptions & { sizeMb?: number } = {}): Promise<VolumeInfo> {
    const { sizeMb = 1024, ...call } = options;
    volumePath(name);
    return this.http.json<VolumeInfo>({ method: "POST", path: "/v1/volumes", json: { name, size_mb: sizeMb }, ...call });
  }

  async list(options: CallOptions = {}): Promise<VolumeInfo[]> {
    return (await this.http.json<{ items: VolumeInfo[] }>({ method: "GET", path: "/v1/volumes", ...options })).items;
  }

  async get(name: string, options: CallOptions = {}): Promise<VolumeInfo> {
    return this.http.json<VolumeInfo>({ method: "GET", path: volumePath(name), ...options });
  }

  async resize(name: string, sizeMb: number, options: CallOptions = {}): Promise<VolumeInfo> {
    return this.http.json<VolumeInfo>({ method: "PATCH", path: volumePath(name), json: { size_mb: sizeMb }, ...options });
  }

  /** @throws {StateError} a sandbox has it mounted. */
  async delete(name: string, options: CallOptions = {}): Promise<void> {
    await this.http.empty({ method: "DELETE", path: volumePath(name), ...options });
  }

  /** Restore a `lost` volume from its last stored copy (says from when). */
  async restore(name: string, options: CallOptions = {}): Promise<VolumeRestored> {
    return this.http.json<VolumeRestored>({ method: "POST", path: volumePath(name, "/restore"), ...options });
  }

  async readFile(name: string, path: string, options: CallOptions = {}): Promise<Uint8Array> {
    return this.http.bytes({ method: "GET", path: volumePath(name, "/files"), query: { path: inVolume(path) }, ...options });
  }

  async writeFile(
    name: string,
    path: string,
    data: string | Uint8Array,
    options: CallOptions & { overwrite?: boolean } = {},
  ): Promise<VolumeEntry> {
    const { overwrite = true, ...call } = options;
    return this.http.json<VolumeEntry>({
      method: "PUT",
      path: volumePath(name, "/files"),
      query: { path: inVolume(path), overwrite },
      body: typeof data === "string" ? new TextEncoder().encode(data) : data,
      headers: { "Content-Type": "application/octet-stream" },
      ...call,
    });
  }

  async listFiles(name: string, path = "/", options: CallOptions & { depth?: number } = {}): Promise<VolumeEntry[]> {
    const { depth = 1, ...call } = options;
    const query = { path: inVolume(path), depth };
    return (await this.http.json<{ items: VolumeEntry[] }>({ method: "GET", path: volumePath(name, "/entries"), query, ...call }))
      .items;
  }

  async stat(name: string, path: string, options: CallOptions = {}): Promise<VolumeEntry> {
    return this.http.json<VolumeEntry>({ method: "GET", path: volumePath(name, "/stat"), query: { path: inVolume(path) }, ...options });
  }

  async makeDir(name: string, path: string, options: CallOptions & { parents?: boolean } = {}): Promise<VolumeEntry> {
    const { parents = false, ...call } = options;
    const query = { path: inVolume(path), parents };
    return this.http.json<VolumeEntry>({ method: "POST", path: volumePath(name, "/dirs"), query, ...call });
  }

  async remove(name: string, path: string, options: CallOptions = {}): Promise<void> {
    await this.http.empty({ method: "DELETE", path: volumePath(name, "/files"), query: { path: inVolume(path) }, ...options });
  }
}
