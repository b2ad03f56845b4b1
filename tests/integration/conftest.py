"""Fixtures for tests that boot and restore real QEMU microVMs (TCG on hosts without VT-x; never skipped).

Ladder: ``templates`` (built/baked once, cached across runs) -> ``server`` (a real ``cryobox serve`` process)
-> ``sandbox`` (one restored sandbox per test, killed in a finalizer even when the test fails).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from cryobox import Sandbox
from cryobox.agent.host.reclaim import find_own_qemus
from cryobox.agent.net.egress.resolver import UPSTREAM_ENV as DNS_UPSTREAM
from cryobox.agent.observe.sampler import INTERVAL_ENV as SAMPLE_INTERVAL
from cryobox.agent.templates.bake import Template
from cryobox.bench.server import ServeProcess
from cryobox.objstore.client import open_store
from cryobox.objstore.gc import GcPolicy, collect
from tests.support.archives import archive_names, archive_networks
from tests.support.e2b import sdk_python
from tests.support.host import cache_dir, host_paths, templates
from tests.support.internet import Internet, internet
from tests.support.netutil import OUTSIDE_RANGE
from tests.support.serve import Api, Client

__all__ = ["cache_dir", "host_paths", "templates"]  # the session fixtures, bound here (tests/support/host.py)
ALLOW_PRIVATE = "CRYOBOX_EGRESS_ALLOW_PRIVATE"

TIMEOUT_S = 600  # per test (setup, call and teardown), unless it has its own @pytest.mark.timeout
SERVE_LOG_AT = pytest.StashKey[int]()
SERVE_LOG_LINES = 80
NOTABLE = (" WARNING ", " ERROR ", " CRITICAL ")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/integration" in str(item.path):
            item.add_marker(pytest.mark.vm)
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(TIMEOUT_S))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A test of the shared server that fails carries the server's warnings and errors logged while it ran (the
    server's log is gone with its data dir at the end of the session): a flake in CI can be read afterwards."""
    outcome = yield
    proc = getattr(item, "funcargs", {}).get("server")
    if not isinstance(proc, ServeProcess) or not proc.log_path.exists():
        return
    if call.when == "setup":
        item.stash[SERVE_LOG_AT] = proc.log_path.stat().st_size
        return
    report = outcome.get_result()  # type: ignore[attr-defined]
    if call.when != "call" or not report.failed or SERVE_LOG_AT not in item.stash:
        return
    with open(proc.log_path, "rb") as log:
        log.seek(item.stash[SERVE_LOG_AT])
        lines = log.read().decode(errors="replace").splitlines()
    notable = [line for line in lines if any(mark in line for mark in NOTABLE) or line.startswith(("Traceback", " "))]
    report.sections.append(("serve.log: warnings and errors during the test", "\n".join(notable[-SERVE_LOG_LINES:])))


@pytest.fixture(scope="session")
def suite_internet() -> Iterator[Internet]:
    """The suite's stand-in internet (tests/support/internet.py): the shared server's guests resolve names in it
    (``CRYOBOX_DNS_UPSTREAM``) and reach its servers; it also answers for the package archives builds reach."""
    with internet(secrets.token_hex(3)) as net:
        for name, addresses in archive_names().items():
            net.add_name(name, ipv4=addresses)
        yield net


@pytest.fixture(scope="session")
def server(
    tmp_path_factory: pytest.TempPathFactory,
    cache_dir: Path,
    templates: dict[str, Template],
    suite_internet: Internet,
) -> Iterator[ServeProcess]:
    data_dir = tmp_path_factory.mktemp("serve")
    # the operator exempts the suite's stand-in for the internet (tests/support/netutil.py) from the deny list, and
    # the package archive Dockerfile builds' apt-get reaches (resolved now: tests/support/archives.py)
    allowed = ",".join([OUTSIDE_RANGE, *archive_networks()])
    # the suite's builds share the host's step caches: keep them small (the defaults are an operator's 20/50 GiB)
    budgets = {"CRYOBOX_BUILD_CACHE_BYTES": str(2 << 30), "CRYOBOX_BUILD_CACHE_STORE_BYTES": str(2 << 30)}
    # sandboxes are sampled every second (not every 5): the E2B test reads a history of several samples
    env = {ALLOW_PRIVATE: allowed, DNS_UPSTREAM: suite_internet.dns, SAMPLE_INTERVAL: "1", **budgets}
    proc = ServeProcess(data_dir, cache_dir=cache_dir, extra_env=env).start()
    try:
        yield proc
    finally:
        proc.stop()
        leaked = find_own_qemus(data_dir / "vol" / "run")
        proc.cleanup()
        # the suite's builds and snapshots publish into the host's shared store: collect what earlier runs left
        # there (the store GC's grace, an hour, keeps anything a run still going may need)
        collect(open_store(f"file://{cache_dir / 'store'}"), GcPolicy(step_budget=2 << 30))
        assert not leaked, f"cryobox serve left QEMU processes behind: {leaked}"


@pytest.fixture
def api(server: ServeProcess) -> Api:
    """Keyword arguments for SDK calls against the test server."""
    return Api(api_url=server.url, api_key=server.api_key)


@pytest.fixture
def sandbox(api: Api) -> Iterator[Sandbox]:
    sbx = Sandbox.create(template="base", **api)
    try:
        yield sbx
    finally:
        sbx.kill()


@pytest.fixture
def client(server: ServeProcess) -> Iterator[Client]:
    """A raw HTTP client for the test server; sandboxes it creates are deleted afterwards."""
    http = Client(server.url, server.api_key)
    try:
        yield http
    finally:
        http.close()


@pytest.fixture(scope="session")
def e2b_python(cache_dir: Path) -> Path:
    """The python of a virtualenv holding the pinned ``e2b`` SDK (made once; reused while the pin holds)."""
    return sdk_python(cache_dir)
