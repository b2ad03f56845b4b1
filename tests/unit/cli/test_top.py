"""``cryobox top``: counters parsed from a real text exposition (the control plane's and the memory server's
collectors, rendered by prometheus_client), per-interval rates with an injected clock, the frame's tables and
JSON, and the command's ``--once`` / ``--json`` output over a mocked API."""

from __future__ import annotations

import io
import json
from typing import Any

import httpx
import pytest
from rich.console import Console
from typer.testing import CliRunner

from cryobox import models
from cryobox.agent.memory.server.metrics import MemoryMetrics
from cryobox.agentapi.models_obs import AgentCounters
from cryobox.cli.main import app
from cryobox.cli.top_cmd import TopSource
from cryobox.cli.top_model import (
    Frame,
    Scrape,
    duration,
    parse_agent_counters,
    parse_counters,
    rates,
    render,
    with_counters,
)
from cryobox.sdk import ClientConfig
from cryobox.server.control.counters import AgentReading, FleetCounters
from cryobox.server.control.counters import exposition as counters_exposition
from cryobox.server.metrics import Metrics
from tests.support.sdk import INFO

ENV = {"CRYOBOX_API_URL": "http://test", "CRYOBOX_API_KEY": "cli-key", "COLUMNS": "200"}
AGENT = {
    "name": "host-a",
    "url": "http://127.0.0.1:9",
    "status": "up",
    "heartbeat_at": 1.0,
    "registered_at": 0.0,
    "capacity": {
        "sandboxes": 1,
        "max_sandboxes": 256,
        "vcpus_committed": 1,
        "vcpus_total": 2,
        "memory_committed_mib": 512,
        "memory_total_mib": 4096,
        "prespawned": 2,
    },
}


def exposition(faults: int, fetches: int, hits: int, gets: int, creates: list[float], *, answered: bool = True) -> str:
    """What ``cryobox serve``'s ``/metrics`` sends: the control plane's registry, its in-process agent's memory
    server's series, then the counters the control plane gathered from its live agent ``host-a`` (the same memory
    server's: they must be counted once)."""
    control, memory = Metrics(), MemoryMetrics()
    for seconds in creates:
        control.observe_create("ok", "restore", seconds)
    control.observe_create("refused", "restore")  # counted, no duration
    memory.faults.inc(faults)
    memory.chunk_fetches.inc(fetches)
    memory.cache_hits.inc(hits)
    memory.store_gets.inc(gets)
    herd = AgentCounters(faults=faults, chunk_fetches=fetches, cache_hits=hits, store_gets=gets)
    reading = AgentReading("host-a", "ok" if answered else "timeout", herd)
    gathered = counters_exposition(FleetCounters(0.0, (reading,)))
    return control.render()[0].decode() + memory.render()[0].decode() + gathered


def test_counters_are_read_from_the_real_exposition() -> None:
    counters = parse_counters(exposition(120, 30, 90, 33, [0.2, 0.4]))
    assert counters == {
        "faults": 120.0,
        "chunk_fetches": 30.0,
        "cache_hits": 90.0,
        "store_gets": 33.0,
        "creates": 3.0,  # every outcome and boot mode summed
        "create_seconds_sum": pytest.approx(0.6),
        "create_seconds_count": 2.0,
    }


def test_each_agents_counters_beside_its_capacity_with_their_rates() -> None:
    other = {**AGENT, "name": "host-b", "status": "down"}  # not live: the control plane gathered nothing of it
    before = Scrape(10.0, {}, parse_agent_counters(exposition(100, 10, 50, 12, [])))
    after = Scrape(12.0, {}, parse_agent_counters(exposition(160, 14, 90, 16, [], answered=False)))
    assert after.agents == {
        "host-a": {"up": False, "faults": 160.0, "chunk_fetches": 14.0, "cache_hits": 90.0, "store_gets": 16.0}
    }
    first, second = with_counters([AGENT, other], None, before), with_counters([AGENT, other], before, after)
    assert first[0]["counters"]["faults"] == 100.0 and first[0]["counters_up"] is True
    assert first[0]["counter_rates"]["faults"] is None and first[1]["counters"] is None
    assert second[0]["counter_rates"] == {"faults": 30.0, "chunk_fetches": 2.0, "cache_hits": 20.0, "store_gets": 2.0}
    assert second[0]["counters_up"] is False and second[0]["capacity"] == AGENT["capacity"]
    buffer = io.StringIO()
    counters = parse_counters(exposition(160, 14, 90, 16, []))
    Console(file=buffer, width=220, force_terminal=False).print(render(Frame(12.0, [], second, counters, {})))
    row_a = next(line for line in buffer.getvalue().splitlines() if "host-a" in line)
    row_b = next(line for line in buffer.getvalue().splitlines() if "host-b" in line)
    assert "160 (30/s)" in row_a and "14 (2/s)" in row_a and "(no answer)" in row_a
    assert row_b.count(" - ") >= 3  # no counters for an agent that is not live


def test_counters_absent_from_the_text_are_zero() -> None:
    assert set(parse_counters("# nothing here\n").values()) == {0.0}


def test_rates_per_second_and_the_interval_create_latency() -> None:
    before = Scrape(10.0, parse_counters(exposition(100, 10, 50, 12, [0.2])))
    after = Scrape(12.0, parse_counters(exposition(160, 14, 90, 16, [0.2, 0.5, 0.3])))
    got = rates(before, after)
    assert got["faults"] == 30.0 and got["chunk_fetches"] == 2.0 and got["cache_hits"] == 20.0
    assert got["store_gets"] == 2.0 and got["creates"] == 1.0
    assert got["create_latency_ms"] == pytest.approx(400.0)  # (0.5 + 0.3) / 2 creates in between


def test_first_frame_has_no_rates_and_a_restart_counts_from_zero() -> None:
    only = Scrape(5.0, {"faults": 7.0})
    assert set(rates(None, only).values()) == {None}
    restarted = rates(Scrape(0.0, {"faults": 500.0}), Scrape(2.0, {"faults": 8.0}))
    assert restarted["faults"] == 4.0 and restarted["create_latency_ms"] is None


def test_duration_units() -> None:
    assert [duration(x) for x in (None, 5, 185, 7800, 4 * 86400 + 3 * 3600)] == ["-", "5s", "3m05s", "2h10m", "4d03h"]


def _frame(now: float = 1714564800.0 + 90) -> Frame:  # 2024-05-01T12:01:30Z
    sandbox = models.Sandbox.model_validate(INFO)  # created 12:00:00, expires 13:00:00
    counters = parse_counters(exposition(1, 2, 3, 4, []))
    return Frame(now, [sandbox], [AGENT], counters, {"faults": 2.5, "create_latency_ms": None})


def test_frame_json_ages_and_ttl_from_the_injected_time() -> None:
    data = json.loads(json.dumps(_frame().to_json()))
    (row,) = data["sandboxes"]
    assert row == {
        "id": "sbx_0123",
        "template": "code-interpreter",
        "state": "running",
        "host": "local",
        "age_s": 90.0,
        "ttl_left_s": 3510.0,
        "vcpus": 1,
        "memory_mb": 512,
    }
    assert data["counters"]["store_gets"] == 4.0 and data["agents"][0]["name"] == "host-a"


def test_frame_renders_sandboxes_agents_and_counters() -> None:
    buffer = io.StringIO()
    Console(file=buffer, width=160, force_terminal=False).print(render(_frame()))
    text = buffer.getvalue()
    for expected in ("sbx_0123", "code-interpreter", "running", "1m30s", "58m30s", "512 MB"):
        assert expected in text
    assert "host-a" in text and "1/256" in text and "512/4096" in text
    assert "2.5/s" in text  # the faults rate
    faults_row = next(line for line in text.splitlines() if line.strip("│ ").startswith("faults"))  # the herd's
    assert "1" in faults_row


class Api:
    def __init__(self, faults: list[int]) -> None:
        self.faults = faults
        self.paths: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.path)
        if request.url.path == "/v1/sandboxes":
            return httpx.Response(200, json={"items": [INFO]})
        if request.url.path == "/v1/agents":
            return httpx.Response(200, json={"agents": [AGENT]})
        if request.url.path == "/metrics":
            return httpx.Response(200, text=exposition(self.faults.pop(0), 0, 0, 0, []))
        return httpx.Response(404, json={"error": "no", "code": "not_found"})


def test_source_rates_between_two_frames_with_an_injected_clock() -> None:
    times = iter([100.0, 104.0])
    with httpx.Client(base_url="http://test", transport=httpx.MockTransport(Api([10, 30]))) as http:
        source = TopSource(http, clock=lambda: next(times))
        first, second = source.frame(), source.frame()
    assert first.rates["faults"] is None and second.rates["faults"] == 5.0


@pytest.fixture
def fake_api(monkeypatch: pytest.MonkeyPatch) -> Api:
    api = Api([42, 42])
    original = ClientConfig.client_options

    def client_options(self: ClientConfig) -> dict[str, Any]:
        return {**original(self), "transport": httpx.MockTransport(api)}

    monkeypatch.setattr(ClientConfig, "client_options", client_options)
    return api


def test_top_json_is_one_parseable_object(fake_api: Api) -> None:
    result = CliRunner().invoke(app, ["top", "--json"], env=ENV)
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["sandboxes"][0]["id"] == "sbx_0123" and data["counters"]["faults"] == 42.0
    assert fake_api.paths == ["/v1/sandboxes", "/v1/agents", "/metrics"]


def test_top_once_prints_one_frame(fake_api: Api) -> None:
    result = CliRunner().invoke(app, ["top", "--once"], env=ENV)
    assert result.exit_code == 0, result.stderr
    assert "sbx_0123" in result.stdout and "running" in result.stdout and "herd" in result.stdout
    assert len(fake_api.paths) == 3


def test_top_exits_0_on_ctrl_c(fake_api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(_: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("cryobox.cli.top_cmd.time.sleep", interrupted)
    result = CliRunner().invoke(app, ["top", "--interval", "0.5"], env=ENV)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert "sbx_0123" in result.stdout
