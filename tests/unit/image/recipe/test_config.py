"""The image defaults a recipe ends with: ENV/WORKDIR/USER folded over the base's, start command and ports."""

from __future__ import annotations

from cryobox.image.recipe.config import DEFAULT_PATH, final_config, states
from cryobox.image.recipe.model import Base, ImageConfig, Recipe, Step


def recipe(*steps: Step, start: str = "", expose: tuple[int, ...] = ()) -> Recipe:
    return Recipe(base=Base("debian", "bookworm"), steps=steps, start_cmd=start, expose=expose)


def test_each_step_runs_with_what_the_steps_before_it_said() -> None:
    r = recipe(
        Step("RUN", ("true",)),
        Step("ENV", ("A", "1", "B", "two words")),
        Step("WORKDIR", ("/srv",)),
        Step("WORKDIR", ("app",)),
        Step("USER", ("user",)),
        Step("RUN", ("id",)),
    )
    s = states(r, None)
    assert len(s) == 7
    assert s[0].to_json() == {"env": {"PATH": DEFAULT_PATH}, "workdir": "/", "user": "root"}
    assert s[5].to_json() == {
        "env": {"PATH": DEFAULT_PATH, "A": "1", "B": "two words"},
        "workdir": "/srv/app",
        "user": "user",
    }


def test_final_config_names_only_what_the_recipe_or_base_set() -> None:
    plain = final_config(recipe(Step("RUN", ("true",))), None)
    assert (plain.user, plain.workdir) == ("", "")  # the front door's default applies
    assert plain.env == {"PATH": DEFAULT_PATH}
    base = ImageConfig(
        env={"PATH": "/opt/bin", "LANG": "C"}, workdir="/data", user="app", start_cmd="serve", expose=(80,)
    )
    config = final_config(recipe(Step("ENV", ("X", "y")), expose=(8000,)), base)
    assert config.env == {"PATH": "/opt/bin", "LANG": "C", "X": "y"}
    assert (config.workdir, config.user, config.start_cmd, config.expose) == ("/data", "app", "serve", (80, 8000))
    assert final_config(recipe(start="python3 -m http.server"), base).start_cmd == "python3 -m http.server"
