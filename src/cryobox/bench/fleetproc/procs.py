"""``cryobox control`` (:class:`ControlProcess`) and ``cryobox agent`` (:class:`AgentProcess`) as child processes:
spawn, readiness, stop by PID, restart on the same port, and release of what a killed one leaves on the host."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import httpx

from ...agent.host.reclaim import find_own_qemus
from ...agent.net.slots import CIDR_ENV, tag_for
from ...agent.vm.cgroups import CgroupHost
from ...config import DEFAULT_CACHE_DIR, Paths
from ...util.sealing import SECRET_KEY_ENV
from ..childproc import ChildProcess
from ..server import free_port, release_serve_state
from .addresses import AGENT_PORT, check_name, loopback_ports
from .moto import S3_CREDENTIALS
from .netns import AgentNetns
from .system import in_thread, kill_pid


def agents_by_name(payload: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``GET /v1/agents`` -> {name: agent}."""
    return {str(a["name"]): dict(a) for a in payload.get("agents", []) if isinstance(a, Mapping) and "name" in a}


def _release_host_state(data_dir: Path, cache_dir: Path | None) -> None:
    """What :meth:`ServeProcess.cleanup` does (:func:`release_serve_state`), after the stragglers a SIGKILLed agent
    leaves: its QEMUs (their ``-pidfile`` lies in our run dir) and its memory server (by pid file); then its VMs'
    cgroups and its per-sandbox namespaces (by tag)."""
    paths = Paths(data_dir, cache_dir or DEFAULT_CACHE_DIR)
    for pid in find_own_qemus(paths.run_dir):
        kill_pid(pid)
    pidfile = paths.memserver_dir / "memserver.pid"
    with contextlib.suppress(OSError, ValueError):
        pid = int(pidfile.read_text())
        if b"cryobox.agent.memory.server.main" in Path(f"/proc/{pid}/cmdline").read_bytes():
            kill_pid(pid)
    release_serve_state(data_dir, cache_dir)
    cgroups = CgroupHost.detect(tag_for(data_dir))
    if cgroups is not None:  # its VMs' cgroups (empty once their QEMUs are gone), then its own
        cgroups.reclaim()
        cgroups.remove_base()
    if data_dir.exists():
        from ...agent.net.netlink import reclaim

        in_thread(lambda: reclaim(tag_for(data_dir)))  # netlink calls must not run on an event loop thread


class ControlProcess(ChildProcess):
    """``cryobox control`` on ``listen_host:<free port>`` (chosen once: :meth:`restart` keeps it)."""

    what = "cryobox control"

    def __init__(
        self,
        data_dir: Path,
        *,
        database_url: str,
        node_token: str,
        api_key: str,
        store_url: str | None = None,
        cache_dir: Path | None = None,
        agent_deadline_s: float = 10.0,
        reap_interval_s: float | None = None,
        extra_env: Mapping[str, str] | None = None,
        extra_args: Sequence[str] = (),
        listen_host: str = "127.0.0.1",
        secret_key: str | None = None,
    ) -> None:
        super().__init__(data_dir, data_dir / "control.log", extra_env, extra_args)
        self.database_url = database_url
        self.node_token = node_token
        self.api_key = api_key
        self.secret_key = secret_key
        """``CRYOBOX_SECRET_KEY``: replicas on one PostgreSQL must share it (each has its own data dir)."""
        self.store_url = store_url
        self.cache_dir = cache_dir
        self.agent_deadline_s = agent_deadline_s
        self.reap_interval_s = reap_interval_s
        self.listen_host = listen_host
        self.port = free_port()
        self.url = f"http://{'127.0.0.1' if listen_host in ('0.0.0.0', '') else listen_host}:{self.port}"

    def argv(self) -> list[str]:
        argv = [sys.executable, "-m", "cryobox.cli.main", "control", "--listen", f"{self.listen_host}:{self.port}"]
        argv += ["--data-dir", str(self.data_dir), "--agent-deadline", str(self.agent_deadline_s)]
        if self.cache_dir is not None:
            argv += ["--cache-dir", str(self.cache_dir)]
        if self.store_url:
            argv += ["--store", self.store_url]
        if self.reap_interval_s is not None:
            argv += ["--reap-interval", str(self.reap_interval_s)]
        return argv + self.extra_args

    def child_env(self) -> dict[str, str]:
        return {
            **os.environ,
            "CRYOBOX_DATABASE_URL": self.database_url,
            "CRYOBOX_NODE_TOKEN": self.node_token,
            "CRYOBOX_API_KEY": self.api_key,
            **({SECRET_KEY_ENV: self.secret_key} if self.secret_key else {}),
            **S3_CREDENTIALS,
            **self.extra_env,
        }

    def ready(self) -> bool:
        return httpx.get(f"{self.url}/healthz", timeout=1.0, trust_env=False).status_code == 200

    def agents(self, timeout_s: float = 5.0) -> dict[str, dict[str, Any]]:
        """``GET /v1/agents`` by agent name."""
        response = httpx.get(
            f"{self.url}/v1/agents",
            headers={"Authorization": f"Bearer {self.api_key}"},
            timeout=timeout_s,
            trust_env=False,
        )
        response.raise_for_status()
        return agents_by_name(response.json())

    def cleanup(self) -> None:
        _release_host_state(self.data_dir, self.cache_dir)


class AgentProcess(ChildProcess):
    """``cryobox agent`` in ``netns`` (``nsenter --net``; listening on the namespace's address) or, with
    ``netns=None``, on ``127.0.0.1:<free port>``. Ready when its healthz answers and, given ``api_key``, the control
    plane lists it ``up``. ``cleanup()`` releases what a dead agent may have left (see :func:`_release_host_state`)."""

    what = "cryobox agent"
    start_timeout_s = 1800.0

    def __init__(
        self,
        name: str,
        data_dir: Path,
        *,
        control_url: str,
        node_token: str,
        store_url: str | None = None,
        cache_dir: Path | None = None,
        net_cidr: str | None = None,
        template_source: Literal["build", "store"] = "build",
        templates: Sequence[str] = ("base",),
        prespawn: int = 0,
        net_pool: int = 2,
        memory_mib: int | None = None,
        max_sandboxes: int | None = None,
        memory: Literal["hot", "lazy"] | None = None,
        heartbeat_interval_s: float | None = None,
        netns: AgentNetns | None = None,
        api_key: str | None = None,
        extra_env: Mapping[str, str] | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        super().__init__(data_dir, data_dir / "agent.log", extra_env, extra_args)
        self.name = check_name(name)
        self.control_url = control_url
        self.node_token = node_token
        self.store_url = store_url
        self.cache_dir = cache_dir
        self.net_cidr = net_cidr
        self.template_source = template_source
        self.templates = tuple(templates)
        self.prespawn = prespawn
        self.net_pool = net_pool
        self.memory_mib = memory_mib
        self.max_sandboxes = max_sandboxes
        self.memory = memory
        self.heartbeat_interval_s = heartbeat_interval_s
        self.netns = netns
        self.api_key = api_key
        if netns is not None:
            self.listen_host, self.port = netns.agent_ip, AGENT_PORT
        else:
            self.listen_host, self.port = "127.0.0.1", free_port()
        self.url = f"http://{self.listen_host}:{self.port}"

    def argv(self) -> list[str]:
        argv = [sys.executable, "-m", "cryobox.cli.main", "agent", "--listen", f"{self.listen_host}:{self.port}"]
        argv += ["--control", self.control_url, "--data-dir", str(self.data_dir), "--name", self.name]
        argv += ["--advertise", self.url, "--template-source", self.template_source]
        argv += ["--templates", ",".join(self.templates), "--prespawn", str(self.prespawn)]
        argv += ["--net-pool", str(self.net_pool)]
        if self.cache_dir is not None:
            argv += ["--cache-dir", str(self.cache_dir)]
        if self.store_url:
            argv += ["--store", self.store_url]
        if self.memory_mib is not None:
            argv += ["--memory-mib", str(self.memory_mib)]
        if self.max_sandboxes is not None:
            argv += ["--max-sandboxes", str(self.max_sandboxes)]
        if self.memory is not None:
            argv += ["--memory", self.memory]
        if self.heartbeat_interval_s is not None:
            argv += ["--heartbeat-interval", str(self.heartbeat_interval_s)]
        argv += self.extra_args
        return self.netns.wrap(argv) if self.netns is not None else argv

    def child_env(self) -> dict[str, str]:
        # a harness's agent leaves nothing running when stopped, unless the caller asks (extra_env)
        env = {**os.environ, "CRYOBOX_NODE_TOKEN": self.node_token, "CRYOBOX_ON_STOP": "kill", **S3_CREDENTIALS}
        if self.net_cidr:
            env[CIDR_ENV] = self.net_cidr
        return {**env, **self.extra_env}

    def launch(self) -> None:
        if self.netns is not None:
            self.netns.log_dir = self.data_dir
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self.netns.forward_loopback(loopback_ports([self.control_url, self.store_url or ""]))
        super().launch()

    def healthy(self) -> bool:
        headers = {"Authorization": f"Bearer {self.node_token}"}
        url = f"{self.url}/agent/v1/healthz"
        return httpx.get(url, headers=headers, timeout=1.0, trust_env=False).status_code == 200

    def status(self) -> str | None:
        """This agent's status in the control plane (``None`` when not listed, or without ``api_key``)."""
        if self.api_key is None:
            return None
        response = httpx.get(
            f"{self.control_url}/v1/agents",
            headers={"Authorization": f"Bearer {self.api_key}"},
            timeout=2.0,
            trust_env=False,
        )
        response.raise_for_status()
        agent = agents_by_name(response.json()).get(self.name)
        return None if agent is None else str(agent.get("status"))

    def ready(self) -> bool:
        return self.healthy() and (self.api_key is None or self.status() == "up")

    @property
    def paths(self) -> Paths:
        return Paths(self.data_dir, self.cache_dir or DEFAULT_CACHE_DIR)

    @property
    def memserver_socket(self) -> Path:
        return self.paths.memserver_dir / "control.sock"

    def memserver_stats(self, timeout_s: float = 10.0) -> dict[str, Any]:
        """The memory server's ``GET /stats`` (control socket: a unix socket, reachable from any namespace)."""
        transport = httpx.HTTPTransport(uds=str(self.memserver_socket))
        with httpx.Client(transport=transport, base_url="http://memserver", timeout=timeout_s) as client:
            response = client.get("/stats")
            response.raise_for_status()
            result: dict[str, Any] = response.json()
            return result

    def metrics_text(self, timeout_s: float = 10.0) -> str:
        headers = {"Authorization": f"Bearer {self.node_token}"}
        response = httpx.get(f"{self.url}/agent/v1/metrics", headers=headers, timeout=timeout_s, trust_env=False)
        response.raise_for_status()
        return response.text

    def cleanup(self) -> None:
        _release_host_state(self.data_dir, self.cache_dir)
        if self.netns is None and self.data_dir.exists():  # in its own namespace the table went with it
            from ...agent.net.firewall import Firewall
            from ...agent.net.slots import SlotPlan

            with contextlib.suppress(Exception):
                Firewall(SlotPlan(tag=tag_for(self.data_dir), cidr=self.net_cidr or "10.200.0.0/16")).remove()
