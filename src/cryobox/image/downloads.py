"""Fetch a custom template's packages on the host without running any of them.

Debian packages: the host's ``apt-get --download-only``, resolved against the dpkg status of the base tree
(so only what the base lacks is fetched), with its own private state and source list; no maintainer script,
no hook of the tree and no chroot is involved. Wheels: the host's ``pip download --only-binary=:all:`` (a
wheel is unpacked, never executed, by pip; sdists, whose ``setup.py`` would run, are refused), plus pip's own
wheel, which the build VM runs from the zip (pip's documented bootstrap): the target needs no ``python3-pip``.
The host's own settings (proxy, CA bundle) apply to both. Installing happens in a build VM
(:mod:`cryobox.agent.templates.buildvm`).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from ..util.proc import Progress, Runner, run
from .specs import DEBIAN_SUITE

# Wheels that run on Debian 12 (glibc 2.36, CPython 3.11, x86_64): pure-Python and manylinux wheels.
WHEEL_PLATFORMS = ("manylinux_2_36_x86_64", "manylinux_2_28_x86_64", "manylinux2014_x86_64", "linux_x86_64")


def apt_options(work: Path, tree: Path) -> list[str]:
    """apt-get options that resolve against ``tree``'s dpkg status with state and caches under ``work``."""
    return [
        "-q",
        "-o",
        f"Dir::State={work / 'state'}",
        "-o",
        f"Dir::State::status={tree / 'var/lib/dpkg/status'}",
        "-o",
        f"Dir::Cache={work / 'cache'}",
        "-o",
        f"Dir::Etc::SourceList={work / 'sources.list'}",
        "-o",
        f"Dir::Etc::SourceParts={work / 'sources.list.d'}",
        "-o",
        "Dir::Etc::Preferences=/dev/null",
        "-o",
        f"Dir::Etc::PreferencesParts={work / 'preferences.d'}",
        "-o",
        "Debug::NoLocking=1",
        "-o",
        "APT::Install-Recommends=false",
        "-o",
        "APT::Architecture=amd64",
    ]


def download_debs(
    tree: Path, packages: tuple[str, ...], dest: Path, mirror: str, progress: Progress, runner: Runner = run
) -> list[Path]:
    """Download ``packages`` and every dependency ``tree`` lacks into ``dest``; return the ``.deb`` files."""
    work = dest.parent / f".{dest.name}.apt"
    for sub in ("state/lists/partial", "cache/archives/partial", "sources.list.d", "preferences.d"):
        (work / sub).mkdir(parents=True, exist_ok=True)
    (work / "sources.list").write_text(f"deb {mirror} {DEBIAN_SUITE} main\n")
    options = apt_options(work, tree)
    progress(f"apt-get download {' '.join(packages)} (on the host: nothing is installed here)")
    runner(["apt-get", *options, "update"], progress=lambda line: progress(f"apt: {line}"))
    runner(
        ["apt-get", *options, "-y", "install", "--download-only", *packages],
        progress=lambda line: progress(f"apt: {line}"),
    )
    dest.mkdir(parents=True, exist_ok=True)
    debs = [deb.rename(dest / deb.name) for deb in sorted((work / "cache" / "archives").glob("*.deb"))]
    shutil.rmtree(work)
    return debs  # empty when the base tree has every package already


def download_wheels(
    requirements: tuple[str, ...], dest: Path, progress: Progress, runner: Runner = run, *, deps: bool = True
) -> None:
    """Download wheels of ``requirements`` (and their dependencies) for the guest's Python into ``dest``.

    Packages that publish no wheel for the guest's platform are refused with pip's message.
    """
    progress(f"pip download {' '.join(requirements)} (on the host: nothing is installed here)")
    dest.mkdir(parents=True, exist_ok=True)
    platforms = [arg for platform in WHEEL_PLATFORMS for arg in ("--platform", platform)]
    runner(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--only-binary=:all:",
            "--python-version",
            "3.11",
            "--implementation",
            "cp",
            "--abi",
            "cp311",
            *platforms,
            "--dest",
            str(dest),
            *([] if deps else ["--no-deps"]),
            *requirements,
        ],
        progress=lambda line: progress(f"pip download: {line}"),
    )
