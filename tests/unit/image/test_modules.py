"""The kernel's module tree goes into images that ask for it (``docker``), indexed by ``depmod``; the built-ins'
specs keep their generations; the compose plugin shim answers Docker's plugin protocol."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path

import pytest
import typer

from cryobox.cli.templates_opt import parse_templates
from cryobox.image.modules import KernelModules, install_modules
from cryobox.image.specs import BASE, BUILTIN_TEMPLATES, CODE_INTERPRETER, DEFAULT_TEMPLATES, DOCKER, by_name


def fake_modules(root: Path, release: str = "6.1.0-9-cloud-amd64") -> KernelModules:
    tree = root / "lib" / "modules" / release
    (tree / "kernel" / "fs" / "overlayfs").mkdir(parents=True)
    (tree / "kernel" / "fs" / "overlayfs" / "overlay.ko").write_bytes(b"\x7fELF module")
    (tree / "modules.builtin").write_text("kernel/fs/ext4/ext4.ko\n")
    (tree / "build").symlink_to("/usr/src/linux-headers-" + release)
    return KernelModules(root)


def test_install_copies_the_tree_drops_header_links_and_indexes_it(tmp_path: Path) -> None:
    modules = fake_modules(tmp_path / "cache")
    image = tmp_path / "image"
    image.mkdir()
    calls: list[list[str]] = []

    def runner(argv: Sequence[str], *, cwd: Path | None = None, progress: Callable[[str], None] | None = None) -> str:
        calls.append(list(argv))
        return ""

    install_modules(modules, image, runner)
    installed = image / "lib" / "modules" / modules.release
    assert (installed / "kernel" / "fs" / "overlayfs" / "overlay.ko").read_bytes() == b"\x7fELF module"
    assert (installed / "modules.builtin").exists()
    assert not (installed / "build").is_symlink()  # it would point at headers the image does not have
    assert calls == [["depmod", "-b", str(image), modules.release]]


def test_docker_is_built_in_but_not_served_unless_asked() -> None:
    assert by_name("docker") is DOCKER and DOCKER in BUILTIN_TEMPLATES and DOCKER not in DEFAULT_TEMPLATES
    assert parse_templates(None) == (BASE, CODE_INTERPRETER)
    assert parse_templates("base,docker") == (BASE, DOCKER)
    with pytest.raises(typer.BadParameter, match="docker"):
        parse_templates("nope")


def test_new_spec_fields_appear_only_where_used() -> None:
    """The built-ins' spec JSON (the input of their generation) is what it was before the fields existed."""
    for spec in (BASE, CODE_INTERPRETER):
        assert "kernel_modules" not in spec.to_json() and "disk_free_mib" not in spec.to_json()
    docker = DOCKER.to_json()
    assert docker["kernel_modules"] is True and docker["disk_free_mib"] >= 4096
    assert {"docker.io", "docker-compose", "kmod"} <= set(docker["packages"])


def test_the_compose_plugin_answers_the_cli_plugin_protocol(tmp_path: Path) -> None:
    shim = tmp_path / "docker-compose"
    shim.write_text(resources.files("cryobox.image").joinpath("files/docker-compose-plugin").read_text())
    meta = subprocess.run(["sh", str(shim), "docker-cli-plugin-metadata"], capture_output=True, text=True, check=True)
    assert json.loads(meta.stdout)["SchemaVersion"] == "0.1.0"
    assert DOCKER.files["/usr/libexec/docker/cli-plugins/docker-compose"] == shim.read_text()
