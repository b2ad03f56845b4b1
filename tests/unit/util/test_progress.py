"""The progress interface (cryobox.util.progress): the plain renderer's lines (throttled by an injected clock),
terminal detection, adapting a plain callable, and that ``--json`` commands keep stdout pure JSON (progress on
stderr) while the same commands without ``--json`` still report their phase."""

from __future__ import annotations

import io
import json
from typing import Any

import httpx
import pytest
from rich.console import Console
from typer.testing import CliRunner, Result

from cryobox.cli.main import app
from cryobox.sdk import ClientConfig
from cryobox.util.progress import (
    NullReporter,
    PlainReporter,
    Reporter,
    RichReporter,
    RoutedReporter,
    as_reporter,
    open_reporter,
    wants_bars,
)
from tests.support.clock import FakeClock
from tests.support.sdk import SNAP

ENV = {"CRYOBOX_API_URL": "http://test", "CRYOBOX_API_KEY": "cli-key", "COLUMNS": "200"}


def test_plain_reporter_lines_are_throttled_and_the_end_says_how_long() -> None:
    lines: list[str] = []
    clock = FakeClock(100.0)
    reporter = PlainReporter(lines.append, clock, every_s=2.0)
    reporter("a free line")
    with reporter.phase("bake base", 4) as phase:
        phase.advance()  # at once: not due
        clock.now += 2.5
        phase.advance()  # due: printed
        phase.update("warm-up")  # 0 s since the last line: not due
        clock.now += 3.0
        phase.update("snapshotting")
        phase.advance(2)
    assert lines == [
        "a free line",
        "bake base ... (0/4)",
        "bake base: 2/4",
        "bake base: snapshotting",
        "bake base: done in 5.5s (4/4)",
    ]


def test_a_phase_without_total_and_finishing_twice() -> None:
    lines: list[str] = []
    reporter = PlainReporter(lines.append, FakeClock(100.0))
    phase = reporter.phase("publishing snp_1")
    phase.finish()
    phase.finish()
    phase.advance()  # after the end: nothing
    assert lines == ["publishing snp_1 ...", "publishing snp_1: done in 0.0s"]


def test_as_reporter_keeps_a_reporter_and_wraps_a_callable() -> None:
    plain = PlainReporter(print)
    assert as_reporter(plain) is plain
    lines: list[str] = []
    wrapped = as_reporter(lines.append)
    assert isinstance(wrapped, Reporter) and not isinstance(lines.append, Reporter)
    wrapped.phase("images base", 3).finish()
    assert lines[0] == "images base ... (0/3)" and lines[1].startswith("images base: done in ")


def test_routed_reporter_sends_lines_one_way_and_phases_the_other() -> None:
    phases: list[str] = []
    free: list[str] = []
    routed = RoutedReporter(PlainReporter(phases.append), free.append)
    routed("debootstrap: unpacking")
    routed.phase("templates", 2).finish()
    assert free == ["debootstrap: unpacking"]
    assert phases[0] == "templates ... (0/2)"


def _console(terminal: bool) -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, force_terminal=terminal, width=120), buffer


def test_bars_only_on_a_terminal_and_never_for_json() -> None:
    terminal, _ = _console(True)
    pipe, _ = _console(False)
    assert wants_bars(terminal) and not wants_bars(terminal, as_json=True) and not wants_bars(pipe)
    with open_reporter(terminal) as reporter:
        assert isinstance(reporter, RichReporter)
    with open_reporter(terminal, as_json=True) as reporter:
        assert isinstance(reporter, PlainReporter)


def test_open_reporter_on_a_pipe_prints_plain_unwrapped_lines() -> None:
    console, buffer = _console(False)
    long = "publishing template base (g1) to file:///" + "x" * 200
    with open_reporter(console) as reporter:
        reporter(long)
        reporter.phase("bake [base]", 1).finish()  # brackets are text, not markup
    lines = buffer.getvalue().splitlines()
    assert lines[0] == long
    assert lines[1] == "bake [base] ... (0/1)" and lines[2].startswith("bake [base]: done in ")
    assert "\x1b" not in buffer.getvalue()


def test_rich_reporter_draws_a_bar_and_prints_lines_above_it() -> None:
    console, buffer = _console(True)
    with open_reporter(console) as reporter, reporter.phase("bake base", 3) as phase:
        reporter("cold boot")
        phase.advance(2)
        phase.update("warm-up [x]")
    text = buffer.getvalue()
    assert "cold boot" in text and "bake base: done in" in text
    assert "\x1b" in text  # drawn, not plain


def test_a_phase_left_by_an_exception_says_it_failed() -> None:
    lines: list[str] = []
    clock = FakeClock(100.0)
    with pytest.raises(RuntimeError), PlainReporter(lines.append, clock).phase("importing snp_1"):
        clock.now += 1.5
        raise RuntimeError("not published")
    assert lines[-1] == "importing snp_1: failed after 1.5s"


def test_null_reporter_says_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    reporter = NullReporter()
    reporter("x")
    with reporter.phase("y", 2) as phase:
        phase.advance()
    assert capsys.readouterr() == ("", "")


# --- --json keeps stdout pure JSON ----------------------------------------------------------------------------


@pytest.fixture
def routes(monkeypatch: pytest.MonkeyPatch) -> dict[tuple[str, str], Any]:
    table: dict[tuple[str, str], Any] = {}

    def answer(request: httpx.Request) -> httpx.Response:
        body = table.get((request.method, request.url.path))
        if body is None:
            return httpx.Response(404, json={"error": "no route", "code": "not_found"})
        return httpx.Response(200, json=body)

    original = ClientConfig.client_options

    def client_options(self: ClientConfig) -> dict[str, Any]:
        return {**original(self), "transport": httpx.MockTransport(answer)}

    monkeypatch.setattr(ClientConfig, "client_options", client_options)
    return table


def run(*args: str) -> Result:
    return CliRunner().invoke(app, list(args), env=ENV)


PUBLISHED = {"id": "snp_0001", "store": "file:///store", "key": "snapshots/snp_0001"}


def test_snapshot_publish_json_stdout_is_only_json(routes: dict[tuple[str, str], Any]) -> None:
    routes[("POST", "/v1/snapshots/snp_0001/publish")] = PUBLISHED
    result = run("snapshot", "publish", "snp_0001", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == PUBLISHED
    assert "publishing snp_0001 ..." in result.stderr and "publishing snp_0001: done in" in result.stderr


def test_snapshot_import_reports_its_phase_on_stderr(routes: dict[tuple[str, str], Any]) -> None:
    routes[("POST", "/v1/snapshots/import")] = {**SNAP, "sandbox_id": None}  # imported: its sandbox ran elsewhere
    result = run("snapshot", "import", "snp_0001")
    assert result.exit_code == 0, result.stderr
    assert "snp_0001" in result.stdout and "importing" not in result.stdout
    assert "importing snp_0001: done in" in result.stderr


TEMPLATE = {"name": "tpl-x", "cpu": 1, "memory_mb": 512, "generation": "g1", "created_at": "2024-05-01T12:00:00Z"}


def test_template_create_json_follows_the_build_to_the_end(
    routes: dict[tuple[str, str], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    polls = iter(
        [
            {**TEMPLATE, "status": "building", "progress": "bake tpl-x: 1/3"},
            {**TEMPLATE, "status": "ready"},
        ]
    )
    monkeypatch.setattr("cryobox.cli.template_cmds.POLL_S", 0.0)
    routes[("POST", "/v1/templates")] = {**TEMPLATE, "status": "building", "progress": "queued"}

    def poll(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=next(polls))

    table = routes

    def answer(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            return poll(request)
        return httpx.Response(202, json=table[("POST", "/v1/templates")])

    original = ClientConfig.client_options
    monkeypatch.setattr(
        ClientConfig, "client_options", lambda self: {**original(self), "transport": httpx.MockTransport(answer)}
    )
    result = run("template", "create", "tpl-x", "--warmup", "true", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["status"] == "ready"
    assert "bake tpl-x: 1/3" in result.stderr and "template tpl-x: done in" in result.stderr


def test_template_create_that_fails_exits_1(
    routes: dict[tuple[str, str], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    routes[("POST", "/v1/templates")] = {**TEMPLATE, "status": "building"}
    routes[("GET", "/v1/templates/tpl-x")] = {**TEMPLATE, "status": "error", "error": "warm-up command failed (9)"}
    result = run("template", "create", "tpl-x")
    assert result.exit_code == 1
    assert "warm-up command failed (9)" in result.stderr
