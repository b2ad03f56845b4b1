"""Accounts of the TARGET image (never the build VM's): ``user[:group]`` resolution and ``ensure-user``.

Everything reads and edits ``/etc/passwd``, ``/etc/group`` and ``/etc/shadow`` inside the target as text (the image
may have no ``useradd``, or no account files at all: busybox and scratch images), resolved in the target root.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from .errors import BuildError
from .paths import resolve_in_root
from .writer import make_dirs, replace_text

Log = Callable[[str], None]
SANDBOX_NAME = "user"
SANDBOX_ID = 1000
SANDBOX_HOME = "/home/user"
MAX_ACCOUNT_FILE = 16 << 20


@dataclass(frozen=True)
class Account:
    name: str
    uid: int
    gid: int
    home: str
    shell: str


@dataclass(frozen=True)
class Group:
    name: str
    gid: int
    members: tuple[str, ...]


@dataclass(frozen=True)
class Identity:
    """Who a ``RUN`` runs as."""

    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str


def read_text(root: str, path: str) -> str | None:
    """A text file of the target (following links within it), or None when it is missing or not a regular file."""
    host = resolve_in_root(root, path, follow_final=True)
    if not os.path.isfile(host):
        return None
    with open(host, "rb") as handle:
        data = handle.read(MAX_ACCOUNT_FILE + 1)
    if len(data) > MAX_ACCOUNT_FILE:
        raise BuildError(f"{path} in the image is larger than {MAX_ACCOUNT_FILE} bytes")
    return data.decode("utf-8", "surrogateescape")


def _fields(text: str | None, count: int) -> list[list[str]]:
    rows = []
    for line in (text or "").splitlines():
        parts = line.split(":")
        if line.startswith("#") or len(parts) < count:
            continue
        rows.append(parts)
    return rows


def accounts(root: str) -> list[Account]:
    found = []
    for parts in _fields(read_text(root, "/etc/passwd"), 7):
        if parts[2].isdigit() and parts[3].isdigit():
            found.append(Account(parts[0], int(parts[2]), int(parts[3]), parts[5], parts[6]))
    return found


def groups(root: str) -> list[Group]:
    found = []
    for parts in _fields(read_text(root, "/etc/group"), 4):
        if parts[2].isdigit():
            found.append(Group(parts[0], int(parts[2]), tuple(m for m in parts[3].split(",") if m)))
    return found


def _account(root: str, name: str) -> Account | None:
    table = accounts(root)
    for account in table:
        if account.name == name:
            return account
    if name.isdigit():
        for account in table:
            if account.uid == int(name):
                return account
    return None


def _gid(root: str, name: str, spec: str) -> int:
    for group in groups(root):
        if group.name == name:
            return group.gid
    if name.isdigit():
        return int(name)
    raise BuildError(f"unable to find group {name!r} (from {spec!r}) in the image's /etc/group")


def resolve_user(root: str, spec: str) -> Identity:
    """``user[:group]`` (names or numbers) as a ``RUN`` sees it, like Docker: a number the image does not know is
    taken as it is (group 0, home ``/``); a name must exist. Supplementary groups from the image's ``/etc/group``."""
    user, _, group = (spec or "root").partition(":")
    account = _account(root, user)
    if account is None:
        if not user.isdigit():
            raise BuildError(f"unable to find user {user!r} in the image's /etc/passwd")
        account = Account(user, int(user), 0, "/", "/bin/sh")
    gid = _gid(root, group, spec) if group else account.gid
    extra = [g.gid for g in groups(root) if account.name in g.members]
    return Identity(account.uid, gid, tuple(dict.fromkeys([gid, *extra])), account.home or "/")


def resolve_owner(root: str, spec: str) -> tuple[int, int]:
    """``COPY --chown`` (``user[:group]``): a named user's primary group, else the same number as the uid."""
    user, _, group = spec.partition(":")
    account = _account(root, user)
    if account is None:
        if not user.isdigit():
            raise BuildError(f"unable to find user {user!r} (--chown={spec}) in the image's /etc/passwd")
        uid, gid = int(user), int(user)
    else:
        uid, gid = account.uid, account.gid
    return uid, _gid(root, group, spec) if group else gid


def _append(text: str | None, lines: list[str]) -> str:
    body = text or ""
    if body and not body.endswith("\n"):
        body += "\n"
    return body + "".join(f"{line}\n" for line in lines)


def _write(root: str, path: str, text: str, mode: int) -> None:
    host = resolve_in_root(root, path)
    make_dirs(root, os.path.dirname(host))
    keep = os.lstat(host) if os.path.isfile(host) and not os.path.islink(host) else None
    if keep is not None:
        replace_text(host, text, keep.st_mode, keep.st_uid, keep.st_gid)
    else:
        replace_text(host, text, mode)


def _shell(root: str) -> str:
    return "/bin/bash" if os.path.exists(resolve_in_root(root, "/bin/bash", follow_final=True)) else "/bin/sh"


def ensure_user(root: str, log: Log) -> None:
    """``root`` (uid 0) and ``user`` (uid = gid = 1000, home ``/home/user``) exist in the target; idempotent.

    An existing ``user`` entry is kept as it is (the image's choice; a different uid is logged), and another
    account on uid 1000 (``node``, ``ubuntu``) is left alone: ``user`` then shares the uid.
    """
    shell = _shell(root)
    names = {a.name: a for a in accounts(root)}
    new_passwd = []
    if "root" not in names:
        new_passwd.append(f"root:x:0:0:root:/root:{shell}")
    if SANDBOX_NAME not in names:
        new_passwd.append(f"{SANDBOX_NAME}:x:{SANDBOX_ID}:{SANDBOX_ID}::{SANDBOX_HOME}:{shell}")
    elif names[SANDBOX_NAME].uid != SANDBOX_ID:
        log(f"the image's account {SANDBOX_NAME!r} has uid {names[SANDBOX_NAME].uid}, kept as it is")
    if new_passwd:
        _write(root, "/etc/passwd", _append(read_text(root, "/etc/passwd"), new_passwd), 0o644)
    group_names = {g.name for g in groups(root)}
    wanted = (("root", 0), (SANDBOX_NAME, SANDBOX_ID))
    new_groups = [f"{name}:x:{gid}:" for name, gid in wanted if name not in group_names]
    if new_groups:
        _write(root, "/etc/group", _append(read_text(root, "/etc/group"), new_groups), 0o644)
    shadow = read_text(root, "/etc/shadow")
    if shadow is not None:
        shadowed = {parts[0] for parts in _fields(shadow, 2)}
        lines = [f"{n}:{p}:19000:0:99999:7:::" for n, p in (("root", "*"), (SANDBOX_NAME, "!")) if n not in shadowed]
        if lines:
            _write(root, "/etc/shadow", _append(shadow, lines), 0o640)
    account = {a.name: a for a in accounts(root)}[SANDBOX_NAME]
    homes = (("/root", 0, 0, 0o700), (account.home or SANDBOX_HOME, account.uid, account.gid, 0o755))
    for home, uid, gid, mode in homes:
        host = resolve_in_root(root, home, follow_final=True)
        if not os.path.lexists(host):
            make_dirs(root, host, 0, 0, 0o755)
            os.chown(host, uid, gid)
            os.chmod(host, mode)
    if new_passwd or new_groups:
        log(f"accounts: added {', '.join(line.split(':')[0] for line in new_passwd + new_groups)}")


__all__ = [
    "Account",
    "Group",
    "Identity",
    "accounts",
    "ensure_user",
    "groups",
    "read_text",
    "resolve_owner",
    "resolve_user",
]
