"""E2B's TemplateBuildStartV2 bodies read into recipes: hand-written edge cases, and bodies the real SDK makes."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from cryobox.config import Paths
from cryobox.errors import InvalidArgument
from cryobox.image.recipe.e2bsteps import files_hashes, recipe_from_e2b
from cryobox.image.recipe.model import Base, Step
from tests.support.e2b import sdk_python

H1, H2 = "a" * 64, "b" * 64

SDK_SCRIPT = """
import json, sys
from e2b import Template, wait_for_port, wait_for_url
from e2b.api.client.models.template_build_start_v2 import TemplateBuildStartV2

ctx = sys.argv[1]

def body(t):
    tb = t._template  # what Template.build sends: trigger_build(..., _serialize(_instructions_with_hashes()))
    return TemplateBuildStartV2.from_dict(tb._serialize(tb._instructions_with_hashes())).to_dict()

a = (
    Template(file_context_path=ctx).from_debian_image("bookworm")
    .copy("app.py", "/app/", user="app", mode=0o755)
    .run_cmd(["echo a", "echo b"]).apt_install(["curl"]).pip_install("flask")
    .set_envs({"A": "1", "B": "x y"}).set_workdir("/app").set_user("app")
    .skip_cache().run_cmd("echo forced", user="root")
    .set_start_cmd("python -m http.server 8000", wait_for_port(8000))
)
b = Template(file_context_path=ctx).from_dockerfile(
    'FROM python:3.12\\nRUN pip install x\\nCOPY app.py /srv/\\nENV K=v\\nCMD ["python", "/srv/app.py"]\\n'
)
c = Template(file_context_path=ctx).from_template("my-base").set_start_cmd(
    "npm start", wait_for_url("http://localhost:3000/health")
)
print(json.dumps([body(a), body(b), body(c)]))
"""


@pytest.fixture(scope="module")
def sdk_bodies(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    ctx = tmp_path_factory.mktemp("e2bctx")
    (ctx / "app.py").write_text("print('hi')\n")
    out = subprocess.run(
        [str(sdk_python(Paths.from_env().cache_dir)), "-c", SDK_SCRIPT, str(ctx)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    bodies: list[dict[str, Any]] = json.loads(out.stdout)
    return bodies


def test_sdk_builder_body(sdk_bodies: list[dict[str, Any]]) -> None:
    body = sdk_bodies[0]
    recipe = recipe_from_e2b(body)
    files_hash = body["steps"][0]["filesHash"]
    assert recipe.base == Base("debian", "bookworm")
    assert recipe.steps == (
        Step("COPY", ("app.py", "/app/"), context=files_hash, chown="app", mode="0755", line=1),
        Step("RUN", ("echo a && echo b",), line=2),
        Step(
            "RUN",
            ("apt-get update && DEBIAN_FRONTEND=noninteractive DEBCONF_NOWARNINGS=yes apt-get install -y curl",),
            user="root",
            line=3,
        ),
        Step("RUN", ("pip install flask",), user="root", line=4),
        Step("ENV", ("A", "1", "B", "x y"), line=5),
        Step("WORKDIR", ("/app",), line=6),
        Step("USER", ("app",), line=7),
        Step("RUN", ("echo forced",), user="root", force=True, line=8),
    )
    assert recipe.start_cmd == "python -m http.server 8000"
    assert recipe.ready_cmd == '[ -n "$(ss -Htuln sport = :8000)" ]'
    assert not recipe.force
    assert files_hashes(body) == (files_hash,)


def test_sdk_from_dockerfile_body_wraps_user_and_workdir(sdk_bodies: list[dict[str, Any]]) -> None:
    recipe = recipe_from_e2b(sdk_bodies[1])
    assert recipe.base == Base("image", "python:3.12")
    assert [(s.line, s.op, s.args) for s in recipe.steps] == [
        (1, "USER", ("root",)),
        (2, "WORKDIR", ("/",)),
        (3, "RUN", ("pip install x",)),
        (4, "COPY", ("app.py", "/srv/")),
        (5, "ENV", ("K", "v")),
        (6, "USER", ("user",)),
        (7, "WORKDIR", ("/home/user",)),
    ]
    assert recipe.start_cmd == "python /srv/app.py"
    assert recipe.ready_cmd == "sleep 20"


def test_sdk_from_template_body(sdk_bodies: list[dict[str, Any]]) -> None:
    recipe = recipe_from_e2b(sdk_bodies[2])
    assert recipe.base == Base("template", "my-base")
    assert recipe.steps == ()
    assert recipe.ready_cmd.startswith("curl -s -o /dev/null")
    assert files_hashes(sdk_bodies[2]) == ()


def test_defaults_relative_workdir_and_force() -> None:
    recipe = recipe_from_e2b(
        {
            "fromImage": "e2bdev/base",
            "force": True,
            "steps": [
                {"type": "WORKDIR", "args": ["/srv"], "force": False},
                {"type": "WORKDIR", "args": ["app/../web"]},
                {"type": "COPY", "args": ["a", "b"], "filesHash": H1, "forceUpload": True, "resolveSymlinks": None},
                {"type": "COPY", "args": ["c", "d", "", ""], "filesHash": H2, "force": True},
                {"type": "COPY", "args": ["a", "e"], "filesHash": H1},
            ],
        }
    )
    assert recipe.base == Base("template", "base")
    assert recipe.force
    assert recipe.steps[1] == Step("WORKDIR", ("/srv/web",), line=2)
    assert recipe.steps[3] == Step("COPY", ("c", "d"), context=H2, force=True, line=4)
    assert recipe.contexts() == (H1, H2)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (
            {"fromImage": "x", "fromImageRegistry": {"type": "registry", "username": "u", "password": "p"}},
            "fromImageRegistry",
        ),
        ({"fromImage": "x", "cpuCount": 2}, "cpuCount"),
        ({"fromImage": "x", "fromTemplate": "y"}, "fromImage"),
        ({}, "fromImage"),
        ({"fromImage": "x", "steps": [{"type": "ARG", "args": ["a"]}]}, "type"),
        ({"fromImage": "x", "steps": [{"type": "RUN", "args": ["a"], "extra": 1}]}, "extra"),
        ({"fromImage": "x", "steps": [{"type": "RUN", "args": ["a", "b", "c"]}]}, "args"),
        ({"fromImage": "x", "steps": [{"type": "ENV", "args": ["a"]}]}, "args"),
        ({"fromImage": "x", "steps": [{"type": "COPY", "args": ["a", "b"]}]}, "filesHash"),
        ({"fromImage": "x", "steps": [{"type": "COPY", "args": ["a", "b"], "filesHash": "../x"}]}, "filesHash"),
        ({"fromImage": "x", "steps": [{"type": "COPY", "args": ["../a", "b"], "filesHash": H1}]}, "args"),
        ({"fromImage": "x", "steps": [{"type": "COPY", "args": ["a", "b", "", "rwx"], "filesHash": H1}]}, "args"),
        ({"fromImage": "x", "steps": [{"type": "USER", "args": [""]}]}, "args"),
        ({"fromImage": "x", "steps": [{"type": "RUN", "args": ["a"], "force": "yes"}]}, "force"),
        ({"fromImage": "x", "startCmd": 5}, "startCmd"),
    ],
)
def test_refusals_name_the_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        recipe_from_e2b(body)
    assert info.value.details["field"] == field
    assert field in info.value.message or field in ("fromImage", "args", "type")


def test_refused_step_names_its_1_based_index() -> None:
    body = {"fromImage": "x", "steps": [{"type": "RUN", "args": ["true"]}, {"type": "VOLUME", "args": ["/d"]}]}
    with pytest.raises(InvalidArgument) as info:
        recipe_from_e2b(body)
    assert info.value.details == {"field": "type", "step": 2}
    assert "'VOLUME'" in info.value.message
