"""A Dockerfile read into a :class:`~cryobox.image.recipe.model.Recipe` (:func:`parse_dockerfile`).

One stage, the instructions a build VM can run: ``FROM``, ``ARG``, ``ENV``, ``RUN``, ``COPY``, ``ADD`` (local
files that are not archives: as ``COPY``), ``WORKDIR``, ``USER``, ``SHELL``, ``EXPOSE`` (TCP), ``LABEL``,
``MAINTAINER``, ``CMD``, ``ENTRYPOINT`` and ``HEALTHCHECK``. Everything else (``VOLUME``, ``ONBUILD``,
``STOPSIGNAL``, multi-stage builds, ``RUN --mount``, heredocs, remote ``ADD``…) is refused with an
:class:`~cryobox.errors.InvalidArgument` naming the instruction and its line: nothing is silently ignored.

* Variables are substituted as Docker does (:mod:`.shellwords`) in ``FROM`` (the ``ARG``\\ s before it),
  ``ENV``, ``ARG``, ``WORKDIR``, ``USER``, ``COPY``/``ADD``, ``EXPOSE`` and ``LABEL``; never in ``RUN``, ``CMD`` or
  ``ENTRYPOINT`` (the shell does that). The values in scope are the ``ARG``\\ s (``build_args`` override their
  defaults) and the ``ENV``\\ s (which win over an ``ARG`` of the same name), on top of ``base_env``: what the
  base image's configuration sets (by default only ``PATH``, so that ``ENV PATH=/opt/bin:$PATH`` works).
* The ``ARG`` values in scope reach each ``RUN`` as ``Step.env`` (``KEY=value``), never as ``ENV`` steps.
* ``CMD``/``ENTRYPOINT`` become ``Recipe.start_cmd``, combined as Docker does; ``HEALTHCHECK CMD …`` becomes
  ``Recipe.ready_cmd`` (``HEALTHCHECK NONE`` clears it). Its ``--interval``, ``--timeout``, ``--start-period``,
  ``--start-interval`` and ``--retries`` options are accepted and not used: the ready command is polled by the
  build until it succeeds once.
* ``EXPOSE`` takes TCP ports and ranges; UDP and SCTP ports are refused (the port proxy forwards TCP only).
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from cryobox.errors import InvalidArgument, PayloadTooLarge
from cryobox.image.recipe.bases import base_of
from cryobox.image.recipe.dflines import Instruction, read_instructions
from cryobox.image.recipe.model import Base, Recipe, Step
from cryobox.image.recipe.shellwords import WordError, expand, name_values, split_words

MAX_DOCKERFILE_BYTES = 1 << 20
MAX_STEPS = 500
MAX_EXPOSED_PORTS = 1024
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_SHELL = ("/bin/sh", "-c")

_COPY_FLAGS = frozenset({"chown", "chmod", "link"})
_HEALTHCHECK_FLAGS = frozenset({"interval", "timeout", "start-period", "start-interval", "retries"})
_REMOTE = re.compile(r"^(?:https?://|git://|git@|ssh://)", re.IGNORECASE)
_ARCHIVE = (".tar", ".tar.gz", ".tgz", ".tar.xz", ".txz", ".tar.bz2", ".tbz2", ".tar.zst", ".tzst")
_HEREDOC = re.compile(r"^\d*<<-?['\"]?[A-Za-z0-9_]+['\"]?$")
_MODE = re.compile(r"^[0-7]{3,4}$")
_PORT = re.compile(r"^(\d+)(?:-(\d+))?(?:/([A-Za-z]+))?$")


def _fail(ins: Instruction, message: str, **details: object) -> InvalidArgument:
    return InvalidArgument(
        f"Dockerfile line {ins.line}: {ins.keyword}: {message}",
        details={"line": ins.line, "instruction": ins.keyword, **details},
    )


@dataclass(frozen=True)
class _Command:
    """A ``CMD``/``ENTRYPOINT``/``HEALTHCHECK CMD`` as written: exec words, or a shell command and its shell."""

    words: tuple[str, ...]
    shell_text: str | None = None

    def as_shell(self) -> str:
        if self.shell_text is not None and self.words[:-1] == DEFAULT_SHELL:
            return self.shell_text
        return shlex.join(self.words)


@dataclass
class _State:
    escape: str
    build_args: Mapping[str, str]
    env: dict[str, str]
    meta_args: dict[str, str | None] = field(default_factory=dict)
    args: dict[str, str | None] = field(default_factory=dict)
    base: Base | None = None
    workdir: str = "/"
    shell: tuple[str, ...] = DEFAULT_SHELL
    steps: list[Step] = field(default_factory=list)
    declared_env: set[str] = field(default_factory=set)
    cmd: _Command | None = None
    entrypoint: _Command | None = None
    ready_cmd: str = ""
    expose: list[int] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)

    def scope(self) -> dict[str, str]:
        if self.base is None:
            return {k: v for k, v in self.meta_args.items() if v is not None}
        values = dict(self.env)
        for name, value in self.args.items():
            if value is not None and name not in self.declared_env:
                values[name] = value
        return values

    def expand(self, ins: Instruction, word: str) -> str:
        try:
            return expand(word, self.scope(), escape=self.escape)
        except WordError as exc:
            raise _fail(ins, str(exc)) from None

    def add(self, ins: Instruction, step: Step) -> None:
        if len(self.steps) >= MAX_STEPS:
            raise PayloadTooLarge(
                f"Dockerfile line {ins.line}: more than {MAX_STEPS} steps",
                details={"limit": MAX_STEPS, "line": ins.line},
            )
        self.steps.append(step)


def _no_flags(ins: Instruction, allowed: frozenset[str] = frozenset()) -> None:
    for name in ins.flags:
        if name not in allowed:
            raise _fail(ins, f"the --{name} option is not supported", option=name)


def _do_from(st: _State, ins: Instruction) -> None:
    if st.base is not None:
        raise _fail(ins, "a second FROM: multi-stage builds are not supported")
    _no_flags(ins)
    words = ins.rest.split()
    if not (len(words) == 1 or (len(words) == 3 and words[1].lower() == "as")):
        raise _fail(ins, "expected FROM <image> [AS <name>]")
    ref = st.expand(ins, words[0])
    if not ref:
        raise _fail(ins, f"{words[0]!r} expands to an empty image reference")
    st.base = base_of(ref)


def _do_arg(st: _State, ins: Instruction) -> None:
    _no_flags(ins)
    words = split_words(ins.rest, escape=st.escape)
    if not words:
        raise _fail(ins, "ARG requires at least one argument")
    for word in words:
        name, has_default, raw = word.partition("=")
        if not name:
            raise _fail(ins, "ARG names can not be blank")
        value: str | None = st.expand(ins, raw) if has_default else None
        if st.base is None:
            st.meta_args[name] = st.build_args.get(name, value)
            continue
        if name in st.build_args:
            value = st.build_args[name]
        elif value is None:
            value = st.meta_args.get(name)
        st.args[name] = value


def _do_env(st: _State, ins: Instruction) -> None:
    _no_flags(ins)
    try:
        pairs = name_values(ins.rest, "ENV", escape=st.escape)
    except WordError as exc:
        raise _fail(ins, str(exc)) from None
    resolved = [(st.expand(ins, k), st.expand(ins, v)) for k, v in pairs]
    args: list[str] = []
    for key, value in resolved:
        if not key:
            raise _fail(ins, "ENV names can not be blank")
        st.env[key] = value
        st.declared_env.add(key)
        args += [key, value]
    st.add(ins, Step("ENV", tuple(args), line=ins.line))


def _do_run(st: _State, ins: Instruction) -> None:
    if ins.flags:
        name = next(iter(ins.flags))
        raise _fail(ins, f"RUN --{name} is not supported (BuildKit mounts, network and security modes)", option=name)
    argv = ins.json_args()
    if argv is not None:
        if not argv:
            raise _fail(ins, "an empty exec form")
        args: tuple[str, ...] = ("exec", *argv)
    else:
        if not ins.rest:
            raise _fail(ins, "RUN requires a command")
        if any(_HEREDOC.match(w) for w in split_words(ins.rest, escape=st.escape)):
            raise _fail(ins, "heredocs (<<EOF) are not supported; use a quoted string or COPY a script")
        args = (ins.rest,) if st.shell == DEFAULT_SHELL else ("exec", *st.shell, ins.rest)
    env = tuple(f"{k}={v}" for k, v in st.args.items() if v is not None and k not in st.declared_env)
    st.add(ins, Step("RUN", args, env=env, line=ins.line))


def _do_copy(st: _State, ins: Instruction) -> None:
    if "from" in ins.flags:
        raise _fail(ins, "--from is not supported (multi-stage builds are not supported)", option="from")
    _no_flags(ins, _COPY_FLAGS)
    raw = ins.json_args()
    if raw is None:
        raw = split_words(ins.rest, escape=st.escape)
        if any(_HEREDOC.match(w) for w in raw):
            raise _fail(ins, "heredocs (<<EOF) are not supported")
    words = [st.expand(ins, w) for w in raw]
    if len(words) < 2:
        raise _fail(ins, f"{ins.keyword} requires at least two arguments: a source and a destination")
    *sources, dest = words
    if ins.keyword == "ADD":
        for src in sources:
            if _REMOTE.match(src):
                raise _fail(ins, f"ADD of a remote URL ({src}) is not supported; use RUN curl or git", source=src)
            if src.lower().endswith(_ARCHIVE):
                raise _fail(ins, f"ADD would extract the archive {src}; use COPY and RUN tar to unpack it", source=src)
    mode = st.expand(ins, ins.flags["chmod"]) if "chmod" in ins.flags else ""
    if mode and not _MODE.match(mode):
        raise _fail(ins, f"invalid --chmod={mode}: expected an octal mode such as 0755")
    chown = st.expand(ins, ins.flags["chown"]) if "chown" in ins.flags else ""
    st.add(ins, Step("COPY", (*sources, dest), chown=chown, mode=mode, line=ins.line))


def _do_workdir(st: _State, ins: Instruction) -> None:
    _no_flags(ins)
    path = st.expand(ins, ins.rest)
    if not path:
        raise _fail(ins, "WORKDIR requires a path")
    st.workdir = posixpath.normpath(posixpath.join(st.workdir, path))
    if st.workdir.startswith("//"):
        st.workdir = "/" + st.workdir.lstrip("/")
    st.add(ins, Step("WORKDIR", (st.workdir,), line=ins.line))


def _do_user(st: _State, ins: Instruction) -> None:
    _no_flags(ins)
    user = st.expand(ins, ins.rest)
    if not user:
        raise _fail(ins, "USER requires a user")
    st.add(ins, Step("USER", (user,), line=ins.line))


def _do_shell(st: _State, ins: Instruction) -> None:
    _no_flags(ins)
    words = ins.json_args()
    if not words:
        raise _fail(ins, 'SHELL requires a non-empty JSON array, e.g. SHELL ["/bin/bash", "-c"]')
    st.shell = tuple(words)


def _do_expose(st: _State, ins: Instruction) -> None:
    _no_flags(ins)
    words = [p for w in split_words(ins.rest, escape=st.escape) for p in st.expand(ins, w).split()]
    if not words:
        raise _fail(ins, "EXPOSE requires at least one port")
    for word in words:
        match = _PORT.match(word)
        if match is None:
            raise _fail(ins, f"invalid port {word!r}", port=word)
        proto = (match.group(3) or "tcp").lower()
        if proto != "tcp":
            raise _fail(ins, f"{word}: only TCP ports can be exposed", port=word)
        low = int(match.group(1))
        high = int(match.group(2) or low)
        if not 1 <= low <= high <= 65535:
            raise _fail(ins, f"invalid port {word!r}", port=word)
        for port in range(low, high + 1):
            if port not in st.expose:
                st.expose.append(port)
        if len(st.expose) > MAX_EXPOSED_PORTS:
            raise _fail(ins, f"more than {MAX_EXPOSED_PORTS} exposed ports", limit=MAX_EXPOSED_PORTS)


def _do_label(st: _State, ins: Instruction) -> None:
    _no_flags(ins)
    if ins.keyword == "MAINTAINER":
        if not ins.rest:
            raise _fail(ins, "MAINTAINER requires an argument")
        st.labels["maintainer"] = ins.rest
        return
    try:
        pairs = name_values(ins.rest, "LABEL", escape=st.escape)
    except WordError as exc:
        raise _fail(ins, str(exc)) from None
    for key, value in pairs:
        name = st.expand(ins, key)
        if not name:
            raise _fail(ins, "LABEL names can not be blank")
        st.labels[name] = st.expand(ins, value)


def _command(st: _State, ins: Instruction, rest: str) -> _Command:
    if not rest.strip():
        raise _fail(ins, "a command is required")
    probe = Instruction(ins.keyword, {}, rest, ins.line)
    words = probe.json_args()
    if words is not None:
        return _Command(tuple(words))
    return _Command((*st.shell, rest), shell_text=rest)


def _do_cmd(st: _State, ins: Instruction) -> None:
    _no_flags(ins)
    command = _command(st, ins, ins.rest)
    if ins.keyword == "CMD":
        st.cmd = command
    else:
        st.entrypoint = command


def _do_healthcheck(st: _State, ins: Instruction) -> None:
    _no_flags(ins, _HEALTHCHECK_FLAGS)
    parts = ins.rest.split(None, 1)
    kind = parts[0].upper() if parts else ""
    if kind == "NONE" and len(parts) == 1:
        st.ready_cmd = ""
    elif kind == "CMD" and len(parts) == 2:
        st.ready_cmd = _command(st, ins, parts[1]).as_shell()
    else:
        raise _fail(ins, "expected HEALTHCHECK [OPTIONS] CMD <command> or HEALTHCHECK NONE")


_HANDLERS: Mapping[str, Callable[[_State, Instruction], None]] = MappingProxyType(
    {
        "FROM": _do_from,
        "ARG": _do_arg,
        "ENV": _do_env,
        "RUN": _do_run,
        "COPY": _do_copy,
        "ADD": _do_copy,
        "WORKDIR": _do_workdir,
        "USER": _do_user,
        "SHELL": _do_shell,
        "EXPOSE": _do_expose,
        "LABEL": _do_label,
        "MAINTAINER": _do_label,
        "CMD": _do_cmd,
        "ENTRYPOINT": _do_cmd,
        "HEALTHCHECK": _do_healthcheck,
    }
)


def _start_cmd(st: _State) -> str:
    entry, cmd = st.entrypoint, st.cmd
    if entry is None:
        return cmd.as_shell() if cmd is not None and cmd.words else ""
    if entry.shell_text is not None:
        return entry.as_shell()
    words = entry.words + (cmd.words if cmd is not None else ())
    return shlex.join(words) if words else ""


def parse_dockerfile(
    text: str, *, build_args: Mapping[str, str] | None = None, base_env: Mapping[str, str] | None = None
) -> Recipe:
    """The recipe a single-stage Dockerfile describes (see the module's docstring for what is supported).

    ``build_args`` are ``--build-arg`` values (only those the Dockerfile declares with ``ARG`` are used);
    ``base_env`` is the base image's environment for substitution (default: ``{"PATH": DEFAULT_PATH}``).
    Raises :class:`InvalidArgument` naming the line, or :class:`PayloadTooLarge` past the size and step limits.
    """
    size = len(text.encode())
    if size > MAX_DOCKERFILE_BYTES:
        raise PayloadTooLarge(
            f"the Dockerfile is {size} bytes, more than the limit of {MAX_DOCKERFILE_BYTES}",
            details={"limit": MAX_DOCKERFILE_BYTES, "size": size},
        )
    document = read_instructions(text)
    env = dict(base_env) if base_env is not None else {"PATH": DEFAULT_PATH}
    st = _State(escape=document.escape, build_args=dict(build_args or {}), env=env)
    for ins in document.instructions:
        handler = _HANDLERS.get(ins.keyword)
        if handler is None:
            raise _fail(ins, f"the {ins.keyword} instruction is not supported")
        if st.base is None and ins.keyword not in ("ARG", "FROM"):
            raise _fail(ins, "only ARG may come before FROM")
        handler(st, ins)
    if st.base is None:
        raise InvalidArgument("the Dockerfile has no FROM instruction", details={"instruction": "FROM"})
    return Recipe(
        base=st.base,
        steps=tuple(st.steps),
        start_cmd=_start_cmd(st),
        ready_cmd=st.ready_cmd,
        expose=tuple(st.expose),
        labels=dict(st.labels),
    )


__all__ = ["DEFAULT_PATH", "MAX_DOCKERFILE_BYTES", "MAX_STEPS", "parse_dockerfile"]
