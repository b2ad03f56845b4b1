"""``cryobox top``: the workspace's sandboxes, the agents' capacity and counters and the herd counters, redrawn every
``--interval`` seconds (rich.Live) with per-interval rates; ``--once`` draws one frame, ``--json`` prints one object."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..errors import CryoboxError
from ._common import ApiKey, ApiUrl, Json, err, fail, out, print_json

if TYPE_CHECKING:  # httpx, the models and prometheus' parser load when top runs
    import httpx

    from .top_model import Frame, Scrape


class TopSource:
    """Reads one frame's inputs from the API (``/v1/sandboxes``, ``/v1/agents``, ``/metrics``)."""

    def __init__(self, http: httpx.Client, clock: Callable[[], float] = time.time) -> None:
        self.http, self.clock = http, clock
        self.previous: Scrape | None = None

    def _get(self, path: str) -> httpx.Response:
        from ..sdk._transport import raise_for_error

        response = self.http.get(path)
        raise_for_error(response)
        return response

    def frame(self) -> Frame:
        from .. import models
        from .top_model import Frame, Scrape, parse_agent_counters, parse_counters, rates, with_counters

        sandboxes = models.SandboxList.model_validate(self._get("/v1/sandboxes").json()).items
        agents: list[dict[str, Any]] = self._get("/v1/agents").json().get("agents", [])
        text = self._get("/metrics").text
        counters = parse_counters(text)
        now = self.clock()
        scrape = Scrape(now, counters, parse_agent_counters(text))
        agents = with_counters(agents, self.previous, scrape)
        frame = Frame(now, sandboxes, agents, counters, rates(self.previous, scrape))
        self.previous = scrape
        return frame


def top(
    interval: Annotated[float, typer.Option(min=0.1, help="seconds between refreshes")] = 2.0,
    once: Annotated[bool, typer.Option("--once", help="print one frame and exit")] = False,
    as_json: Json = False,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
) -> None:
    """Live table of the workspace's sandboxes, the agents' capacity and the herd counters (page faults, chunk
    fetches, cache hits, store GETs, creates and their latency) with per-interval rates. Ctrl-C exits."""
    import httpx
    from rich.live import Live

    from ..sdk._transport import ClientConfig
    from .top_model import render

    config = ClientConfig.resolve(api_url, api_key, timeout_s=30.0)
    try:
        with config.client() as http:
            source = TopSource(http)
            if as_json:
                print_json(source.frame().to_json())
                return
            if once:
                out.print(render(source.frame()))
                return
            with Live(render(source.frame()), console=out, auto_refresh=False, screen=False) as live:
                while True:
                    time.sleep(interval)
                    live.update(render(source.frame()), refresh=True)
    except KeyboardInterrupt:
        return
    except CryoboxError as error:
        fail(error)
    except httpx.HTTPError as error:
        err.print(f"[red]error[/red]: {error}")
        raise typer.Exit(2) from error
