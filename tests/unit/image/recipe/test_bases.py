"""Which base an image reference stands for."""

from __future__ import annotations

import pytest

from cryobox.image.recipe.bases import base_of
from cryobox.image.recipe.model import Base


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        ("debian:bookworm", Base("debian", "bookworm")),
        ("debian:12", Base("debian", "bookworm")),
        ("debian:bookworm-slim", Base("debian", "bookworm")),
        ("debian:12-slim", Base("debian", "bookworm")),
        ("debian:12.5", Base("debian", "bookworm")),
        ("debian:12.5-slim", Base("debian", "bookworm")),
        ("docker.io/library/debian:bookworm", Base("debian", "bookworm")),
        ("debian:trixie", Base("image", "debian:trixie")),
        ("debian", Base("image", "debian")),
        ("debian@sha256:" + "a" * 64, Base("image", "debian@sha256:" + "a" * 64)),
        ("e2bdev/base", Base("template", "base")),
        ("e2bdev/base:latest", Base("template", "base")),
        ("cryobox/python", Base("template", "python")),
        ("cryobox/python:latest", Base("template", "python")),
        ("scratch", Base("image", "scratch")),
        ("python:3.12", Base("image", "python:3.12")),
        ("ghcr.io/acme/app:1", Base("image", "ghcr.io/acme/app:1")),
        ("localhost:5000/debian:12", Base("image", "localhost:5000/debian:12")),
    ],
)
def test_base_of(ref: str, expected: Base) -> None:
    assert base_of(ref) == expected
