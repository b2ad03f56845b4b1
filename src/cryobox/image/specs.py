"""Template specs: what a template's image holds and how it is warmed up before its snapshot is taken."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from importlib import resources
from typing import Any

DEBIAN_SUITE = "bookworm"
BASE_PACKAGES = ("python3", "iproute2", "procps")


@dataclass(frozen=True)
class TemplateSpec:
    """Inputs of a template. Its generation is a hash of these plus the image and machine inputs."""

    name: str
    packages: tuple[str, ...] = BASE_PACKAGES
    memory_mib: int = 512
    cpus: int = 1
    warmup: tuple[str, ...] = ()
    files: dict[str, str] = field(default_factory=dict)
    pip: tuple[str, ...] = ()  # wheels installed into the image at build time (pip itself is not added)
    base: str = ""
    """The built-in template a custom one derives from: its tree is the starting point, and whatever
    ``packages`` and ``pip`` add to it is installed in a build VM, never on the host."""
    recipe: dict[str, Any] | None = None
    """A Dockerfile's or E2B's steps (:class:`cryobox.image.recipe.model.Recipe` as JSON): the root filesystem
    is what a build VM makes of them; ``packages`` and ``pip`` are then unused."""
    agent_disk: bool = False
    """Boot with the agent disk (:mod:`cryobox.image.agentdisk`): the guest agent runs from a read-only disk
    of its own at ``/.cryobox`` and needs nothing of the image's userland (a static busybox or musl image boots).
    Off for the built-in templates, whose images carry the agent and ``/sbin/cryobox-init`` themselves."""
    kernel_modules: bool = False
    """The guest kernel's whole module tree in the image (``/lib/modules/<release>``, indexed), for guests that load
    modules (Docker's overlay, bridge, veth and netfilter); the other images carry only the initramfs's virtio ones."""
    disk_free_mib: int = 0
    """Free space in the root filesystem beyond the default 1 GiB (room for what sandboxes write: container images)."""

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for optional in ("pip", "base", "recipe", "agent_disk", "kernel_modules", "disk_free_mib"):
            if not data[optional]:
                del data[optional]  # keeps the generations of specs that predate the field
        return data

    def base_spec(self) -> TemplateSpec:
        """The built-in spec whose image this one starts from (itself for a built-in)."""
        if not self.base:
            return self
        base = by_name(self.base)
        if base is None:
            raise ValueError(f"unknown base template {self.base!r}")
        return base

    @property
    def added_packages(self) -> tuple[str, ...]:
        """Debian packages beyond the base's (installed in a build VM)."""
        base = self.base_spec()
        return tuple(p for p in self.packages if p not in base.packages)

    @property
    def added_pip(self) -> tuple[str, ...]:
        base = self.base_spec()
        return tuple(r for r in self.pip if r not in base.pip)


BASE = TemplateSpec(
    name="base",
    memory_mib=512,
    cpus=1,
    warmup=("true", "python3 -c 'import json, subprocess, os'"),
)

KERNELS_PORT = 49999
START_KERNELS = (
    # the kernel server (guest/kernels/), as E2B's default user, baked alive: every restore has a warm kernel
    "setsid nohup python3 -m cryobox_guest.kernels --user user >/var/log/cryobox-kernels.log 2>&1 </dev/null &\n"
    "python3 - <<'PY'\n"
    "import json, time, urllib.request\n"
    "deadline = time.time() + 280\n"
    "while True:\n"
    "    try:\n"
    "        health = json.load(urllib.request.urlopen('http://127.0.0.1:49999/health', timeout=10))\n"
    "        if health.get('spares_ready'):\n"
    "            break\n"
    "    except OSError:\n"
    "        pass\n"
    "    if time.time() > deadline:\n"
    "        raise SystemExit('the kernel server did not get ready: ' + open('/var/log/cryobox-kernels.log').read())\n"
    "    time.sleep(0.5)\n"
    "PY"
)

CODE_INTERPRETER = TemplateSpec(
    name="code-interpreter",
    packages=BASE_PACKAGES
    + ("python3-numpy", "python3-pandas", "python3-matplotlib", "python3-ipython", "python3-matplotlib-inline"),
    memory_mib=1024,
    cpus=1,
    warmup=(
        "true",
        "MPLBACKEND=Agg python3 -c 'import numpy, pandas, matplotlib, matplotlib.pyplot as plt; "
        'plt.plot([1, 2]); plt.savefig("/tmp/warm.png")\' && rm -f /tmp/warm.png',
        START_KERNELS,
    ),
)


def _guest_file(name: str) -> str:
    return resources.files("cryobox.image").joinpath(f"files/{name}").read_text()


DOCKER_PACKAGES = ("docker.io", "docker-compose", "kmod", "iptables", "ca-certificates")
DOCKER = TemplateSpec(
    # Debian's Docker (20.10: dockerd, containerd, runc) and docker-compose 1.29, which `docker compose` also runs
    # (a CLI plugin shim: bookworm has no compose v2); dockerd baked alive, so `docker ps` answers at once
    name="docker",
    packages=BASE_PACKAGES + DOCKER_PACKAGES,
    memory_mib=1024,
    cpus=1,
    files={
        "/usr/libexec/docker/cli-plugins/docker-compose": _guest_file("docker-compose-plugin"),
        "/etc/docker/daemon.json": _guest_file("docker-daemon.json"),
    },
    warmup=("true", _guest_file("docker-start")),
    kernel_modules=True,
    disk_free_mib=4096,
)

DEFAULT_TEMPLATES: tuple[TemplateSpec, ...] = (BASE, CODE_INTERPRETER)
"""What a host serves unless told (``--templates`` / ``CRYOBOX_TEMPLATES``)."""
BUILTIN_TEMPLATES: tuple[TemplateSpec, ...] = (*DEFAULT_TEMPLATES, DOCKER)
"""Every built-in a host can be told to serve (``--templates base,docker``)."""


def derived_spec(
    name: str,
    base: TemplateSpec,
    *,
    packages: tuple[str, ...] = (),
    pip: tuple[str, ...] = (),
    files: dict[str, str] | None = None,
    warmup: tuple[str, ...] = (),
    cpus: int | None = None,
    memory_mib: int | None = None,
) -> TemplateSpec:
    """A custom template: a built-in's package set plus extra Debian and pip packages, files and warm-up."""
    extra = tuple(p for p in packages if p not in base.packages)
    return TemplateSpec(
        name=name,
        packages=base.packages + extra,
        memory_mib=memory_mib or base.memory_mib,
        cpus=cpus or base.cpus,
        warmup=base.warmup + warmup,
        files={**base.files, **(files or {})},
        pip=base.pip + pip,
        base=base.name,
    )


def by_name(name: str) -> TemplateSpec | None:
    return next((spec for spec in BUILTIN_TEMPLATES if spec.name == name), None)
