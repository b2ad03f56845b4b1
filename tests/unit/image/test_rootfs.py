"""Every image carries the unprivileged ``user`` account (E2B's default user) with its home."""

from __future__ import annotations

from pathlib import Path

from cryobox.image.rootfs import SANDBOX_USER, add_user


def test_add_user_writes_the_account_once(tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (etc / "group").write_text("root:x:0:\n")
    (etc / "shadow").write_text("root:*:19000:0:99999:7:::\n")
    (etc / "shadow").chmod(0o640)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "bash").touch()
    add_user(tmp_path, *SANDBOX_USER)
    add_user(tmp_path, *SANDBOX_USER)  # idempotent
    assert (etc / "passwd").read_text().splitlines()[1:] == ["user:x:1000:1000::/home/user:/bin/bash"]
    assert (etc / "group").read_text().splitlines()[1:] == ["user:x:1000:"]
    assert [line.split(":")[0] for line in (etc / "shadow").read_text().splitlines()] == ["root", "user"]
    assert (etc / "shadow").stat().st_mode & 0o777 == 0o640
    home = tmp_path / "home" / "user"
    assert home.is_dir() and (home.stat().st_uid, home.stat().st_gid) == (1000, 1000)
