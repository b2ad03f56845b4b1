"""Who a sandbox call is for: the sandbox (checked against its envd access token), its agent, and the guest user.

Every envd call names its sandbox in ``E2b-Sandbox-Id`` and proves access with ``X-Access-Token``
(:meth:`SandboxOpener.open`), or, for the file routes, with a signed URL (:mod:`..signing`). The guest user
comes from ``Authorization: Basic base64("<user>:")`` (RPCs) or the ``username`` query parameter (the file routes),
else the sandbox's default user (``user``, like E2B templates); names are passed through, the guest resolves them.
Relative paths resolve against that user's home, as envd does: ``~`` and ``~/x`` expand to it, ``x`` becomes
``<home>/x``, an empty path is the home itself.

A sandbox that is gone (deleted, lost, stopped, or paused) is :class:`SandboxUnavailable`: the SDK treats a
502/``unavailable`` whose message says "was not found" as "sandbox not running", exactly what E2B's proxy says.
"""

from __future__ import annotations

import base64
import binascii
import posixpath
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Protocol

from ....agentapi.interface import Agent
from ....errors import CryoboxError, InvalidArgument, NotFound, StateError
from ....netpolicy import EgressPolicy
from ..access import SANDBOX_HEADER, TOKEN_HEADER
from ..signing import FileSignature

DEFAULT_USER = "user"
USABLE_STATES = frozenset({"starting", "running"})
"""Row states in which the guest answers (a hibernated sandbox is woken by ``open`` before it gets here)."""
MAX_USER_LEN = 64


class SandboxUnavailable(CryoboxError):
    """The sandbox cannot take guest calls any more (deleted, lost, stopped, paused): a 502 / ``unavailable``
    whose message contains "was not found", which the E2B SDK maps to ``SandboxNotRunningException``."""

    code = "sandbox_unavailable"
    http_status = 502


class SandboxRowLike(Protocol):
    @property
    def status(self) -> str: ...

    @property
    def egress(self) -> EgressPolicy | None: ...


class SandboxOpener(Protocol):
    """What :class:`~cryobox.compat.e2b.access.SandboxAccess` offers: the row and agent of a sandbox once the
    token is its access token. :raises Unauthorized: no or a wrong token. :raises NotFound: no such sandbox."""

    def open(
        self,
        sandbox_id: str | None,
        token: str | None,
        *,
        wake: bool = True,
        traffic: bool = False,
        signed: FileSignature | None = None,
    ) -> Awaitable[tuple[SandboxRowLike, Agent]]:
        """``traffic``: a guest port's traffic, for which the sandbox's traffic token is enough; ``signed``: a file
        route's signed URL, which stands in for a missing token."""
        ...


def home_of(user: str) -> str:
    return "/root" if user == "root" else f"/home/{user}"


@dataclass(frozen=True)
class Target:
    """One call's sandbox, its agent and the guest user it runs as."""

    sandbox_id: str
    agent: Agent
    user: str
    named: bool = True
    """Whether the call named ``user`` (else it is the front door's default, and a process started without a
    user of its own runs as the image's ``USER`` when its template has one: ``default_user``)."""

    @property
    def home(self) -> str:
        return home_of(self.user)

    def resolve(self, path: str) -> str:
        """``path`` made absolute the way envd does it (relative to the user's home)."""
        if "\x00" in path:
            raise InvalidArgument("path contains a NUL byte", details={"path": path})
        if path == "~" or path.startswith("~/"):
            return posixpath.normpath(posixpath.join(self.home, path[2:]))
        if path.startswith("~"):
            raise InvalidArgument(f"cannot expand user-specific home dir in {path!r}", details={"path": path})
        if path.startswith("/"):
            return path
        return posixpath.normpath(posixpath.join(self.home, path))


def basic_auth_user(authorization: str | None) -> str | None:
    """The user named by ``Authorization: Basic base64("<user>:")``; ``None`` without one (another scheme, or
    one it cannot decode), like envd, which then uses the default user."""
    if not authorization:
        return None
    scheme, _, value = authorization.strip().partition(" ")
    if scheme.lower() != "basic" or not value:
        return None
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None  # envd: a header it cannot read names no user
    user = decoded.partition(":")[0]
    return user or None


def check_user(user: str) -> str:
    if len(user) > MAX_USER_LEN or "/" in user or "\x00" in user or user in (".", ".."):
        raise InvalidArgument(f"invalid username {user[:MAX_USER_LEN]!r}")
    return user


async def open_target(
    opener: SandboxOpener,
    headers: Mapping[str, str],
    *,
    user: str | None = None,
    default_user: str = DEFAULT_USER,
    wake: bool = True,
    signed: FileSignature | None = None,
) -> Target:
    """Check the call's token (or ``signed`` URL) and find its sandbox (``headers`` must look names up
    case-insensitively or be lower-cased). ``user`` overrides the ``Authorization`` header's user."""
    sandbox_id = headers.get(SANDBOX_HEADER)
    row, agent = await open_sandbox(opener, sandbox_id, headers.get(TOKEN_HEADER), wake=wake, signed=signed)
    if row.status not in USABLE_STATES:
        raise SandboxUnavailable(f"sandbox {sandbox_id} was not found running: it is {row.status}")
    named = user or basic_auth_user(headers.get("authorization"))
    name = named or default_user
    return Target(sandbox_id=str(sandbox_id), agent=agent, user=check_user(name), named=bool(named))


async def open_sandbox(
    opener: SandboxOpener,
    sandbox_id: str | None,
    token: str | None,
    *,
    wake: bool = True,
    traffic: bool = False,
    signed: FileSignature | None = None,
) -> tuple[SandboxRowLike, Agent]:
    """:meth:`SandboxOpener.open`, with a sandbox that is gone reported as :class:`SandboxUnavailable`."""
    try:
        return await opener.open(sandbox_id, token, wake=wake, traffic=traffic, signed=signed)
    except NotFound as err:
        raise SandboxUnavailable(f"sandbox {sandbox_id} was not found") from err
    except StateError as err:
        raise SandboxUnavailable(f"sandbox {sandbox_id} was not found running: {err.message}") from err
