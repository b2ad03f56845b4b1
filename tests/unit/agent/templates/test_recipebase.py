"""``resolve_base`` for an ``archive`` base, with the archive in a ``memory://`` store: a ``docker save`` tar and an
OCI layout tar (one image picked by name) come back as an image base (the empty filesystem, the layer tars in the
work directory, the image's config, a key that is an ``image`` base's for the same digest); the downloaded archive
is gone once read; a blob that does not hash to its name, a missing blob and no store at all fail."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import cast

import pytest

from cryobox.agent.templates.recipebase import BUILD_FORMAT, BaseImage, digest, resolve_base
from cryobox.errors import IntegrityError, ObjectNotFound, StateError
from cryobox.image.builder import ImageSet
from cryobox.image.recipe.model import Base, Recipe
from cryobox.objstore import keys
from cryobox.objstore.client import ObjectStore, open_store
from tests.support.oci import LayoutWriter, layout_tar, tar_bytes, write_docker_archive

FILES = {"etc/hello": b"hello\n"}
NO_OS_IMAGES = cast(ImageSet, object())
"""An ``archive`` base uses none of the host's OS images."""


def _stored(store: ObjectStore, archive: Path) -> str:
    data = archive.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    store.put(keys.build_context(sha), data)
    return sha


@pytest.fixture(scope="module")
def images_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One empty filesystem (``mkfs.ext4``) for the module's tests."""
    return tmp_path_factory.mktemp("images")


async def _resolve(tmp_path: Path, images_dir: Path, base: Base, store: ObjectStore | None) -> BaseImage:
    lines: list[str] = []
    return await resolve_base(
        Recipe(base=base),
        images_dir=images_dir,
        os_images=NO_OS_IMAGES,
        work=tmp_path / "work",
        template_rootfs=lambda _name: None,
        progress=lines.append,
        store=store,
    )


async def test_a_docker_save_archive_is_an_image_base(tmp_path: Path, images_dir: Path) -> None:
    store = open_store("memory://")
    archive = tmp_path / "busybox.tar"
    config = write_docker_archive(archive, [FILES], tags=["busybox:latest"], Cmd=["/bin/sh"], Env=["A=1"])
    sha = _stored(store, archive)
    base = await _resolve(tmp_path, images_dir, Base("archive", sha), store)
    assert base.key == digest(str(BUILD_FORMAT), "image", config)
    assert base.image.name == "rootfs.ext4" and base.image.is_file()
    assert base.layers is not None and [p.read_bytes() for p in base.layers] == [tar_bytes(FILES)]
    assert all(p.parent == tmp_path / "work" for p in base.layers)
    assert base.config is not None and base.config.start_cmd == "/bin/sh" and base.config.env["A"] == "1"
    assert sha[:12] in base.description and config in base.description
    assert not list((tmp_path / "work").glob("archive-*"))  # the downloaded archive, once read


async def test_an_oci_layout_tar_picks_the_named_image(tmp_path: Path, images_dir: Path) -> None:
    store = open_store("memory://")
    layout = LayoutWriter(tmp_path / "layout")
    layout.tag("other", layout.image([{"etc/other": b"x"}]))
    wanted = layout.image([FILES], Cmd=["/bin/app"])
    layout.tag("app", wanted)
    sha = _stored(store, layout_tar(layout.root, tmp_path / "layout.tar"))
    base = await _resolve(tmp_path, images_dir, Base("archive", sha, "app"), store)
    assert base.key == digest(str(BUILD_FORMAT), "image", wanted["digest"])
    assert base.layers is not None and [p.read_bytes() for p in base.layers] == [tar_bytes(FILES)]
    assert base.config is not None and base.config.start_cmd == "/bin/app"
    assert "(app)" in base.description


async def test_a_blob_unlike_its_name_a_missing_blob_and_no_store_fail(tmp_path: Path, images_dir: Path) -> None:
    store = open_store("memory://")
    archive = tmp_path / "a.tar"
    write_docker_archive(archive, [FILES], tags=["a:1"])
    wrong = "0" * 64
    store.put(keys.build_context(wrong), archive.read_bytes())
    with pytest.raises(IntegrityError):
        await _resolve(tmp_path, images_dir, Base("archive", wrong), store)
    with pytest.raises(ObjectNotFound):
        await _resolve(tmp_path, images_dir, Base("archive", "1" * 64), store)
    with pytest.raises(StateError, match="object store"):
        await _resolve(tmp_path, images_dir, Base("archive", wrong), None)
