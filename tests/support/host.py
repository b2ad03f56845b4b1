"""The host the VM suites share per session (pytest-xdist worker): the image cache, a data dir and the templates
prepared in it (built and baked once, cached across runs). Bound into ``tests/integration/conftest.py`` and
``tests/chaos/conftest.py``, each suite's fixtures of its own."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from cryobox.agent.host.startup import HostConfig, prepare_templates
from cryobox.agent.templates.bake import Template
from cryobox.config import Paths


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    return Path(os.environ.get("CRYOBOX_CACHE_DIR", "/var/cache/cryobox"))


@pytest.fixture(scope="session")
def host_paths(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Paths:
    paths = Paths(data_dir=tmp_path_factory.mktemp("host"), cache_dir=cache_dir)
    paths.ensure()
    return paths


@pytest.fixture(scope="session")
def templates(host_paths: Paths) -> dict[str, Template]:
    return asyncio.run(prepare_templates(HostConfig(paths=host_paths), print))
