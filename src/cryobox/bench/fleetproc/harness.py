"""The whole fleet (:class:`Fleet`): PostgreSQL, moto, ``cryobox control`` and N ``cryobox agent``, each agent in
a network namespace of its own (:class:`.netns.AgentNetns`) or, with ``isolation="loopback"``, all on
``127.0.0.1:<free port>`` of the root namespace with distinct slot CIDRs.

Children that must not outlive the harness (moto, the relays) get ``PR_SET_PDEATHSIG``; note that it fires when the
*thread* that spawned them ends, so start a :class:`Fleet` from a thread that lives as long as it.
"""

from __future__ import annotations

import secrets
import sys
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import httpx

from ...config import DEFAULT_CACHE_DIR
from ...util.sealing import generate_key
from ..server import ServeProcess
from .addresses import check_name, slot_cidrs
from .moto import S3_CREDENTIALS, MotoProcess
from .netns import AgentNetns, reap_stale_netns
from .postgres import PostgresProcess
from .procs import AgentProcess, ControlProcess
from .system import ipv4_in_use


class Fleet:
    """PostgreSQL + moto + ``cryobox control`` + ``agents`` agents (``a0``, ``a1``, ...), torn down whatever happens.

    With ``template_source="store"`` the bucket starts empty, so a preparatory ``cryobox serve --template-source
    build`` on the same store first publishes ``templates`` (it bakes them from the shared cache dir, once), and
    each agent gets a cache dir of its own sharing only the images (see :meth:`_agent_cache`).
    """

    def __init__(
        self,
        root: Path,
        *,
        agents: int | Sequence[str] = 3,
        cache_dir: Path | None = None,
        isolation: Literal["netns", "loopback"] = "netns",
        template_source: Literal["build", "store"] = "store",
        memory: Literal["hot", "lazy"] | None = "lazy",
        templates: Sequence[str] = ("base",),
        prespawn: int = 0,
        net_pool: int = 2,
        memory_mib: int | None = None,
        max_sandboxes: int | None = None,
        heartbeat_interval_s: float | None = 1.0,
        agent_deadline_s: float = 10.0,
        publish: bool | None = None,
        agent_env: Mapping[str, str] | None = None,
        agent_args: Sequence[str] = (),
        control_env: Mapping[str, str] | None = None,
        control_args: Sequence[str] = (),
        start_timeout_s: float = 1800.0,
    ) -> None:
        self.root = root
        self.names = [f"a{i}" for i in range(agents)] if isinstance(agents, int) else [check_name(a) for a in agents]
        self.cache_dir = cache_dir
        self.isolation = isolation
        self.template_source = template_source
        self.memory = memory
        self.templates = tuple(templates)
        self.prespawn = prespawn
        self.net_pool = net_pool
        self.memory_mib = memory_mib
        self.max_sandboxes = max_sandboxes
        self.heartbeat_interval_s = heartbeat_interval_s
        self.agent_deadline_s = agent_deadline_s
        self.publish = template_source == "store" if publish is None else publish
        self.agent_env = dict(agent_env or {})
        self.agent_args = list(agent_args)
        self.control_env = dict(control_env or {})
        self.control_args = list(control_args)
        self.start_timeout_s = start_timeout_s
        self.api_key = "cbx_fleet_" + secrets.token_hex(8)
        self.node_token = "node_" + secrets.token_hex(16)
        self.secret_key = generate_key()
        """The control plane's ``CRYOBOX_SECRET_KEY`` (every replica on the fleet's PostgreSQL needs the same)."""
        self.postgres: PostgresProcess | None = None
        self.moto: MotoProcess | None = None
        self.bucket = ""
        self.store_url = ""
        self.control: ControlProcess | None = None
        self.agents: dict[str, AgentProcess] = {}
        self.namespaces: dict[str, AgentNetns] = {}

    @property
    def url(self) -> str:
        if self.control is None:
            raise RuntimeError("fleet not started")
        return self.control.url

    def env(self) -> dict[str, str]:
        return {"CRYOBOX_API_URL": self.url, "CRYOBOX_API_KEY": self.api_key}

    def agent(self, name: str) -> AgentProcess:
        return self.agents[name]

    def start(self) -> Fleet:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def _start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        reap_stale_netns()
        self.postgres = PostgresProcess().start()
        self.moto = MotoProcess(log_path=self.root / "moto.log").start()
        self.bucket = self.moto.create_bucket()
        self.store_url = self.moto.store_url(self.bucket)
        if self.publish:
            self._publish_templates()
        self.control = ControlProcess(
            self.root / "control",
            database_url=self.postgres.url,
            node_token=self.node_token,
            api_key=self.api_key,
            secret_key=self.secret_key,
            store_url=self.store_url,
            cache_dir=self.cache_dir,
            agent_deadline_s=self.agent_deadline_s,
            extra_env=self.control_env,
            extra_args=self.control_args,
        ).start()
        taken = ipv4_in_use() if self.isolation == "loopback" else []
        cidrs = slot_cidrs(len(self.names), taken)
        for name, cidr in zip(self.names, cidrs, strict=True):
            netns = None
            cache_dir = self._agent_cache(name) if self.template_source == "store" else self.cache_dir
            if self.isolation == "netns":
                netns = self.namespaces[name] = AgentNetns(name).create()
            agent = self.agents[name] = AgentProcess(
                name,
                self.root / name,
                control_url=self.control.url,
                node_token=self.node_token,
                store_url=self.store_url,
                cache_dir=cache_dir,
                net_cidr=cidr,
                template_source=self.template_source,
                templates=self.templates,
                prespawn=self.prespawn,
                net_pool=self.net_pool,
                memory_mib=self.memory_mib,
                max_sandboxes=self.max_sandboxes,
                memory=self.memory,
                heartbeat_interval_s=self.heartbeat_interval_s,
                netns=netns,
                api_key=self.api_key,
                extra_env=self.agent_env,
                extra_args=self.agent_args,
            )
            agent.launch()
        for agent in self.agents.values():  # launched together, so they come up in parallel
            agent.wait_ready(self.start_timeout_s)

    def _agent_cache(self, name: str) -> Path:
        """A store-fed agent's cache dir: ``images/`` is the shared cache's (content-addressed, immutable), but
        ``templates/`` is its own, so the agent really fetches its template from the store instead of finding the
        shared cache's bake (the publishing ``cryobox serve`` baked that very generation there, and
        ``fetch_template`` serves a local bake of the published generation as is)."""
        shared = (self.cache_dir or DEFAULT_CACHE_DIR).resolve()
        own = self.root / name / "cache"
        own.mkdir(parents=True, exist_ok=True)
        images = own / "images"
        if not images.is_symlink():
            (shared / "images").mkdir(parents=True, exist_ok=True)
            images.symlink_to(shared / "images")
        return own

    def _publish_templates(self) -> None:
        args = ["--store", self.store_url, "--template-source", "build", "--templates", ",".join(self.templates)]
        args += ["--memory", "lazy", "--net-pool", "1"]
        serve = ServeProcess(
            self.root / "publish", cache_dir=self.cache_dir, prespawn=0, extra_env=S3_CREDENTIALS, extra_args=args
        )
        try:
            serve.start(self.start_timeout_s)  # publishing happens while it starts up
        finally:
            serve.stop()
            serve.cleanup()

    def agents_view(self) -> dict[str, dict[str, Any]]:
        if self.control is None:
            raise RuntimeError("fleet not started")
        return self.control.agents()

    def wait_agent_status(self, name: str, status: str | Collection[str], timeout_s: float = 60.0) -> str:
        """Poll ``GET /v1/agents`` until ``name``'s status is ``status`` (or one of them); returns it."""
        wanted = {status} if isinstance(status, str) else set(status)
        return self._wait_status(name, lambda s: s in wanted, f"in {sorted(wanted)}", timeout_s)

    def wait_agent_not_up(self, name: str, timeout_s: float = 60.0) -> str:
        """Poll until the control plane no longer lists ``name`` as ``up`` (``"missing"`` when it is not listed)."""
        return self._wait_status(name, lambda s: s != "up", "not up", timeout_s)

    def _wait_status(self, name: str, accept: Callable[[str], bool], what: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        seen = "?"
        while True:
            try:
                agent = self.agents_view().get(name)
                seen = "missing" if agent is None else str(agent.get("status"))
                if accept(seen):
                    return seen
            except httpx.HTTPError as err:
                seen = f"error: {err}"
            if time.monotonic() >= deadline:
                raise TimeoutError(f"agent {name} not {what} within {timeout_s}s (last seen: {seen})")
            time.sleep(0.25)

    def kill_agent(self, name: str) -> int | None:
        return self.agents[name].kill()

    def close(self) -> None:
        """Stop and release everything, in reverse order; every step runs even when an earlier one failed."""
        steps: list[Callable[[], object]] = []
        for agent in self.agents.values():
            steps += [agent.stop, agent.cleanup]
        steps += [ns.close for ns in self.namespaces.values()]
        if self.control is not None:
            steps += [self.control.stop, self.control.cleanup]
        if self.moto is not None:
            steps.append(self.moto.stop)
        if self.postgres is not None:
            steps.append(self.postgres.stop)
        errors = []
        for step in steps:
            try:
                step()
            except Exception as err:
                errors.append(err)
        if errors:
            print(f"fleet teardown: {len(errors)} step(s) failed; first: {errors[0]!r}", file=sys.stderr)

    def __enter__(self) -> Fleet:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
