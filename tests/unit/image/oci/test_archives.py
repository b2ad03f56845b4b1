"""``archive_kind`` and ``load_archive``: a legacy ``docker save`` tar and a tar of an OCI layout (``./`` names)
recognised by their members and loaded into the same layer tars; archives of several images (``docker save``, an
OCI layout) read by name; a tar
that is neither, and a file that is no tar, refused."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from cryobox.errors import ImagePullFailed
from cryobox.image.oci import ImageLimits, archive_kind, load_archive
from tests.support.oci import (
    LayoutWriter,
    digest,
    layout_tar,
    merge_docker_archives,
    tar_bytes,
    write_docker_archive,
)

ONE = {"etc/one": b"one\n"}
TWO = {"etc/two": b"two\n"}


def _layer_bytes(layers: list[Path]) -> list[bytes]:
    return [layer.read_bytes() for layer in layers]


def test_a_docker_save_archive_is_recognised_and_loaded(tmp_path: Path) -> None:
    archive = tmp_path / "app.tar"
    config = write_docker_archive(archive, [ONE, TWO], tags=["acme/app:1"], Cmd=["/bin/true"])
    assert archive_kind(archive) == "docker-save"
    image = load_archive(archive, tmp_path / "out", limits=ImageLimits(), progress=lambda _: None)
    assert image.digest == config and _layer_bytes(image.layers) == [tar_bytes(ONE), tar_bytes(TWO)]
    assert image.config.start_cmd == "/bin/true"
    named = load_archive(archive, tmp_path / "out2", limits=ImageLimits(), progress=lambda _: None, ref="acme/app:1")
    assert named.digest == config
    with pytest.raises(ImagePullFailed, match="no image tagged"):
        load_archive(archive, tmp_path / "out3", limits=ImageLimits(), progress=lambda _: None, ref="acme/app:2")


def test_a_docker_save_archive_of_two_images_is_read_by_tag(tmp_path: Path) -> None:
    write_docker_archive(tmp_path / "a.tar", [ONE], tags=["a:1"])
    other = write_docker_archive(tmp_path / "b.tar", [TWO], tags=["b:2"])
    both = merge_docker_archives(tmp_path / "both.tar", [tmp_path / "a.tar", tmp_path / "b.tar"])
    with pytest.raises(ImagePullFailed, match="holds 2 images"):
        load_archive(both, tmp_path / "out", limits=ImageLimits(), progress=lambda _: None)
    image = load_archive(both, tmp_path / "out", limits=ImageLimits(), progress=lambda _: None, ref="b:2")
    assert image.digest == other and _layer_bytes(image.layers) == [tar_bytes(TWO)]


def test_an_oci_layout_tar_is_recognised_and_picks_an_image_by_name(tmp_path: Path) -> None:
    layout = LayoutWriter(tmp_path / "layout")
    first = layout.image([ONE], Cmd=["/bin/one"])
    second = layout.image([ONE, TWO], compression="zstd", Cmd=["/bin/two"])
    layout.tag("1.0", first)
    layout.tag("2.0", second)
    archive = layout_tar(layout.root, tmp_path / "layout.tar")
    assert archive_kind(archive) == "oci-layout"
    with pytest.raises(ImagePullFailed, match="holds 2 images"):
        load_archive(archive, tmp_path / "out", limits=ImageLimits(), progress=lambda _: None)
    image = load_archive(archive, tmp_path / "out", limits=ImageLimits(), progress=lambda _: None, ref="2.0")
    assert image.digest == second["digest"] and image.config.start_cmd == "/bin/two"
    assert _layer_bytes(image.layers) == [tar_bytes(ONE), tar_bytes(TWO)]
    assert image.diff_ids == [digest(tar_bytes(ONE)), digest(tar_bytes(TWO))]


def test_other_files_are_refused(tmp_path: Path) -> None:
    plain = tmp_path / "plain.tar"
    plain.write_bytes(tar_bytes({"etc/hosts": b"x"}))
    with pytest.raises(ImagePullFailed, match="not an image archive"):
        archive_kind(plain)
    nested = tmp_path / "nested.tar"
    with tarfile.open(nested, "w") as tar:
        tar.add(plain, arcname="image/manifest.json.not")
    with pytest.raises(ImagePullFailed, match="not an image archive"):
        archive_kind(nested)
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"not a tar at all" * 100)
    with pytest.raises(ImagePullFailed, match="not a readable tar"):
        archive_kind(junk)
