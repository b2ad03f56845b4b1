"""Template bake: the quiesce check refuses a guest with an established TCP connection."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from cryobox.agent.host.reclaim import find_own_qemus
from cryobox.agent.host.startup import machine_for
from cryobox.agent.net.bakenet import bake_network
from cryobox.agent.templates.bake import Template, TemplateBaker
from cryobox.agent.vm import detect_accel, host_tsc_khz
from cryobox.config import Paths
from cryobox.errors import StateError
from cryobox.image.builder import build_images
from cryobox.image.specs import BASE, TemplateSpec

HOLD_CONNECTION = (
    "setsid python3 -c '"
    "import socket, time\n"
    's = socket.socket(); s.bind(("127.0.0.1", 7000)); s.listen()\n'
    'c = socket.create_connection(("127.0.0.1", 7000)); a, _ = s.accept()\n'
    "time.sleep(3600)' </dev/null >/dev/null 2>&1 & sleep 3"
)


def test_bake_refuses_a_guest_holding_a_tcp_connection(
    tmp_path: Path, host_paths: Paths, templates: dict[str, Template]
) -> None:
    spec = TemplateSpec(name="refuse-test", packages=BASE.packages, warmup=(HOLD_CONNECTION,))
    images = build_images(host_paths.images_dir, spec, print)
    machine = machine_for(spec, images, detect_accel(), host_tsc_khz())
    templates_dir = tmp_path / "templates"
    run_dir = tmp_path / "r"  # unix socket paths must stay under 108 bytes
    baker = TemplateBaker(templates_dir, run_dir, print, bake_network)
    with pytest.raises(StateError, match="established TCP") as caught:
        asyncio.run(baker.bake(spec, images, machine))
    assert "127.0.0.1:7000" in " ".join(caught.value.details["connections"])
    assert list(templates_dir.iterdir()) == [], "a refused bake must leave no template files"
    assert find_own_qemus(run_dir) == []
    assert not [n for n in Path("/run/netns").iterdir() if n.name.startswith(f"cryobox-bake-{os.getpid()}-")]
