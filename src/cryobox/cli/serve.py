"""``cryobox serve``: host agent + control plane in one process (embedded defaults)."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from pathlib import Path
from types import FrameType

import uvicorn
from rich.console import Console

from ..agent.factory import PoolMode
from ..agent.platform import HostConfig, start_host
from ..config import Paths
from ..server.app import create_app
from ..server.auth import load_or_create_key


def serve(
    data_dir: Path | None,
    cache_dir: Path | None,
    host: str,
    port: int,
    prespawn: int,
    pool_mode: PoolMode,
    console: Console,
) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    paths = Paths.from_env(data_dir, cache_dir)
    config = HostConfig(paths=paths, prespawn=prespawn, pool_mode=pool_mode)

    async def main() -> None:
        console.print(
            f"[bold]cryobox[/bold] data dir {paths.data_dir}, cache {paths.cache_dir}, accelerator {config.accel.value}"
        )
        with console.status("preparing images and templates") as status:

            def progress(line: str) -> None:
                if line.startswith("debootstrap: "):
                    status.update(f"[dim]{line[:100]}")
                else:
                    console.print(line)
                    status.update(line[:100])

            service = await start_host(config, progress)
        key, generated = load_or_create_key(paths.data_dir)
        app = create_app(service, api_key=key, accel=config.accel, host=socket.gethostname())
        console.print(f"templates ready: {', '.join(service.templates)}")
        if generated:
            console.print(f"generated API key (saved in {paths.data_dir / 'api_key'}): [bold]{key}[/bold]")
        else:
            console.print(f"API key: [bold]{key}[/bold]")
        console.print(f"export CRYOBOX_API_URL=http://{host}:{port} CRYOBOX_API_KEY={key}")
        server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="info", lifespan="on"))
        try:
            await server.serve()
        finally:
            await service.close()

    # uvicorn shuts down gracefully on SIGTERM/SIGINT (the lifespan kills every VM), then re-raises the signal
    # with the previous handler: make that handler a clean exit so a graceful stop exits 0.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _exit_cleanly)
    asyncio.run(main())


def _exit_cleanly(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)
