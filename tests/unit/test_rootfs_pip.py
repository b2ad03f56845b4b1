"""pip packages for custom templates: downloaded by the host (its proxy and CA), installed offline in the tree."""

from __future__ import annotations

import sys
from pathlib import Path

from cryobox.image.rootfs import pip_install


def test_host_downloads_wheels_then_the_tree_installs_them_offline(tmp_path: Path) -> None:
    calls: list[list[str]] = []

    def runner(argv: list[str], **_: object) -> str:
        calls.append(list(argv))
        if "download" in argv:
            assert (tmp_path / "tmp" / "cryobox-wheels").is_dir()
        return ""

    pip_install(tmp_path, ("pytest", "requests==2.32.3"), lambda _line: None, runner)  # type: ignore[arg-type]
    download, install = calls
    assert download[:4] == [sys.executable, "-m", "pip", "download"]
    assert "--only-binary=:all:" in download and download[-2:] == ["pytest", "requests==2.32.3"]
    assert download[download.index("--abi") + 1] == "cp311"
    assert install[:2] == ["chroot", str(tmp_path)]
    assert "--no-index" in install and install[install.index("--find-links") + 1] == "/tmp/cryobox-wheels"
    assert not (tmp_path / "tmp" / "cryobox-wheels").exists()  # the wheels do not stay in the image
