"""A recipe template is baked with its image defaults and the agent disk; one ``FROM`` a built-in template also
with that template's files and warm-up (``FROM cryobox/docker`` bakes ``dockerd`` alive)."""

from __future__ import annotations

from cryobox.agent.templates.startcmd import DEFAULTS_PATH, baked_spec
from cryobox.image.recipe.model import Base, ImageConfig, Recipe, Step
from cryobox.image.specs import DOCKER, TemplateSpec


def recipe_spec(base: Base) -> TemplateSpec:
    recipe = Recipe(base, (Step("RUN", ("true",)),))
    return TemplateSpec(name="mine", packages=(), recipe=recipe.to_json())


def test_a_recipe_from_the_docker_template_inherits_its_bake() -> None:
    baked = baked_spec(recipe_spec(Base("template", "docker")), ImageConfig(env={"A": "1"}))
    assert baked.warmup == DOCKER.warmup
    assert {path: baked.files[path] for path in DOCKER.files} == DOCKER.files
    assert '"A": "1"' in baked.files[DEFAULTS_PATH] and baked.agent_disk


def test_other_recipes_inherit_nothing() -> None:
    for base in (Base("debian", "bookworm"), Base("image", "busybox:1"), Base("template", "my-custom")):
        baked = baked_spec(recipe_spec(base), ImageConfig())
        assert baked.warmup == () and set(baked.files) == {DEFAULTS_PATH}, base
