"""The systemd units in packaging/systemd/ load cleanly (``systemd-analyze verify``) and say what the design needs:
sockets owned by systemd and named for the activation protocol, VMs that outlive the agent's process."""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO

UNITS = REPO / "packaging" / "systemd"
INSTALLED = "/opt/cryobox/venv/bin/cryobox"
"""Where the units expect cryobox (docs/deploy.md installs it there)."""


def _read(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(path.read_text())
    return parser


def test_every_unit_verifies_without_a_warning(tmp_path: Path) -> None:
    verify = shutil.which("systemd-analyze")
    assert verify is not None, "systemd-analyze comes with Debian's systemd (make setup installs it)"
    cryobox = Path(sys.executable).parent / "cryobox"
    assert cryobox.exists()
    names = sorted(path.name for path in UNITS.iterdir())
    assert set(names) == {
        f"cryobox{part}.{kind}" for part in ("", "-agent", "-control") for kind in ("service", "socket")
    }
    for name in names:  # the same units, pointing at this checkout's cryobox (verify checks the binary exists)
        (tmp_path / name).write_text((UNITS / name).read_text().replace(INSTALLED, str(cryobox)))
    done = subprocess.run(
        [verify, "verify", *(str(tmp_path / name) for name in names)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stderr == "" and done.stdout == "", (done.stdout, done.stderr)


def test_a_unit_with_a_mistake_is_caught(tmp_path: Path) -> None:
    """The check above can fail: ``verify`` exits 0 on a bad setting, but it says so."""
    verify = shutil.which("systemd-analyze")
    assert verify is not None
    broken = (UNITS / "cryobox.service").read_text().replace("KillMode=process", "KillMode=procss")
    (tmp_path / "cryobox.service").write_text(broken.replace(INSTALLED, str(Path(sys.executable).parent / "cryobox")))
    (tmp_path / "cryobox.socket").write_text((UNITS / "cryobox.socket").read_text())
    done = subprocess.run([verify, "verify", str(tmp_path / "cryobox.service")], capture_output=True, text=True)
    assert "kill mode" in done.stderr.lower()


@pytest.mark.parametrize("service", ["cryobox", "cryobox-agent"])
def test_vms_outlive_a_stop_of_the_host_services(service: str) -> None:
    unit = _read(UNITS / f"{service}.service")["Service"]
    assert unit["KillMode"] == "process"  # only the main process is signalled: QEMUs and the memory server stay
    assert unit["RuntimeDirectoryPreserve"] == "yes"  # /run/cryobox (owner records, slot claims) stays too
    assert INSTALLED in unit["ExecStart"]


@pytest.mark.parametrize("service", ["cryobox", "cryobox-agent", "cryobox-control"])
def test_each_service_takes_its_socket_from_systemd(service: str) -> None:
    socket_unit = _read(UNITS / f"{service}.socket")["Socket"]
    assert socket_unit["FileDescriptorName"] == "http"  # the name cryobox.compose.activation serves as plain HTTP
    assert int(socket_unit["Backlog"]) >= 1024  # room for the requests that wait through a restart
    assert f"{service}.socket" in _read(UNITS / f"{service}.service")["Unit"]["Requires"]
