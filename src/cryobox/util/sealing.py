"""Sealing small secrets at rest: a sandbox's ``env`` in the registry and in an agent's durable records.

A :class:`Sealer` turns a ``dict[str, str]`` into an opaque ASCII token and back. The token is a Fernet token
(``cryptography``: AES-128-CBC with a random IV, then HMAC-SHA256 over version, timestamp, IV and ciphertext), so
a wrong key and a changed byte are both detected. A token that no key opens raises
:class:`~cryobox.errors.SecretUnreadable`: never an empty dict instead.

Keys (:meth:`Sealer.load`): ``CRYOBOX_SECRET_KEY`` when set, one or more Fernet keys (url-safe base64 of 32
random bytes, 44 characters, as ``Fernet.generate_key()`` makes them) separated by commas; the first seals and
every one opens (rotation: put the new key first, keep the old one after it; values are re-sealed with the new
key only when they are next written). Otherwise a key file, read (or
created) at first use, so a sealer can be built before its directory exists: created mode 0600 in a 0700
directory, written aside (``O_EXCL``) and hard-linked into place, so concurrent first users agree on one key
and nobody ever reads a half-written one.

Values stored before sealing existed are plain ``dict``s; :meth:`Sealer.open_stored` still reads them (the
caller re-seals them on its next write).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TypeGuard

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from ..errors import InvalidArgument, SecretUnreadable
from .files import fsync_dir

log = logging.getLogger(__name__)

SECRET_KEY_ENV = "CRYOBOX_SECRET_KEY"
KEY_FILE_MODE = 0o600
KEY_DIR_MODE = 0o700


def generate_key() -> str:
    """A new random key, in the format of ``CRYOBOX_SECRET_KEY`` and of key files."""
    return Fernet.generate_key().decode("ascii")


def _parse_keys(text: str, source: str) -> list[Fernet]:
    """Keys separated by commas or whitespace (url-safe base64 has neither)."""
    entries = [entry for entry in re.split(r"[,\s]+", text) if entry]
    if not entries:
        raise InvalidArgument(f"{source} holds no key", details={"source": source})
    keys = []
    for index, entry in enumerate(entries, start=1):
        try:
            keys.append(Fernet(entry.encode("ascii")))
        except (ValueError, UnicodeEncodeError):  # never echo the value: it is (meant to be) a secret
            raise InvalidArgument(
                f"{source}: key {index} is not a Fernet key (44 characters of url-safe base64 of 32 bytes)",
                details={"source": source},
            ) from None
    return keys


def _mac_keys(text: str) -> list[bytes]:
    """The raw 32 bytes of each key (already validated by :func:`_parse_keys`)."""
    return [base64.urlsafe_b64decode(entry) for entry in re.split(r"[,\s]+", text) if entry]


def read_or_create_key_file(path: Path) -> str:
    """The key in ``path``; a new one if there is no such file (created atomically, mode 0600)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return _create_key_file(path)
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        log.warning("key file %s is readable by others (mode %o); it should be %o", path, mode, KEY_FILE_MODE)
    return text


def _create_key_file(path: Path) -> str:
    path.parent.mkdir(mode=KEY_DIR_MODE, parents=True, exist_ok=True)
    key = generate_key()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, KEY_FILE_MODE)
    try:
        os.fchmod(fd, KEY_FILE_MODE)  # whatever the umask
        with os.fdopen(fd, "w") as fh:
            fh.write(key + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)  # atomic and exclusive: fails if a concurrent first user won
        except FileExistsError:
            return path.read_text()
        fsync_dir(path.parent)
        log.info("created key file %s", path)
        return key
    finally:
        tmp.unlink(missing_ok=True)


def _tag(key: bytes, purpose: str, message: str) -> str:
    derived = hmac.new(key, f"cryobox-mac/{purpose}".encode(), hashlib.sha256).digest()
    digest = hmac.new(derived, message.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def _is_str_mapping(value: object) -> TypeGuard[dict[str, str]]:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


class Sealer:
    """Seals and opens ``dict[str, str]`` values with one key set; thread-safe. Build one with :meth:`load`,
    :meth:`from_keys`, :meth:`from_key_file`, :meth:`ephemeral` or :meth:`keyless`."""

    def __init__(
        self,
        source: str,
        *,
        keys: list[Fernet] | None = None,
        key_file: Path | None = None,
        mac_keys: list[bytes] | None = None,
    ) -> None:
        self._source = source
        self._keys = MultiFernet(keys) if keys else None
        self._macs = mac_keys
        self._key_file = key_file
        self._lock = threading.Lock()

    @classmethod
    def from_keys(cls, text: str, source: str = SECRET_KEY_ENV) -> Sealer:
        """Comma-separated keys (checked now): the first seals, every one opens."""
        return cls(source, keys=_parse_keys(text, source), mac_keys=_mac_keys(text))

    @classmethod
    def from_key_file(cls, path: Path) -> Sealer:
        """The key in ``path``, read or created at first use."""
        return cls(f"key file {path}", key_file=path)

    @classmethod
    def ephemeral(cls) -> Sealer:
        """A random key that lives as long as this object (for data that does not outlive the process)."""
        key = Fernet.generate_key()
        return cls("an ephemeral key", keys=[Fernet(key)], mac_keys=[base64.urlsafe_b64decode(key)])

    @classmethod
    def keyless(cls, why: str) -> Sealer:
        """A sealer without a key: every use raises :class:`InvalidArgument` saying ``why``."""
        return cls(f"no key ({why})")

    @classmethod
    def load(cls, key_file: Path | None, env: Mapping[str, str] | None = None, *, why: str = "") -> Sealer:
        """``CRYOBOX_SECRET_KEY`` from ``env`` (default ``os.environ``) if set, else ``key_file``, else keyless."""
        env = os.environ if env is None else env
        configured = env.get(SECRET_KEY_ENV, "")
        if configured.strip():
            return cls.from_keys(configured)
        if key_file is not None:
            return cls.from_key_file(key_file)
        return cls.keyless(why or f"set {SECRET_KEY_ENV}")

    @property
    def source(self) -> str:
        """Where the key comes from (never the key itself)."""
        return self._source

    def __repr__(self) -> str:
        return f"Sealer({self._source})"

    def _multi(self) -> MultiFernet:
        with self._lock:
            if self._keys is None:
                if self._key_file is None:
                    raise InvalidArgument(
                        f"cannot seal or open secrets: {self._source}", details={"source": self._source}
                    )
                text = read_or_create_key_file(self._key_file)
                self._keys = MultiFernet(_parse_keys(text, self._source))
                self._macs = _mac_keys(text)
            return self._keys

    def _mac_key_list(self) -> list[bytes]:
        self._multi()
        assert self._macs is not None
        return self._macs

    def mac(self, purpose: str, message: str) -> str:
        """A stable tag of ``message`` for ``purpose`` (HMAC-SHA256 under a key derived from the first key), url-safe
        base64 without padding: a bearer secret anyone holding the key can recompute, nobody else can forge."""
        return _tag(self._mac_key_list()[0], purpose, message)

    def macs(self, purpose: str, message: str) -> list[str]:
        """:meth:`mac` of ``message`` under every key, the sealing key's first: what a secret derived from a tag
        (a signature made with it) is checked against while an old key is still listed."""
        return [_tag(key, purpose, message) for key in self._mac_key_list()]

    def verify_mac(self, purpose: str, message: str, tag: str) -> bool:
        """Whether ``tag`` is :meth:`mac` of ``message`` under any of the keys (constant time per key)."""
        given = tag.encode("ascii", "replace")
        return any(hmac.compare_digest(_tag(k, purpose, message).encode(), given) for k in self._mac_key_list())

    def seal(self, values: Mapping[str, str]) -> str:
        """An opaque ASCII token holding ``values``."""
        blob = json.dumps(dict(values), sort_keys=True, separators=(",", ":")).encode()
        return self._multi().encrypt(blob).decode("ascii")

    def open(self, token: str, *, what: str = "sealed value") -> dict[str, str]:
        """The values sealed into ``token``.

        :raises SecretUnreadable: no key opens it (sealed with another key, or tampered with).
        """
        keys = self._multi()
        try:
            blob = keys.decrypt(token.encode("ascii"))
        except (InvalidToken, UnicodeEncodeError):
            raise SecretUnreadable(
                f"{what} cannot be opened with {self._source}: it was sealed with another key (was "
                f"{SECRET_KEY_ENV} or the key file changed?) or it was tampered with",
                details={"what": what},
            ) from None
        try:
            values = json.loads(blob)
        except ValueError:
            values = None
        if not _is_str_mapping(values):
            raise SecretUnreadable(f"{what} does not hold a string mapping", details={"what": what})
        return dict(values)

    def open_stored(self, stored: object, *, what: str = "sealed value") -> dict[str, str]:
        """A stored value: a token (:meth:`open`), or a plain mapping written before sealing existed (copied)."""
        if isinstance(stored, str):
            return self.open(stored, what=what)
        if _is_str_mapping(stored):
            return dict(stored)
        raise SecretUnreadable(
            f"{what} is neither sealed nor a string mapping ({type(stored).__name__})", details={"what": what}
        )
