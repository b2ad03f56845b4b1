"""``Recipe``'s JSON round trip with an ``archive`` base (the image's name kept), a recipe of any other base written
as before there were archives (no ``name`` key) and read from such JSON, and ``blobs()`` naming the archive."""

from __future__ import annotations

from cryobox.image.recipe.model import Base, Recipe, Step

SHA = "ab" * 32
CTX = "cd" * 32


def test_an_archive_base_round_trips_with_its_image_name() -> None:
    recipe = Recipe(base=Base("archive", SHA, "acme/app:1"), steps=(Step("COPY", ("a", "/a"), context=CTX),))
    data = recipe.to_json()
    assert data["base"] == {"kind": "archive", "ref": SHA, "name": "acme/app:1"}
    assert Recipe.from_json(data) == recipe
    assert recipe.blobs() == (SHA, CTX) and recipe.contexts() == (CTX,)


def test_other_bases_write_and_read_the_json_they_did_before() -> None:
    old = {"base": {"kind": "image", "ref": "busybox:1.36"}, "steps": []}
    recipe = Recipe.from_json(old)
    assert recipe.base == Base("image", "busybox:1.36") and recipe.base.name == ""
    assert recipe.to_json()["base"] == {"kind": "image", "ref": "busybox:1.36"}
    assert Recipe(base=Base("archive", SHA)).to_json()["base"] == {"kind": "archive", "ref": SHA}
    assert recipe.blobs() == ()
