"""pull_image against a real registry (Debian's docker-registry on loopback), images pushed with skopeo."""

from __future__ import annotations

import tarfile
from pathlib import Path

import httpx
import pytest

from cryobox.errors import ImagePullFailed, ImageTooLarge, NotFound
from cryobox.image.oci import ImageLimits, RegistrySettings, pull_image
from tests.support import oci_registry as oci_registry_support
from tests.support.oci import LayoutWriter, busybox_files, digest, tar_bytes
from tests.support.oci_registry import OciRegistry, push_layout

oci_registry = oci_registry_support.oci_registry
oci_registry_with_auth = oci_registry_support.oci_registry_with_auth

pytestmark = pytest.mark.timeout(180)


def _members(path: Path) -> list[str]:
    with tarfile.open(path) as tar:
        return tar.getnames()


def _push_busybox(registry: OciRegistry, tmp: Path, name: str, *, compression: str = "gzip") -> str:
    layout = LayoutWriter(tmp / f"layout-{compression}")
    desc = layout.image(
        [busybox_files(), {"etc/motd": b"hello\n"}],
        compression=compression,
        Env=["PATH=/bin", "GREETING=hi there"],
        WorkingDir="/srv",
        User="1000:1000",
        Entrypoint=["/bin/sh", "-c"],
        Cmd=["echo $GREETING"],
        ExposedPorts={"8080/tcp": {}},
    )
    layout.tag("v1", desc)
    push_layout(registry, layout.root, "v1", f"{name}:v1")
    return str(desc["digest"])


def test_pull_busybox_gzip_then_again_from_the_cache(oci_registry: OciRegistry, tmp_path: Path) -> None:
    manifest_digest = _push_busybox(oci_registry, tmp_path, "cbx/busybox")
    settings = RegistrySettings(cache_dir=tmp_path / "cache")
    messages: list[str] = []
    image = pull_image(
        f"{oci_registry.host}/cbx/busybox:v1",
        tmp_path / "one",
        settings=settings,
        limits=ImageLimits(),
        progress=messages.append,
    )
    assert image.digest == manifest_digest
    assert image.platform == "linux/amd64"
    assert image.config.env == {"PATH": "/bin", "GREETING": "hi there"}
    assert image.config.workdir == "/srv" and image.config.user == "1000:1000"
    assert image.config.start_cmd == "/bin/sh -c 'echo $GREETING'"
    assert image.config.expose == (8080,)
    assert [p.parent for p in image.layers] == [tmp_path / "one"] * 2
    assert "bin/busybox" in _members(image.layers[0]) and _members(image.layers[1]) == ["etc/motd"]
    assert image.layers[0].read_bytes() == tar_bytes(busybox_files())
    assert image.diff_ids == [digest(p.read_bytes()) for p in image.layers]
    assert image.downloaded_bytes >= image.compressed_bytes > 0
    again = pull_image(
        f"{oci_registry.host}/cbx/busybox@{manifest_digest}",
        tmp_path / "two",
        settings=settings,
        limits=ImageLimits(),
        progress=messages.append,
    )
    assert again.downloaded_bytes == 0
    assert [p.read_bytes() for p in again.layers] == [p.read_bytes() for p in image.layers]


def test_pull_a_zstd_layer(oci_registry: OciRegistry, tmp_path: Path) -> None:
    _push_busybox(oci_registry, tmp_path, "cbx/busybox-zstd", compression="zstd")
    image = pull_image(
        f"{oci_registry.host}/cbx/busybox-zstd:v1",
        tmp_path / "out",
        settings=RegistrySettings(),
        limits=ImageLimits(),
        progress=lambda _: None,
    )
    assert image.layers[0].read_bytes() == tar_bytes(busybox_files())
    accept = {"Accept": "application/vnd.oci.image.manifest.v1+json"}
    manifest = httpx.get(f"http://{oci_registry.host}/v2/cbx/busybox-zstd/manifests/v1", headers=accept).json()
    assert {layer["mediaType"] for layer in manifest["layers"]} == {"application/vnd.oci.image.layer.v1.tar+zstd"}


def test_multi_arch_index_resolves_to_linux_amd64(oci_registry: OciRegistry, tmp_path: Path) -> None:
    layout = LayoutWriter(tmp_path / "layout")
    amd64 = layout.image([{"arch": b"amd64\n"}], arch="amd64", Cmd=["amd64"])
    arm64 = layout.image([{"arch": b"arm64\n"}], arch="arm64", Cmd=["arm64"])
    layout.tag("multi", layout.index([arm64, amd64]))
    push_layout(oci_registry, layout.root, "multi", "cbx/multi:multi", all_platforms=True)
    image = pull_image(
        f"{oci_registry.host}/cbx/multi:multi",
        tmp_path / "out",
        settings=RegistrySettings(),
        limits=ImageLimits(),
        progress=lambda _: None,
    )
    assert image.digest == amd64["digest"] and image.index_digest
    assert image.config.start_cmd == "amd64"
    with tarfile.open(image.layers[0]) as tar:
        member = tar.extractfile("arch")
        assert member is not None and member.read() == b"amd64\n"


def test_limits_and_missing_images(oci_registry: OciRegistry, tmp_path: Path) -> None:
    _push_busybox(oci_registry, tmp_path, "cbx/limited")
    ref = f"{oci_registry.host}/cbx/limited:v1"
    with pytest.raises(ImageTooLarge) as info:
        pull_image(ref, tmp_path / "a", settings=RegistrySettings(), limits=ImageLimits(max_layers=1), progress=print)
    assert info.value.details["limit"] == "max_layers"
    with pytest.raises(ImageTooLarge) as info:
        limits = ImageLimits(max_layer_bytes=100_000)
        pull_image(ref, tmp_path / "b", settings=RegistrySettings(), limits=limits, progress=print)
    assert info.value.details["limit"] == "max_layer_bytes"
    assert not list((tmp_path / "b").glob("*.tar"))
    with pytest.raises(NotFound):
        pull_image(
            f"{oci_registry.host}/cbx/nothing:v1",
            tmp_path / "c",
            settings=RegistrySettings(),
            limits=ImageLimits(),
            progress=print,
        )


def test_bearer_token_auth(oci_registry_with_auth: OciRegistry, tmp_path: Path) -> None:
    registry = oci_registry_with_auth
    _push_busybox(registry, tmp_path, "cbx/private")
    ref = f"{registry.host}/cbx/private:v1"
    with pytest.raises(ImagePullFailed, match="token service refused an anonymous token"):
        pull_image(ref, tmp_path / "anon", settings=RegistrySettings(), limits=ImageLimits(), progress=print)
    with pytest.raises(ImagePullFailed, match="refused the configured credentials"):
        wrong = RegistrySettings(credentials={registry.host: ("puller", "wrong")})
        pull_image(ref, tmp_path / "wrong", settings=wrong, limits=ImageLimits(), progress=print)
    settings = RegistrySettings(credentials={registry.host: ("puller", "secret-pw")})
    image = pull_image(ref, tmp_path / "ok", settings=settings, limits=ImageLimits(), progress=print)
    assert len(image.layers) == 2
    assert "repository:cbx/private:pull" in registry.token_requests
