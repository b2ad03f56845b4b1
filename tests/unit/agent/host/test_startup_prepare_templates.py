"""``prepare_templates`` removes the bakes' per-agent cgroup directories once they are done, even when a bake
failed (the suite's leak check found them left behind when it had to bake)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from cryobox.agent.host import startup as platform
from cryobox.agent.vm import Accel
from cryobox.agent.vm.jail import JailSettings
from cryobox.config import Paths
from cryobox.image.specs import BASE, CODE_INTERPRETER


class Cgroups:
    def __init__(self) -> None:
        self.removed = 0

    def remove_base(self) -> None:
        self.removed += 1


@pytest.mark.parametrize("fails", [False, True])
def test_the_cgroup_base_goes_after_the_bakes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fails: bool) -> None:
    cgroups = Cgroups()
    monkeypatch.setattr(JailSettings, "for_tag", classmethod(lambda cls, tag: SimpleNamespace(cgroups=cgroups)))

    async def bake(config: Any, spec: Any, progress: Any, queue: Any = None) -> Any:
        if fails and spec.name == "code-interpreter":
            raise RuntimeError("bake failed")
        return SimpleNamespace(name=spec.name)

    monkeypatch.setattr(platform, "prepare_template", bake)
    config = platform.HostConfig(
        Paths(tmp_path / "d", tmp_path / "c"), accel=Accel.TCG, templates=(BASE, CODE_INTERPRETER)
    )
    if fails:
        with pytest.raises(RuntimeError):
            asyncio.run(platform.prepare_templates(config, print))
    else:
        assert set(asyncio.run(platform.prepare_templates(config, print))) == {"base", "code-interpreter"}
    assert cgroups.removed == 1
