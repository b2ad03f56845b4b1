"""Image references by Docker's normalisation rules."""

from __future__ import annotations

import pytest

from cryobox.errors import InvalidArgument
from cryobox.image.oci.reference import Reference, parse_reference

HEX = "a" * 64


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("busybox", Reference("docker.io", "library/busybox", "latest")),
        ("busybox:1.36", Reference("docker.io", "library/busybox", "1.36")),
        ("user/app", Reference("docker.io", "user/app", "latest")),
        ("docker.io/busybox", Reference("docker.io", "library/busybox", "latest")),
        ("index.docker.io/library/busybox:x", Reference("docker.io", "library/busybox", "x")),
        ("ghcr.io/org/team/app:v1", Reference("ghcr.io", "org/team/app", "v1")),
        ("localhost/app", Reference("localhost", "app", "latest")),
        ("localhost:5000/app:dev", Reference("localhost:5000", "app", "dev")),
        ("127.0.0.1:5000/a/b", Reference("127.0.0.1:5000", "a/b", "latest")),
        ("[::1]:5000/app", Reference("[::1]:5000", "app", "latest")),
        ("Registry/app", Reference("Registry", "app", "latest")),
        (f"busybox@sha256:{HEX}", Reference("docker.io", "library/busybox", None, f"sha256:{HEX}")),
        (f"r.io:443/a:t@sha256:{HEX}", Reference("r.io:443", "a", "t", f"sha256:{HEX}")),
        ("user/a-b__c.d", Reference("docker.io", "user/a-b__c.d", "latest")),
    ],
)
def test_parse(text: str, expected: Reference) -> None:
    assert parse_reference(text) == expected


def test_target_and_text() -> None:
    ref = parse_reference(f"r.io/a:t@sha256:{HEX}")
    assert ref.target == f"sha256:{HEX}" and str(ref) == f"r.io/a:t@sha256:{HEX}"
    assert parse_reference("busybox").target == "latest"
    assert parse_reference("busybox").api_host == "registry-1.docker.io"
    assert str(parse_reference("busybox")) == "docker.io/library/busybox:latest"


@pytest.mark.parametrize(
    "text",
    [
        "",
        " busybox",
        "Busybox",
        "app:",
        "app:-bad",
        "a//b",
        "app@sha256:abc",
        f"app@sha512:{HEX}",
        "r.io/",
        "-x/y",
        "a" * 256,
        "r..io/app",
        "app:" + "t" * 129,
    ],
)
def test_invalid(text: str) -> None:
    with pytest.raises(InvalidArgument):
        parse_reference(text)
