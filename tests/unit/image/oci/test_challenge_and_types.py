"""WWW-Authenticate parsing, layer media types and magic bytes, manifest and config parsing."""

from __future__ import annotations

import json

import pytest

from cryobox.errors import ImagePullFailed
from cryobox.image.oci.challenge import Challenge, parse_challenges
from cryobox.image.oci.imageconfig import read_image_config
from cryobox.image.oci.manifest import Index, Manifest, parse_document, select_platform
from cryobox.image.oci.mediatypes import layer_compression

D1, D2 = "sha256:" + "1" * 64, "sha256:" + "2" * 64


def test_bearer_challenge() -> None:
    header = 'Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:a/b:pull"'
    assert parse_challenges(header) == [
        Challenge(
            "bearer",
            {"realm": "https://auth.docker.io/token", "service": "registry.docker.io", "scope": "repository:a/b:pull"},
        )
    ]


def test_basic_and_several_challenges() -> None:
    assert parse_challenges('Basic realm="Registry Realm"') == [Challenge("basic", {"realm": "Registry Realm"})]
    found = parse_challenges('Basic realm="a", Bearer realm="b\\"q",scope="repository:x:pull,push", error=bare')
    assert found == [
        Challenge("basic", {"realm": "a"}),
        Challenge("bearer", {"realm": 'b"q', "scope": "repository:x:pull,push", "error": "bare"}),
    ]
    assert parse_challenges("") == []


@pytest.mark.parametrize(
    ("media_type", "head", "expected"),
    [
        ("application/vnd.oci.image.layer.v1.tar+gzip", b"\x1f\x8b\x08\x00", "gzip"),
        ("application/vnd.docker.image.rootfs.diff.tar.gzip", b"\x1f\x8b\x08\x00", "gzip"),
        ("application/vnd.oci.image.layer.v1.tar+zstd", b"\x28\xb5\x2f\xfd", "zstd"),
        ("application/vnd.oci.image.layer.v1.tar", b"bin/", "none"),
        ("application/vnd.docker.image.rootfs.diff.tar", b"\x1f\x8b\x08\x00", "gzip"),  # the bytes decide
        ("", b"etc/", "none"),  # a docker save layer
    ],
)
def test_layer_compression(media_type: str, head: bytes, expected: str) -> None:
    assert layer_compression(media_type, head) == expected


def test_refused_layer_types() -> None:
    with pytest.raises(ImagePullFailed, match="unsupported layer media type"):
        layer_compression("application/vnd.oci.image.layer.v1.tar+gzip+encrypted", b"\x1f\x8b")
    with pytest.raises(ImagePullFailed, match="does not start like gzip"):
        layer_compression("application/vnd.oci.image.layer.v1.tar+gzip", b"bin/")


def _entry(digest: str, arch: str, **extra: object) -> dict[str, object]:
    return {
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": digest,
        "size": 10,
        "platform": {"os": "linux", "architecture": arch},
        **extra,
    }


def test_index_selects_linux_amd64() -> None:
    attestation = _entry(D2, "amd64", annotations={"vnd.docker.reference.type": "attestation-manifest"})
    doc = {
        "mediaType": "application/vnd.docker.distribution.manifest.list.v2+json",
        "manifests": [_entry(D2, "arm64"), attestation, _entry(D1, "amd64")],
    }
    index = parse_document(json.dumps(doc).encode())
    assert isinstance(index, Index)
    assert select_platform(index).digest == D1
    with pytest.raises(ImagePullFailed, match=r"no linux/s390x variant \(it has: linux/amd64, linux/arm64\)"):
        select_platform(index, "linux/s390x")


def test_manifest_without_media_type_and_schema1() -> None:
    doc = {"schemaVersion": 2, "config": {"digest": D1, "size": 2}, "layers": [{"digest": D2, "size": 3}]}
    manifest = parse_document(json.dumps(doc).encode())
    assert isinstance(manifest, Manifest) and manifest.layers[0].digest == D2
    with pytest.raises(ImagePullFailed, match="schema 1"):
        parse_document(json.dumps({"schemaVersion": 1, "fsLayers": []}).encode())
    bad = {"schemaVersion": 2, "config": {"digest": "sha256:../../etc", "size": 2}, "layers": []}
    with pytest.raises(ImagePullFailed, match="malformed digest"):
        parse_document(json.dumps(bad).encode())


def test_image_config() -> None:
    doc = {
        "os": "linux",
        "architecture": "amd64",
        "config": {
            "Env": ["A=1", "B=x=y"],
            "Entrypoint": ["/entry", "a b"],
            "Cmd": ["--flag", "it's"],
            "ExposedPorts": {"80/tcp": {}, "53/udp": {}},
        },
        "rootfs": {"type": "layers", "diff_ids": [D1]},
    }
    facts = read_image_config(json.dumps(doc).encode())
    assert facts.platform == "linux/amd64" and facts.diff_ids == [D1]
    assert facts.config.env == {"A": "1", "B": "x=y"}
    assert facts.config.start_cmd == "/entry 'a b' --flag 'it'\"'\"'s'"
    assert facts.config.expose == (53, 80)
    assert facts.config.workdir == "/" and facts.config.user == "root"
    doc["config"] = {"Cmd": ["/bin/sh", "-c", "echo hi"]}
    assert read_image_config(json.dumps(doc).encode()).config.start_cmd == "/bin/sh -c 'echo hi'"
