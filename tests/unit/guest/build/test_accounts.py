"""ensure-user on images with and without account files; user[:group] resolved in the target's files."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from cryobox.guest.build.accounts import Identity, ensure_user, resolve_owner, resolve_user
from cryobox.guest.build.errors import BuildError

DEBIAN_PASSWD = "root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n"
DEBIAN_GROUP = "root:x:0:\ndaemon:x:1:\naudio:x:29:app\n"


def write(root: Path, path: str, text: str, mode: int = 0o644) -> None:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    target.chmod(mode)


def test_an_image_without_account_files_gets_minimal_ones(tmp_path: Path) -> None:
    logs: list[str] = []
    ensure_user(str(tmp_path), logs.append)
    assert (tmp_path / "etc" / "passwd").read_text() == (
        "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n"
    )
    assert (tmp_path / "etc" / "group").read_text() == "root:x:0:\nuser:x:1000:\n"
    assert not (tmp_path / "etc" / "shadow").exists()
    home = os.stat(tmp_path / "home" / "user")
    assert (home.st_uid, home.st_gid, stat.S_IMODE(home.st_mode)) == (1000, 1000, 0o755)
    assert stat.S_IMODE(os.stat(tmp_path / "root").st_mode) == 0o700
    assert logs and "added root, user" in logs[0]


def test_an_existing_debian_image_gains_user_with_bash_and_shadow(tmp_path: Path) -> None:
    write(tmp_path, "/etc/passwd", DEBIAN_PASSWD)
    write(tmp_path, "/etc/group", DEBIAN_GROUP)
    write(tmp_path, "/etc/shadow", "root:*:19000:0:99999:7:::\ndaemon:*:19000:0:99999:7:::", 0o640)
    os.chown(tmp_path / "etc" / "shadow", 0, 42)
    write(tmp_path, "/bin/bash", "", 0o755)
    ensure_user(str(tmp_path), lambda _: None)
    assert (tmp_path / "etc" / "passwd").read_text() == DEBIAN_PASSWD + "user:x:1000:1000::/home/user:/bin/bash\n"
    assert (tmp_path / "etc" / "group").read_text() == DEBIAN_GROUP + "user:x:1000:\n"
    shadow = tmp_path / "etc" / "shadow"
    assert shadow.read_text().endswith("daemon:*:19000:0:99999:7:::\nuser:!:19000:0:99999:7:::\n")
    st = os.stat(shadow)
    assert (stat.S_IMODE(st.st_mode), st.st_gid) == (0o640, 42)  # the image's mode and group kept


def test_ensure_user_is_idempotent(tmp_path: Path) -> None:
    write(tmp_path, "/etc/passwd", DEBIAN_PASSWD)
    write(tmp_path, "/etc/group", DEBIAN_GROUP)
    ensure_user(str(tmp_path), lambda _: None)
    first = {p: (tmp_path / "etc" / p).read_text() for p in ("passwd", "group")}
    logs: list[str] = []
    ensure_user(str(tmp_path), logs.append)
    assert {p: (tmp_path / "etc" / p).read_text() for p in ("passwd", "group")} == first
    assert logs == []


def test_an_existing_user_account_and_a_symlinked_passwd(tmp_path: Path) -> None:
    write(tmp_path, "/usr/share/base-passwd", "root:x:0:0:root:/root:/bin/sh\nuser:x:1001:1001::/srv/u:/bin/sh\n")
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "passwd").symlink_to("/usr/share/base-passwd")  # read through the link, in the root
    write(tmp_path, "/etc/group", "root:x:0:\nuser:x:1001:\n")
    logs: list[str] = []
    ensure_user(str(tmp_path), logs.append)
    assert (tmp_path / "etc" / "passwd").is_symlink()  # nothing to add: not rewritten
    assert any("uid 1001, kept" in line for line in logs)
    assert os.stat(tmp_path / "srv" / "u").st_uid == 1001


def test_resolve_user_by_name_number_and_group(tmp_path: Path) -> None:
    write(tmp_path, "/etc/passwd", DEBIAN_PASSWD + "app:x:1234:1235:App:/home/app:/bin/sh\n")
    write(tmp_path, "/etc/group", DEBIAN_GROUP + "app:x:1235:\nstaff:x:50:\n")
    assert resolve_user(str(tmp_path), "app") == Identity(1234, 1235, (1235, 29), "/home/app")
    assert resolve_user(str(tmp_path), "1234:staff") == Identity(1234, 50, (50, 29), "/home/app")
    assert resolve_user(str(tmp_path), "") == Identity(0, 0, (0,), "/root")
    assert resolve_user(str(tmp_path), "4242:77") == Identity(4242, 77, (77,), "/")  # unknown numbers as they are
    with pytest.raises(BuildError, match="unable to find user 'nobody-here'"):
        resolve_user(str(tmp_path), "nobody-here")
    with pytest.raises(BuildError, match="unable to find group 'wheel'"):
        resolve_user(str(tmp_path), "app:wheel")


def test_resolve_owner_uses_the_target_files_not_the_hosts(tmp_path: Path) -> None:
    write(tmp_path, "/etc/passwd", "root:x:0:0::/root:/bin/sh\nwww-data:x:7000:7001::/var/www:/bin/sh\n")
    write(tmp_path, "/etc/group", "root:x:0:\nweb:x:7002:\n")
    assert resolve_owner(str(tmp_path), "www-data") == (7000, 7001)
    assert resolve_owner(str(tmp_path), "www-data:web") == (7000, 7002)
    assert resolve_owner(str(tmp_path), "55") == (55, 55)
    assert resolve_owner(str(tmp_path), "55:66") == (55, 66)
    with pytest.raises(BuildError):
        resolve_owner(str(tmp_path), "daemon")  # the host has one; the image does not
