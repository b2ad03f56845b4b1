/**
 * The workspace's templates and their builds: from a Dockerfile (with an optional build context, a gzip'd tar)
 * or an OCI image; `Build.logs()` streams the build log live (resuming after a dropped stream), `Build.wait()`
 * follows it to the end.
 */
import { HostUnavailable, TemplateBuildFailed } from "./errors.js";
import { type CallOptions } from "./http.js";
import { ApiClient } from "./clients.js";
import { messages, streamError } from "./sse.js";
import type { BuildLogLine, TemplateBuildInfo, TemplateInfo } from "./types.js";

const BUILD_PATH = "/v1/templates/build";
const RESUMES = 5;
const LOG_TAIL = 50;

export interface BuildSizes {
  cpu?: number;
  memoryMb?: number;
}

export interface DockerfileBuildOptions extends CallOptions, BuildSizes {
  /** The Dockerfile's text. */
  dockerfile: string;
  /** The build context as a gzip'd tar (e.g. `tar czf - -C dir .`); none: no `COPY` from a context. */
  context?: Uint8Array | Blob;
  buildArgs?: Record<string, string>;
  noCache?: boolean;
}

function sizes(options: BuildSizes): Record<string, number> {
  return {
    ...(options.cpu !== undefined ? { cpu: options.cpu } : {}),
    ...(options.memoryMb !== undefined ? { memory_mb: options.memoryMb } : {}),
  };
}

function buildPath(name: string, buildId: string, suffix = ""): string {
  return `/v1/templates/${encodeURIComponent(name)}/builds/${encodeURIComponent(buildId)}${suffix}`;
}

function failure(build: TemplateBuildInfo, tail: string[]): TemplateBuildFailed {
  const step = build.failed_step;
  let where = "";
  if (step) where = ` at step ${step.step}` + (step.line ? ` (line ${step.line}: ${step.instruction ?? ""})` : "");
  const error = new TemplateBuildFailed(
    `template ${JSON.stringify(build.name)} build ${build.id} failed${where}: ${build.error || "no error reported"}`,
    {
      details: {
        build_id: build.id,
        template: build.name,
        step: step?.step ?? null,
        line: step?.line ?? null,
        instruction: step?.instruction ?? null,
      },
    },
  );
  error.logTail = [...tail];
  return error;
}

/** One template build. `info` is the build as last seen (`refresh()` reads it again). */
export class Build {
  /** The last log lines seen (for the error of a failed build). */
  readonly tail: string[] = [];

  constructor(
    private readonly templates: Templates,
    public info: TemplateBuildInfo,
  ) {}

  get id(): string {
    return this.info.id;
  }

  get name(): string {
    return this.info.name;
  }

  async refresh(options: CallOptions = {}): Promise<TemplateBuildInfo> {
    const path = buildPath(this.name, this.id);
    this.info = await this.templates.http.json<TemplateBuildInfo>({ method: "GET", path, ...options });
    return this.info;
  }

  /** The build's log lines from `offset`, live, until the build ends (`info` is then the final build; a failed
   * build ends the iteration too: `wait()` raises). */
  async *logs(options: CallOptions & { offset?: number } = {}): AsyncGenerator<BuildLogLine, void, undefined> {
    let { offset = 0 } = options;
    const { signal } = options;
    for (let attempt = 0; attempt <= RESUMES; attempt++) {
      try {
        const { body, done } = await this.templates.http.stream({
          method: "GET", path: buildPath(this.name, this.id, "/logs/stream"), query: { offset }, signal,
        });
        for await (const message of messages(body, done)) {
          if (!["log", "done", "error"].includes(message.event)) continue;
          const data = JSON.parse(message.data) as Record<string, unknown>;
          if (message.event === "log") {
            const line = data as unknown as BuildLogLine;
            offset = line.offset + 1;
            this.tail.push(line.message);
            if (this.tail.length > LOG_TAIL) this.tail.shift();
            yield line;
          } else if (message.event === "done") {
            this.info = data as unknown as TemplateBuildInfo;
            return;
          } else if (data["build"] !== null && typeof data["build"] === "object") {
            this.info = data["build"] as TemplateBuildInfo;
            return;
          } else {
            throw streamError(data, "the build log stream failed");
          }
        }
      } catch (error) {
        if (!(error instanceof HostUnavailable)) throw error; // the server went away: reconnect from where we were
      }
      // the stream ended without its last event (a proxy cut it, a replica stopped): resume
    }
    throw new HostUnavailable(`the log stream of build ${this.id} kept ending before the build did`);
  }

  /** Follow the build to its end; returns it when `done`.
   * @throws {TemplateBuildFailed} it failed (`details.step`, `details.line`, `details.instruction`, `logTail`). */
  async wait(options: CallOptions & { onLog?: (line: BuildLogLine) => unknown } = {}): Promise<TemplateBuildInfo> {
    const { onLog, ...call } = options;
    if (this.info.status !== "done" && this.info.status !== "failed") {
      for await (const line of this.logs(call)) onLog?.(line);
    }
    if (this.info.status !== "failed") await this.refresh(call);
    if (this.info.status === "failed") throw failure(this.info, this.tail);
    return this.info;
  }
}

/** The workspace's templates and template builds. */
export class Templates extends ApiClient {
  async list(options: CallOptions = {}): Promise<TemplateInfo[]> {
    return (await this.http.json<{ items: TemplateInfo[] }>({ method: "GET", path: "/v1/templates", ...options })).items;
  }

  async get(name: string, options: CallOptions = {}): Promise<TemplateInfo> {
    return this.http.json<TemplateInfo>({ method: "GET", path: `/v1/templates/${encodeURIComponent(name)}`, ...options });
  }

  /** Delete a custom template. */
  async delete(name: string, options: CallOptions = {}): Promise<void> {
    await this.http.empty({ method: "DELETE", path: `/v1/templates/${encodeURIComponent(name)}`, ...options });
  }

  /** Start building template `name` from a Dockerfile (and a context). @throws {InvalidArgument} the Dockerfile
   * (the message names the line) or a field. @throws {PayloadTooLarge} the context is over the server's limit. */
  async buildFromDockerfile(name: string, options: DockerfileBuildOptions): Promise<Build> {
    const { dockerfile, context, buildArgs, noCache = false, cpu, memoryMb, ...call } = options;
    const fields: Record<string, unknown> = { name, dockerfile, no_cache: noCache, ...sizes({ cpu, memoryMb }) };
    if (buildArgs && Object.keys(buildArgs).length) fields["build_args"] = buildArgs;
    let info: TemplateBuildInfo;
    if (context === undefined) {
      info = await this.http.json<TemplateBuildInfo>({ method: "POST", path: BUILD_PATH, json: fields, ...call });
    } else {
      const form = new FormData();
      for (const [key, value] of Object.entries(fields)) {
        form.set(key, typeof value === "object" ? JSON.stringify(value) : String(value));
      }
      const blob = context instanceof Blob ? context : new Blob([context], { type: "application/gzip" });
      form.set("context", blob, "context.tar.gz");
      info = await this.http.json<TemplateBuildInfo>({ method: "POST", path: BUILD_PATH, body: form, ...call });
    }
    return new Build(this, info);
  }

  /** Start building template `name` from the OCI image `image` (`[registry/]name[:tag][@digest]`). */
  async buildFromImage(name: string, image: string, options: CallOptions & BuildSizes = {}): Promise<Build> {
    const { cpu, memoryMb, ...call } = options;
    const json = { name, image, ...sizes({ cpu, memoryMb }) };
    return new Build(this, await this.http.json<TemplateBuildInfo>({ method: "POST", path: BUILD_PATH, json, ...call }));
  }

  /** @throws {NotFound} no such build of `name` in this workspace. */
  async getBuild(name: string, buildId: string, options: CallOptions = {}): Promise<Build> {
    return new Build(this, await this.http.json<TemplateBuildInfo>({ method: "GET", path: buildPath(name, buildId), ...options }));
  }
}
