"""Docker inside sandboxes (the built-in ``docker`` template) on real VMs: containers run, build and compose from a
registry on the suite's stand-in internet, published ports answer through cryobox's port proxy, a snapshot and a
fork tree carry running containers, and a privileged container stays inside its VM."""

from __future__ import annotations

import ipaddress
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cryobox import Sandbox
from cryobox.agent.net.egress.resolver import UPSTREAM_ENV as DNS_UPSTREAM
from cryobox.bench.server import ServeProcess
from tests.integration.conftest import ALLOW_PRIVATE
from tests.support.docker_registry import InternetRegistry, registry_on
from tests.support.internet import Internet
from tests.support.netutil import OUTSIDE_RANGE, REACH_S, Listener, outside_network, probe
from tests.support.oci import Files, busybox_files, write_docker_archive
from tests.support.serve import cli

APPLETS = ("sh", "echo", "cat", "ls", "sleep", "wget", "httpd", "hostname", "mkdir", "rm", "mv", "true", "nc")
WEB_PORT = 8000
COMPOSE = """\
services:
  web:
    image: {image}
    command: ["sh", "-c", "mkdir -p /www && echo web-up > /www/index.html && httpd -f -p {port} -h /www"]
    ports: ["8080:{port}"]
  client:
    image: {image}
    command:
      - sh
      - -c
      - mkdir -p /tmp; while true; do wget -qO /tmp/got http://web:{port}/ && mv /tmp/got /tmp/seen; sleep 1; done
    depends_on: [web]
"""


def busybox_layer() -> Files:
    return busybox_files(APPLETS)


@pytest.fixture(scope="module")
def docker_server(
    tmp_path_factory: pytest.TempPathFactory, cache_dir: Path, suite_internet: Internet
) -> Iterator[ServeProcess]:
    """A server of the ``docker`` template, resolving in the suite's internet like the shared one."""
    env = {ALLOW_PRIVATE: OUTSIDE_RANGE, DNS_UPSTREAM: suite_internet.dns}
    proc = ServeProcess(
        tmp_path_factory.mktemp("docker-serve"),
        cache_dir=cache_dir,
        extra_env=env,
        extra_args=["--templates", "docker"],
    ).start(timeout_s=1800)
    try:
        yield proc
    finally:
        proc.stop()
        proc.cleanup()


@pytest.fixture(scope="module")
def registry(suite_internet: Internet) -> Iterator[InternetRegistry]:
    with registry_on(suite_internet, f"registry-{secrets.token_hex(3)}.example.test") as found:
        yield found


@pytest.fixture(scope="module")
def hello(registry: InternetRegistry, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A busybox image in the registry whose default command greets."""
    return registry.push(
        tmp_path_factory.mktemp("images"),
        "cryobox/hello",
        [busybox_layer()],
        Env=["PATH=/bin"],
        Cmd=["sh", "-c", "echo hello from a container on $(hostname)"],
    )


def docker_sandbox(server: ServeProcess, registry: InternetRegistry, extra_allow: list[str] | None = None) -> Sandbox:
    """A ``docker`` sandbox whose policy allows the registry's name (and ``extra_allow``), trusting its CA."""
    network = {"default": "deny", "allow": [registry.name, *(extra_allow or [])]}
    sbx = Sandbox.create(template="docker", api_url=server.url, api_key=server.api_key, network=network)
    sbx.filesystem.write(f"/etc/docker/certs.d/{registry.name}/ca.crt", registry.ca_pem)
    return sbx


def sh(sbx: Sandbox, cmd: str, timeout: float = 300) -> str:
    done = sbx.exec(cmd, timeout_seconds=timeout)
    assert done.exit_code == 0, f"{cmd}: {done.exit_code}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_docker_answers_at_once_then_runs_builds_and_loads_images(
    docker_server: ServeProcess, registry: InternetRegistry, hello: str, tmp_path: Path
) -> None:
    with docker_sandbox(docker_server, registry) as sbx:
        started = time.monotonic()
        ps = sbx.exec("docker ps --format '{{.ID}}'", timeout_seconds=30)
        answered_s = time.monotonic() - started
        assert ps.exit_code == 0 and ps.stdout == "", ps  # dockerd was baked alive: no daemon start on create
        assert answered_s < 20, answered_s
        out = sh(sbx, f"docker run --rm {hello}")  # pulled through the egress proxy, the registry's name allowed
        assert out.startswith("hello from a container on "), out
        # the sandbox's default user may use docker too (E2B's SDKs run commands as `user`)
        assert sh(sbx, "su user -c 'docker image ls --format {{.Repository}}'").split() == [hello.rsplit(":", 1)[0]]
        # `docker build` (BuildKit, the daemon's default here) of a Dockerfile with RUN and COPY
        sbx.filesystem.write(
            "/root/app/Dockerfile",
            f"FROM {hello}\nRUN echo built-at-build > /built.txt\nCOPY note.txt /note.txt\n"
            'CMD ["sh", "-c", "cat /built.txt /note.txt"]\n',
        )
        sbx.filesystem.write("/root/app/note.txt", "copied from the context\n")
        built = sh(sbx, "cd /root/app && docker build --progress plain -t built . 2>&1", timeout=600)
        assert "#1 [internal] load build definition" in built, built  # BuildKit's log, not the legacy builder's
        assert sh(sbx, "docker run --rm built") == "built-at-build\ncopied from the context\n"
        # an image file uploaded through the files API, then `docker load`
        archive = tmp_path / "loaded.tar"
        write_docker_archive(
            archive, [busybox_layer()], tags=["loaded/app:7"], Env=["PATH=/bin"], Cmd=["echo", "loaded ok"]
        )
        sbx.filesystem.write("/root/loaded.tar", archive.read_bytes())
        assert "loaded/app:7" in sh(sbx, "docker load -i /root/loaded.tar")
        assert sh(sbx, "docker run --rm loaded/app:7") == "loaded ok\n"


def test_compose_stack_through_the_proxy_survives_snapshot_restore_and_hibernation(
    docker_server: ServeProcess, registry: InternetRegistry, hello: str
) -> None:
    headers = {"Authorization": f"Bearer {docker_server.api_key}"}
    with docker_sandbox(docker_server, registry) as sbx:
        sbx.filesystem.write("/root/stack/compose.yaml", COMPOSE.format(image=hello, port=WEB_PORT))
        sh(sbx, "cd /root/stack && docker compose -p stack up -d", timeout=600)
        wait_for(sbx, "docker exec stack_client_1 cat /tmp/seen", "web-up\n")
        page = httpx.get(f"{docker_server.url}/v1/sandboxes/{sbx.id}/ports/8080/", headers=headers, timeout=60)
        assert page.status_code == 200 and page.text == "web-up\n", page.text
        sh(sbx, "docker exec stack_web_1 sh -c 'echo state-before-snapshot > /www/state.txt'")
        snap = sbx.snapshot()
        with Sandbox.create(
            from_snapshot=snap.id, api_url=docker_server.url, api_key=docker_server.api_key
        ) as restored:
            running = sh(restored, "docker ps --format '{{.Names}} {{.Status}}' | sort")
            assert [line.split()[0] for line in running.splitlines()] == ["stack_client_1", "stack_web_1"], running
            assert sh(restored, "docker exec stack_web_1 cat /www/state.txt") == "state-before-snapshot\n"
            # the client keeps calling the web service after the restore
            sh(restored, "docker exec stack_client_1 rm /tmp/seen")
            wait_for(restored, "docker exec stack_client_1 cat /tmp/seen", "web-up\n")
            url = f"{docker_server.url}/v1/sandboxes/{restored.id}/ports/8080/state.txt"
            page = httpx.get(url, headers=headers, timeout=60)
            assert page.status_code == 200 and page.text == "state-before-snapshot\n", page.text
            # a new container starts, resolves and reaches the web service by name after the restore
            network = sh(
                restored, "docker inspect -f '{{range $k, $v := .NetworkSettings.Networks}}{{$k}}{{end}}' stack_web_1"
            ).strip()
            got = sh(restored, f"docker run --rm --network {network} {hello} wget -q -O - http://web:{WEB_PORT}/")
            assert got == "web-up\n"
        # the source sandbox hibernates (memory to disk, QEMU gone) and wakes with its stack still serving
        sbx.hibernate()
        sbx.wake()
        sh(sbx, "docker exec stack_client_1 rm /tmp/seen")
        wait_for(sbx, "docker exec stack_client_1 cat /tmp/seen", "web-up\n")


def test_fork_tree_children_each_run_their_own_containers(
    docker_server: ServeProcess, registry: InternetRegistry, hello: str
) -> None:
    headers = {"Authorization": f"Bearer {docker_server.api_key}"}
    with docker_sandbox(docker_server, registry) as sbx:
        sh(sbx, f"docker pull -q {hello}")
        tree = sbx.fork_tree(4)
        try:
            assert len(tree.children) == 4 and not tree.errors, tree.errors
            for i, child in enumerate(tree.children):
                sh(child, f"docker run -d --name web -p 8080:{WEB_PORT} {hello} {serve_page(f'child-{i}')}")
            for i, child in enumerate(tree.children):
                page = httpx.get(
                    f"{docker_server.url}/v1/sandboxes/{child.id}/ports/8080/", headers=headers, timeout=60
                )
                assert page.status_code == 200 and page.text == f"child-{i}\n", (i, page.text)
                assert sh(child, "docker ps -q | wc -l").strip() == "1"
            assert sh(sbx, "docker ps -q") == ""  # the parent runs none of its children's containers
        finally:
            for child in tree.children:
                child.kill()


def test_a_privileged_container_stays_inside_its_vm(
    docker_server: ServeProcess, registry: InternetRegistry, hello: str
) -> None:
    """From a ``--privileged`` container: a server the sandbox's policy allows answers (the probe works), but not
    the host's end of the slot, a metadata address, a private network or another sandbox's published port — though
    the host reaches each of them; the container sees the VM's memory, not the host's; a policy change reaches
    containers too."""
    tags = [secrets.token_hex(3) for _ in range(3)]
    with (
        outside_network(tags[0]) as (public_cidr, public_ip),
        outside_network(tags[1], "169.254.169.252/30") as (_, metadata_ip),
        outside_network(tags[2], f"10.198.{secrets.randbelow(256)}.0/30") as (_, lan_ip),
        docker_sandbox(docker_server, registry, extra_allow=[public_cidr]) as sbx,
        docker_sandbox(docker_server, registry) as other,
    ):
        listeners = {
            "public": Listener(f"cryobox-{tags[0]}-out", public_ip),
            "metadata": Listener(f"cryobox-{tags[1]}-out", metadata_ip),
            "private": Listener(f"cryobox-{tags[2]}-out", lan_ip),
            "host": Listener(None, "0.0.0.0"),
        }
        try:
            sh(other, f"docker run -d -p 8080:{WEB_PORT} {hello} {serve_page('other')}")
            other_ip = other.refresh().guest_ip
            assert other_ip is not None
            wait_page(f"http://{other_ip}:8080/", "other\n")  # the host reaches the other sandbox's container
            guest_ip = sbx.refresh().guest_ip
            assert guest_ip is not None
            slot_host = str(ipaddress.ip_address(guest_ip) - 1)  # the host's end of the slot's /30
            targets = {
                "public": (public_ip, listeners["public"].port),
                "metadata": (metadata_ip, listeners["metadata"].port),
                "private": (lan_ip, listeners["private"].port),
                "host": (slot_host, listeners["host"].port),
                "other sandbox": (other_ip, 8080),
            }
            for name in ("public", "metadata", "private", "host"):
                # the host itself reaches every one of them
                assert probe(None, *targets[name], timeout=REACH_S) == "ok", name
            script = "; ".join(
                f"echo {name.replace(' ', '_')}=$(echo GET / | nc -w 3 {ip} {port} 2>/dev/null | head -c 2)"
                for name, (ip, port) in targets.items()
            )
            out = sh(sbx, f"docker run --rm --privileged {hello} sh -c '{script}; cat /proc/meminfo'", timeout=180)
            lines = out.splitlines()
            seen = dict(line.split("=", 1) for line in lines if "=" in line)
            assert seen == {"public": "hi", "metadata": "", "private": "", "host": "", "other_sandbox": ""}, out
            # the container sees the VM's kernel and memory, not the host's
            total_kib = int(next(line.split()[1] for line in lines if line.startswith("MemTotal:")))
            assert total_kib < 1100 * 1024, total_kib  # the sandbox's 1 GiB, not this host's 24
            # a policy change applies to containers at once: with the public network dropped, it is closed too
            sbx.set_network(default="deny", allow=[registry.name])
            again = sh(
                sbx,
                f"docker run --rm {hello} sh -c 'echo GET / | nc -w 3 {public_ip} {targets['public'][1]} | head -c 2'",
            )
            assert again == "", again
        finally:
            for listener in listeners.values():
                listener.close()


def test_the_egress_policy_decides_pulls(docker_server: ServeProcess, registry: InternetRegistry, hello: str) -> None:
    """A sandbox whose policy does not allow the registry's name cannot pull from it (dockerd's connections go
    through the same proxy as everything else in the VM)."""
    with Sandbox.create(
        template="docker", api_url=docker_server.url, api_key=docker_server.api_key, network={"default": "deny"}
    ) as sbx:
        sbx.filesystem.write(f"/etc/docker/certs.d/{registry.name}/ca.crt", registry.ca_pem)
        pulled = sbx.exec(f"docker pull {hello}", timeout_seconds=180)
        assert pulled.exit_code != 0, pulled
        assert sh(sbx, "docker image ls -q") == ""


def serve_page(text: str) -> str:
    return f"sh -c 'mkdir -p /www && echo {text} > /www/index.html && httpd -f -p {WEB_PORT} -h /www'"


def wait_page(url: str, want: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        try:
            got = httpx.get(url, timeout=5)
            if got.status_code == 200 and got.text == want:
                return
            last = f"{got.status_code} {got.text!r}"
        except httpx.HTTPError as exc:
            last = repr(exc)
        time.sleep(0.5)
    raise AssertionError(f"{url}: never {want!r}; last {last}")


def wait_for(sbx: Sandbox, cmd: str, want: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        done = sbx.exec(cmd, timeout_seconds=60)
        last = f"{done.exit_code} {done.stdout!r} {done.stderr!r}"
        if done.exit_code == 0 and done.stdout == want:
            return
        time.sleep(1)
    raise AssertionError(f"{cmd}: never {want!r}; last {last}")


def test_a_dockerfile_from_the_docker_template_bakes_docker_alive(
    docker_server: ServeProcess, registry: InternetRegistry, hello: str, tmp_path: Path
) -> None:
    """``FROM cryobox/docker`` is the way any Dockerfile template gets Docker: the built-in's bake (modules,
    ``dockerd`` started) runs before the template's own start command."""
    (tmp_path / "Dockerfile").write_text("FROM cryobox/docker\nRUN echo from-the-dockerfile > /etc/marker\n")
    name = f"df-docker-{secrets.token_hex(4)}"
    env = {"CRYOBOX_API_URL": docker_server.url, "CRYOBOX_API_KEY": docker_server.api_key}
    built = cli("template", "build", "--name", name, str(tmp_path), env=env, timeout=1500)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    try:
        network = {"default": "deny", "allow": [registry.name]}
        with Sandbox.create(
            template=name, api_url=docker_server.url, api_key=docker_server.api_key, network=network
        ) as sbx:
            assert sh(sbx, "cat /etc/marker; docker ps -q") == "from-the-dockerfile\n"
            sbx.filesystem.write(f"/etc/docker/certs.d/{registry.name}/ca.crt", registry.ca_pem)
            assert sh(sbx, f"docker run --rm {hello}").startswith("hello from a container on ")
    finally:
        httpx.delete(
            f"{docker_server.url}/v1/templates/{name}", headers={"Authorization": f"Bearer {docker_server.api_key}"}
        )
