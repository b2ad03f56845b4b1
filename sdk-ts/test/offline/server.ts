/** A scripted HTTP server on loopback for the offline tests: each request is answered by the next handler. */
import { type IncomingMessage, type Server, type ServerResponse, createServer } from "node:http";
import type { AddressInfo } from "node:net";

export type Handler = (req: IncomingMessage, res: ServerResponse, body: string) => void | Promise<void>;

export interface Seen {
  method: string;
  url: string;
  headers: IncomingMessage["headers"];
  body: string;
}

export class ScriptedServer {
  readonly seen: Seen[] = [];
  /** Requests whose connection closed before the handler ended its response. */
  readonly closedEarly: string[] = [];
  private handlers: Handler[] = [];
  private server: Server;
  url = "";

  constructor() {
    this.server = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on("data", (chunk: Buffer) => chunks.push(chunk));
      req.on("end", () => {
        const body = Buffer.concat(chunks).toString("utf8");
        this.seen.push({ method: req.method ?? "", url: req.url ?? "", headers: req.headers, body });
        res.on("close", () => {
          if (!res.writableEnded) this.closedEarly.push(req.url ?? "");
        });
        const handler = this.handlers.shift();
        if (handler === undefined) {
          res.writeHead(500, { "Content-Type": "application/json" }).end('{"error": "no handler left"}');
          return;
        }
        void handler(req, res, body);
      });
    });
  }

  /** Answer the next requests with these handlers, in order. */
  answer(...handlers: Handler[]): this {
    this.handlers.push(...handlers);
    return this;
  }

  async start(): Promise<this> {
    await new Promise<void>((resolve) => this.server.listen(0, "127.0.0.1", resolve));
    this.url = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
    return this;
  }

  async stop(): Promise<void> {
    this.server.closeAllConnections();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}

export function json(status: number, body: unknown, headers: Record<string, string> = {}): Handler {
  return (_req, res) => {
    res.writeHead(status, { "Content-Type": "application/json", ...headers }).end(JSON.stringify(body));
  };
}

/** An event stream written in the given raw pieces (with a pause between them, so they arrive apart). */
export function pieces(parts: string[], { end = true, pauseMs = 5 } = {}): Handler {
  return async (_req, res) => {
    res.writeHead(200, { "Content-Type": "text/event-stream" });
    res.flushHeaders();
    for (const part of parts) {
      res.write(part);
      await new Promise((resolve) => setTimeout(resolve, pauseMs));
    }
    if (end) res.end();
  };
}

/** A response that never ends (the client must cancel it). */
export function hang(): Handler {
  return (_req, res) => {
    res.writeHead(200, { "Content-Type": "text/event-stream" });
    res.write(": keepalive\n\n");
  };
}
