"""Kernel module load order from .modinfo ``depends=`` strings, and apt-cache parsing."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from cryobox.errors import ImageBuildError
from cryobox.image.kernel import KernelPackage, module_dependencies, module_load_order, resolve_package
from cryobox.util.proc import Progress


def _ko(tmp_path: Path, name: str, depends: str | None) -> Path:
    path = tmp_path / f"{name}.ko"
    modinfo = b"license=GPL\x00description=test module\x00"
    if depends is not None:
        modinfo += b"depends=" + depends.encode() + b"\x00"
    modinfo += b"retpoline=Y\x00intree=Y\x00name=" + name.replace("-", "_").encode() + b"\x00vermagic=6.1.0 SMP\x00"
    path.write_bytes(b"\x7fELF\x02\x01\x01" + b"\x00" * 57 + b"\x90" * 32 + modinfo + b"\x00" * 16)
    return path


def _modules(tmp_path: Path, graph: dict[str, str | None]) -> dict[str, Path]:
    return {name: _ko(tmp_path, name, deps) for name, deps in graph.items()}


def test_module_dependencies_parsing(tmp_path: Path) -> None:
    assert module_dependencies(_ko(tmp_path, "a", "virtio,virtio_ring")) == ["virtio", "virtio_ring"]
    assert module_dependencies(_ko(tmp_path, "b", "")) == []
    assert module_dependencies(_ko(tmp_path, "c", None)) == []


def test_dependencies_come_first(tmp_path: Path) -> None:
    modules = _modules(
        tmp_path,
        {"virtio_blk": "virtio,virtio_ring", "virtio": "virtio_ring", "virtio_ring": "", "unrelated": ""},
    )
    assert module_load_order(modules, ("virtio_blk",)) == ["virtio_ring", "virtio", "virtio_blk"]


def test_shared_dependencies_listed_once(tmp_path: Path) -> None:
    modules = _modules(
        tmp_path,
        {
            "virtio_mmio": "virtio,virtio_ring",
            "virtio_blk": "virtio,virtio_ring",
            "virtio_console": "virtio,virtio_ring",
            "virtio_net": "net_failover,virtio,virtio_ring",
            "net_failover": "failover",
            "failover": "",
            "virtio": "virtio_ring",
            "virtio_ring": "",
            "virtio-rng": "virtio,virtio_ring",
        },
    )
    roots = ("virtio_mmio", "virtio_blk", "virtio_console", "virtio_net", "virtio-rng")
    order = module_load_order(modules, roots)
    assert len(order) == len(set(order))
    assert set(order) == set(modules)
    for name in order:
        for dep in module_dependencies(modules[name]):
            assert order.index(dep) < order.index(name), f"{dep} must load before {name}"
    assert order[:3] == ["virtio_ring", "virtio", "virtio_mmio"]


def test_cycle_raises(tmp_path: Path) -> None:
    modules = _modules(tmp_path, {"a": "b", "b": "c", "c": "a"})
    with pytest.raises(ImageBuildError, match="cycle"):
        module_load_order(modules, ("a",))


def test_self_cycle_raises(tmp_path: Path) -> None:
    with pytest.raises(ImageBuildError, match="cycle"):
        module_load_order(_modules(tmp_path, {"a": "a"}), ("a",))


def test_missing_dependency_raises(tmp_path: Path) -> None:
    modules = _modules(tmp_path, {"virtio_blk": "virtio,virtio_ring", "virtio_ring": ""})
    with pytest.raises(ImageBuildError, match="virtio"):
        module_load_order(modules, ("virtio_blk",))


def test_missing_root_raises(tmp_path: Path) -> None:
    with pytest.raises(ImageBuildError, match="virtio_gpu"):
        module_load_order(_modules(tmp_path, {"virtio": ""}), ("virtio_gpu",))


def test_hyphen_underscore_canonicalisation(tmp_path: Path) -> None:
    # file is virtio-rng.ko, asked for as virtio_rng; dependency spelled with a hyphen, file uses an underscore
    modules = _modules(tmp_path, {"virtio-rng": "virtio-ring", "virtio_ring": ""})
    assert module_load_order(modules, ("virtio_rng",)) == ["virtio_ring", "virtio-rng"]
    # both spellings of the same root give one entry
    assert module_load_order(modules, ("virtio-rng", "virtio_rng")) == ["virtio_ring", "virtio-rng"]


META_SHOW = """\
Package: linux-image-cloud-amd64
Source: linux-signed-amd64 (6.1.158+1)
Version: 6.1.158-1
Installed-Size: 13
Maintainer: Debian Kernel Team <debian-kernel@lists.debian.org>
Architecture: amd64
Pre-Depends: dpkg (>= 1.17.0)
Depends: linux-image-6.1.0-41-cloud-amd64 (= 6.1.158-1)
Description-en: Linux for x86-64 cloud (meta-package)
 This package depends on the latest Linux kernel and modules for use on cloud platforms.
Description-md5: 1f3c2a7e0b6a1d2c3e4f5a6b7c8d9e0f
Section: kernel
Priority: optional
Filename: pool/main/l/linux-signed-amd64/linux-image-cloud-amd64_6.1.158-1_amd64.deb
Size: 1484
MD5sum: 0123456789abcdef0123456789abcdef
SHA256: 1111111111111111111111111111111111111111111111111111111111111111

"""

IMAGE_SHA = "ab" * 32
IMAGE_SHOW = f"""\
Package: linux-image-6.1.0-41-cloud-amd64
Source: linux-signed-amd64 (6.1.158+1)
Version: 6.1.158-1
Installed-Size: 58120
Maintainer: Debian Kernel Team <debian-kernel@lists.debian.org>
Architecture: amd64
Provides: wireguard-modules (= 1.0.0)
Depends: kmod, linux-base (>= 4.3~), initramfs-tools (>= 0.120+deb8u2) | linux-initramfs-tool
Recommends: apparmor
Suggests: linux-doc-6.1, debian-kernel-handbook
Description-en: Linux 6.1 for x86-64 cloud
Section: kernel
Priority: optional
Filename: pool/main/l/linux-signed-amd64/linux-image-6.1.0-41-cloud-amd64_6.1.158-1_amd64.deb
Size: 25373336
MD5sum: 0123456789abcdef0123456789abcdef
SHA256: {IMAGE_SHA}

"""


class FakeRunner:
    def __init__(self, outputs: dict[str, str]) -> None:
        self.outputs = outputs
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], *, cwd: Path | None = None, progress: Progress | None = None) -> str:
        self.calls.append(list(argv))
        return self.outputs[argv[-1]]


def test_resolve_package() -> None:
    runner = FakeRunner({"linux-image-cloud-amd64": META_SHOW, "linux-image-6.1.0-41-cloud-amd64": IMAGE_SHOW})
    package = resolve_package(runner)
    assert package == KernelPackage(name="linux-image-6.1.0-41-cloud-amd64", version="6.1.158-1", sha256=IMAGE_SHA)
    assert runner.calls == [
        ["apt-cache", "show", "--no-all-versions", "linux-image-cloud-amd64"],
        ["apt-cache", "show", "--no-all-versions", "linux-image-6.1.0-41-cloud-amd64"],
    ]


def test_resolve_package_missing_field_raises() -> None:
    no_sha = "\n".join(line for line in IMAGE_SHOW.splitlines() if not line.startswith("SHA256"))
    runner = FakeRunner({"linux-image-cloud-amd64": META_SHOW, "linux-image-6.1.0-41-cloud-amd64": no_sha})
    with pytest.raises(ImageBuildError, match="SHA256"):
        resolve_package(runner)


def test_resolved_package_is_remembered_until_apt_lists_change(tmp_path: Path) -> None:
    from cryobox.image.kernel import apt_fingerprint, resolve_package_cached

    lists = tmp_path / "lists"
    lists.mkdir()
    (lists / "deb_Packages").write_text("one")
    memo = tmp_path / "images" / ".resolved-kernel.json"
    runner = FakeRunner({"linux-image-cloud-amd64": META_SHOW, "linux-image-6.1.0-41-cloud-amd64": IMAGE_SHOW})
    first = resolve_package_cached(memo, runner, apt_fingerprint((lists,)))
    again = resolve_package_cached(memo, runner, apt_fingerprint((lists,)))
    assert first == again and first.sha256 == IMAGE_SHA
    assert len(runner.calls) == 2, "the second start asks apt nothing"
    (lists / "deb_Packages").write_text("two, after apt-get update")
    resolve_package_cached(memo, runner, apt_fingerprint((lists,)))
    assert len(runner.calls) == 4, "new package lists: resolved again"
    memo.write_text("{torn")
    resolve_package_cached(memo, runner, apt_fingerprint((lists,)))
    assert len(runner.calls) == 6, "an unreadable memo is resolved again, not trusted"
