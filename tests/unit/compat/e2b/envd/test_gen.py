"""The committed envd code under ``gen/`` is exactly what ``make proto`` generates from ``proto/``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import cryobox.compat.e2b.envd as envd

ENVD = Path(envd.__file__).parent
PROTOS = ["process/process.proto", "filesystem/filesystem.proto"]
INCLUDE = Path("/usr/include")


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def test_generated_code_matches_the_protos(tmp_path: Path) -> None:
    protoc = shutil.which("protoc")
    assert protoc is not None, "protoc is missing: `make setup` installs it (protobuf-compiler)"
    assert (INCLUDE / "google/protobuf/timestamp.proto").is_file(), "protoc's well-known types are missing"
    bin_dir = Path(sys.executable).parent
    for plugin in ("protoc-gen-py", "protoc-gen-connectrpc"):
        assert (bin_dir / plugin).is_file(), f"{plugin} is missing from {bin_dir}: `make venv` installs it"
    out = tmp_path / "gen"
    out.mkdir()
    subprocess.run(
        [protoc, "-I", "proto", "-I", str(INCLUDE), f"--py_out={out}", f"--connectrpc_out={out}", *PROTOS],
        cwd=ENVD,
        env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"},
        check=True,
        capture_output=True,
    )
    generated, committed = _files(out), _files(ENVD / "gen")
    assert sorted(generated) == sorted(committed)
    stale = [name for name in generated if generated[name] != committed[name]]
    assert stale == [], f"run `make proto`: {stale} differ from what the protos generate"
