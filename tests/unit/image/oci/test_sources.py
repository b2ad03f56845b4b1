"""The registry client's auth flows over a mock transport, and images loaded from local layouts and archives."""

from __future__ import annotations

import base64
import json
import tarfile
from pathlib import Path

import httpx
import pytest

from cryobox.errors import ImageDigestMismatch, ImagePullFailed, InvalidArgument
from cryobox.image.oci import ImageLimits, RegistrySettings, load_docker_archive, load_layout, pull_image
from cryobox.image.oci.client import RegistryClient
from cryobox.image.oci.reference import parse_reference as p
from cryobox.image.oci.settings import parse_mirrors
from tests.support.oci import LayoutWriter, digest, tar_bytes, write_docker_archive

FILES = {"etc/hello": b"hello\n"}


class FakeRegistry:
    """Serves a layout's blobs over the distribution API, behind a ``Bearer`` or ``Basic`` challenge."""

    def __init__(self, layout: LayoutWriter, scheme: str, *, corrupt: str = "") -> None:
        self.layout, self.scheme, self.corrupt = layout, scheme, corrupt
        self.seen: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(f"{request.method} {request.url}")
        if request.url.path == "/token":
            assert request.headers["authorization"] == "Basic " + base64.b64encode(b"u:p").decode()
            assert request.url.params["scope"] == "repository:team/app:pull"
            assert request.url.params["service"] == "reg"
            return httpx.Response(200, json={"token": "t0k"})
        expected = "Bearer t0k" if self.scheme == "bearer" else "Basic " + base64.b64encode(b"u:p").decode()
        if request.headers.get("authorization") != expected:
            challenge = (
                'Bearer realm="https://auth.example/token",service="reg",scope="repository:team/app:pull"'
                if self.scheme == "bearer"
                else 'Basic realm="registry"'
            )
            return httpx.Response(401, headers={"WWW-Authenticate": challenge})
        *_, kind, target = request.url.path.split("/")
        if kind == "manifests" and target == "v1":
            target = self.layout.refs[0]["digest"]
        data = (self.layout.root / "blobs" / "sha256" / target.removeprefix("sha256:")).read_bytes()
        if target == self.corrupt:
            data = data[:-1] + b"!"
        return httpx.Response(200, content=data, headers={"Content-Type": "application/vnd.oci.image.manifest.v1+json"})


def _layout(tmp_path: Path) -> LayoutWriter:
    layout = LayoutWriter(tmp_path / "layout")
    layout.tag("v1", layout.image([FILES], Cmd=["/bin/true"]))
    return layout


@pytest.mark.parametrize("scheme", ["bearer", "basic"])
def test_pull_answers_the_challenge(tmp_path: Path, scheme: str) -> None:
    fake = FakeRegistry(_layout(tmp_path), scheme)
    settings = RegistrySettings(credentials={"reg.example": ("u", "p")})
    with RegistryClient(settings, transport=httpx.MockTransport(fake)) as client:
        image = pull_image(
            "reg.example/team/app:v1",
            tmp_path / "out",
            settings=settings,
            limits=ImageLimits(),
            progress=lambda _: None,
            client=client,
        )
    assert image.layers[0].read_bytes() == tar_bytes(FILES) and image.config.start_cmd == "/bin/true"
    assert fake.seen[0] == "GET https://reg.example/v2/team/app/manifests/v1"
    assert sum("401" in s for s in fake.seen) == 0  # the token was reused: one challenge only
    assert sum("/token" in s for s in fake.seen) == (1 if scheme == "bearer" else 0)


def test_basic_challenge_without_credentials(tmp_path: Path) -> None:
    fake = FakeRegistry(_layout(tmp_path), "basic")
    settings = RegistrySettings()
    with (
        RegistryClient(settings, transport=httpx.MockTransport(fake)) as client,
        pytest.raises(ImagePullFailed, match="asks for credentials"),
    ):
        pull_image(
            "reg.example/team/app:v1",
            tmp_path / "out",
            settings=settings,
            limits=ImageLimits(),
            progress=lambda _: None,
            client=client,
        )


def test_a_corrupt_layer_is_refused(tmp_path: Path) -> None:
    layout = _layout(tmp_path)
    manifest = json.loads((layout.root / "blobs/sha256" / layout.refs[0]["digest"][7:]).read_text())
    fake = FakeRegistry(layout, "bearer", corrupt=manifest["layers"][0]["digest"])
    settings = RegistrySettings(credentials={"reg.example": ("u", "p")}, cache_dir=tmp_path / "cache")
    with RegistryClient(settings, transport=httpx.MockTransport(fake)) as client, pytest.raises(ImageDigestMismatch):
        pull_image(
            "reg.example/team/app:v1",
            tmp_path / "out",
            settings=settings,
            limits=ImageLimits(),
            progress=lambda _: None,
            client=client,
        )
    assert not list((tmp_path / "out").glob("*.tar"))
    assert not list((tmp_path / "cache").glob("oci-layer/*/layer.tar"))


def test_load_layout_directory_and_archive(tmp_path: Path) -> None:
    layout = _layout(tmp_path)
    image = load_layout(layout.root, tmp_path / "a", limits=ImageLimits(), progress=lambda _: None)
    assert image.digest == layout.refs[0]["digest"] and image.layers[0].read_bytes() == tar_bytes(FILES)
    archive = tmp_path / "layout.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(layout.root, arcname=".")
    again = load_layout(archive, tmp_path / "b", limits=ImageLimits(), progress=lambda _: None, ref="v1")
    assert again.diff_ids == image.diff_ids
    with pytest.raises(ImagePullFailed, match="no image named 'v2'"):
        load_layout(layout.root, tmp_path / "c", limits=ImageLimits(), progress=lambda _: None, ref="v2")


def test_load_docker_archive(tmp_path: Path) -> None:
    archive = tmp_path / "saved.tar"
    config_digest = write_docker_archive(archive, [FILES, {"b": b"2"}], tags=["busybox:latest"], Cmd=["sh"])
    image = load_docker_archive(
        archive, tmp_path / "out", limits=ImageLimits(), progress=lambda _: None, ref="docker.io/library/busybox"
    )
    assert image.digest == config_digest and image.config.start_cmd == "sh"
    assert [p.read_bytes() for p in image.layers] == [tar_bytes(FILES), tar_bytes({"b": b"2"})]
    assert image.diff_ids == [digest(tar_bytes(FILES)), digest(tar_bytes({"b": b"2"}))]
    with pytest.raises(ImagePullFailed, match="no image tagged"):
        load_docker_archive(archive, tmp_path / "x", limits=ImageLimits(), progress=lambda _: None, ref="other")


def test_docker_archive_with_an_oci_layout_inside(tmp_path: Path) -> None:
    layout = _layout(tmp_path)
    archive = tmp_path / "oci.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(layout.root, arcname=".")
    image = load_docker_archive(archive, tmp_path / "out", limits=ImageLimits(), progress=lambda _: None)
    assert image.layers[0].read_bytes() == tar_bytes(FILES)


def test_settings_from_env(tmp_path: Path) -> None:
    auth = tmp_path / "config.json"
    auth.write_text(
        json.dumps(
            {
                "auths": {
                    "https://index.docker.io/v1/": {"auth": base64.b64encode(b"me:pw").decode()},
                    "ghcr.io": {"username": "x", "password": "y"},
                }
            }
        )
    )
    settings = RegistrySettings.from_env(
        {
            "CRYOBOX_REGISTRY_MIRROR": "docker.io=http://127.0.0.1:5000/, quay.io=https://q.internal",
            "CRYOBOX_REGISTRY_INSECURE": "reg.lan:5000,build.lan",
            "CRYOBOX_REGISTRY_AUTH_FILE": str(auth),
            "CRYOBOX_REGISTRY_TIMEOUT_S": "5",
        }
    )
    assert dict(settings.mirrors) == {"docker.io": "http://127.0.0.1:5000", "quay.io": "https://q.internal"}
    assert dict(settings.credentials) == {"docker.io": ("me", "pw"), "ghcr.io": ("x", "y")}
    assert settings.timeout_s == 5

    assert settings.base_url(p("busybox")) == "http://127.0.0.1:5000"
    assert settings.base_url(p("reg.lan:5000/a")) == "http://reg.lan:5000"
    assert settings.base_url(p("reg.lan:6000/a")) == "https://reg.lan:6000"
    assert settings.base_url(p("build.lan:1/a")) == "http://build.lan:1"
    assert settings.base_url(p("localhost:5000/a")) == "http://localhost:5000"
    assert settings.base_url(p("127.0.0.2:5000/a")) == "http://127.0.0.2:5000"
    assert settings.base_url(p("ghcr.io/a")) == "https://ghcr.io"
    assert RegistrySettings().base_url(p("busybox")) == "https://registry-1.docker.io"
    with pytest.raises(InvalidArgument):
        parse_mirrors("docker.io")
