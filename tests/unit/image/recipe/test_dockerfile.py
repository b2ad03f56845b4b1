"""A Dockerfile read into a recipe: every supported instruction, Docker's substitution rules, and every refusal."""

from __future__ import annotations

import pytest

from cryobox.errors import InvalidArgument, PayloadTooLarge
from cryobox.image.recipe.dockerfile import DEFAULT_PATH, MAX_STEPS, parse_dockerfile
from cryobox.image.recipe.model import Base, Step


def test_a_typical_dockerfile() -> None:
    recipe = parse_dockerfile(
        "# syntax=docker/dockerfile:1\n"
        "FROM python:3.12-slim AS app\n"
        "ENV PYTHONUNBUFFERED=1\n"
        "WORKDIR /app\n"
        "COPY requirements.txt .\n"
        "RUN pip install -r requirements.txt\n"
        "COPY --chown=app:app --chmod=0755 . .\n"
        "USER app\n"
        "EXPOSE 8000/tcp 9000\n"
        'LABEL org.opencontainers.image.title="my app"\n'
        'CMD ["python", "-m", "http.server", "8000"]\n'
    )
    assert recipe.base == Base("image", "python:3.12-slim")
    assert recipe.steps == (
        Step("ENV", ("PYTHONUNBUFFERED", "1"), line=3),
        Step("WORKDIR", ("/app",), line=4),
        Step("COPY", ("requirements.txt", "."), line=5),
        Step("RUN", ("pip install -r requirements.txt",), line=6),
        Step("COPY", (".", "."), chown="app:app", mode="0755", line=7),
        Step("USER", ("app",), line=8),
    )
    assert recipe.expose == (8000, 9000)
    assert recipe.labels == {"org.opencontainers.image.title": "my app"}
    assert recipe.start_cmd == "python -m http.server 8000"
    assert all(s.context == "" for s in recipe.steps)


def test_args_before_from_and_build_args() -> None:
    text = "ARG SUITE=bullseye\nARG REG\nFROM ${REG:-docker.io/library}/debian:$SUITE\n"
    assert parse_dockerfile(text).base == Base("image", "docker.io/library/debian:bullseye")
    assert parse_dockerfile(text, build_args={"SUITE": "bookworm"}).base == Base("debian", "bookworm")


def test_arg_scope_and_run_env() -> None:
    recipe = parse_dockerfile(
        "ARG V=1\n"
        "FROM debian:12\n"
        "RUN echo $V\n"  # V not redeclared: not in scope
        "ARG V\n"  # takes the global default
        "ARG W=w-$V\n"
        "ARG UNSET\n"
        "RUN echo $V $W\n"
        "ENV W=from-env\n"
        "RUN echo $W\n"
        "WORKDIR /srv/$V\n",
        build_args={"W": "override", "NOT_DECLARED": "x"},
    )
    runs = [s for s in recipe.steps if s.op == "RUN"]
    assert runs[0].env == ()
    assert runs[1].env == ("V=1", "W=override")
    assert runs[2].env == ("V=1",)  # ENV wins over an ARG of the same name
    assert runs[1].args == ("echo $V $W",)  # RUN is never substituted by the parser
    assert recipe.steps[-1] == Step("WORKDIR", ("/srv/1",), line=10)
    assert all(s.op != "ENV" or s.args[0] != "V" for s in recipe.steps)


def test_env_forms_quotes_and_substitution() -> None:
    recipe = parse_dockerfile(
        "FROM debian:12\n"
        "ENV A hello world\n"
        "ENV B=\"v 2\" C=$A D=\\$A E='$A' F=${A:+set} G=${NOPE:-dflt}\n"
        "ENV A=bye H=$A\n"
        "ENV PATH=/opt/bin:$PATH\n"
    )
    envs = [s.args for s in recipe.steps]
    assert envs[0] == ("A", "hello world")
    assert envs[1] == ("B", "v 2", "C", "hello world", "D", "$A", "E", "$A", "F", "set", "G", "dflt")
    assert envs[2] == ("A", "bye", "H", "hello world")  # same-instruction references see the old value
    assert envs[3] == ("PATH", "/opt/bin:" + DEFAULT_PATH)


def test_base_env_override() -> None:
    recipe = parse_dockerfile("FROM x\nENV PATH=$PATH:/y\n", base_env={"PATH": "/x"})
    assert recipe.steps[0].args == ("PATH", "/x:/y")


def test_run_forms_and_shell() -> None:
    recipe = parse_dockerfile(
        "FROM debian:12\n"
        'RUN ["echo", "a b"]\n'
        'SHELL ["/bin/bash", "-o", "pipefail", "-c"]\n'
        "RUN echo $HOME | cat\n"
        'RUN ["ls"]\n'
    )
    assert [s.args for s in recipe.steps] == [
        ("exec", "echo", "a b"),
        ("exec", "/bin/bash", "-o", "pipefail", "-c", "echo $HOME | cat"),
        ("exec", "ls"),
    ]


def test_copy_and_add() -> None:
    recipe = parse_dockerfile(
        "FROM debian:12\n"
        "ARG DEST=/opt\n"
        'COPY ["my file.txt", "b", "$DEST/"]\n'
        "ADD --link conf.d/*.conf /etc/app/\n"
        "copy --chown=$DEST:grp a /b\n"
    )
    assert recipe.steps == (
        Step("COPY", ("my file.txt", "b", "/opt/"), line=3),
        Step("COPY", ("conf.d/*.conf", "/etc/app/"), line=4),
        Step("COPY", ("a", "/b"), chown="/opt:grp", line=5),
    )


@pytest.mark.parametrize(
    ("instruction", "needle"),
    [
        ("ADD https://example.com/a.txt /a", "remote URL"),
        ("ADD git@github.com:a/b.git /b", "remote URL"),
        ("ADD app.tar.gz /opt/", "ADD would extract"),
        ("ADD app.tzst /opt/", "ADD would extract"),
        ("COPY --from=build /a /a", "multi-stage"),
        ("COPY --parents a /b", "--parents"),
        ("COPY --chmod=rwx a /b", "--chmod"),
        ("COPY a", "two arguments"),
        ("RUN --mount=type=cache,target=/root/.cache pip install x", "RUN --mount"),
        ("RUN --network=none true", "RUN --network"),
        ("RUN <<EOF\necho hi\nEOF", "heredoc"),
        ("COPY <<EOF /a\nx\nEOF", "heredoc"),
        ("VOLUME /data", "VOLUME"),
        ("ONBUILD RUN true", "ONBUILD"),
        ("STOPSIGNAL SIGTERM", "STOPSIGNAL"),
        ("FROBNICATE x", "FROBNICATE"),
        ("FROM debian:11", "multi-stage"),
        ("EXPOSE 53/udp", "only TCP"),
        ("EXPOSE 70000", "invalid port"),
        ("SHELL /bin/bash -c", "SHELL requires"),
        ("HEALTHCHECK --interval=5s curl x", "HEALTHCHECK"),
        ("ENV A=${B", "missing"),
        ("USER --foo=bar x", "--foo"),
        ("ENV", "at least one"),
    ],
)
def test_refused_instructions_name_the_line(instruction: str, needle: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_dockerfile(f"FROM debian:12\n\n{instruction}\n")
    assert needle in info.value.message
    assert "line 3" in info.value.message
    assert info.value.details["line"] == 3
    assert info.value.details["instruction"] == instruction.split()[0].upper()


def test_from_is_required_and_first() -> None:
    with pytest.raises(InvalidArgument, match="no FROM"):
        parse_dockerfile("# just a comment\n")
    with pytest.raises(InvalidArgument, match="only ARG may come before FROM"):
        parse_dockerfile("ENV A=1\nFROM x\n")
    with pytest.raises(InvalidArgument, match="--platform"):
        parse_dockerfile("FROM --platform=linux/amd64 x\n")


def test_workdir_resolution() -> None:
    recipe = parse_dockerfile("FROM x\nWORKDIR a\nWORKDIR b/../c\nWORKDIR /abs\nWORKDIR ..\n")
    assert [s.args[0] for s in recipe.steps] == ["/a", "/a/c", "/abs", "/"]


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        ('CMD ["python", "app.py"]', "python app.py"),
        ("CMD python app.py --port $PORT", "python app.py --port $PORT"),
        ('ENTRYPOINT ["/init", "a b"]\nCMD ["--flag"]', "/init 'a b' --flag"),
        ('CMD ["--flag"]\nENTRYPOINT ["/init"]', "/init --flag"),
        ('ENTRYPOINT ["/init"]\nCMD run it', "/init /bin/sh -c 'run it'"),
        ('ENTRYPOINT exec /init\nCMD ["ignored"]', "exec /init"),
        ("CMD []", ""),
        ('SHELL ["/bin/bash", "-c"]\nCMD echo hi', "/bin/bash -c 'echo hi'"),
    ],
)
def test_start_cmd_as_docker_combines_it(lines: str, expected: str) -> None:
    assert parse_dockerfile(f"FROM x\n{lines}\n").start_cmd == expected


def test_healthcheck_and_labels() -> None:
    recipe = parse_dockerfile(
        "FROM x\n"
        "MAINTAINER Jane <jane@example.com>\n"
        "LABEL a=1 b='two words'\n"
        "LABEL legacy form value\n"
        "HEALTHCHECK --interval=5s --retries=3 CMD curl -f http://localhost/ || exit 1\n"
    )
    assert recipe.ready_cmd == "curl -f http://localhost/ || exit 1"
    assert recipe.labels == {
        "maintainer": "Jane <jane@example.com>",
        "a": "1",
        "b": "two words",
        "legacy": "form value",
    }
    assert parse_dockerfile('FROM x\nHEALTHCHECK CMD ["pg_isready", "-q"]\n').ready_cmd == "pg_isready -q"
    assert parse_dockerfile("FROM x\nHEALTHCHECK CMD true\nHEALTHCHECK NONE\n").ready_cmd == ""


def test_expose_ranges_and_substitution() -> None:
    recipe = parse_dockerfile("FROM x\nARG P=8080\nEXPOSE $P 3000-3002/TCP 8080\n")
    assert recipe.expose == (8080, 3000, 3001, 3002)


def test_keywords_case_insensitive_and_backtick_escape() -> None:
    recipe = parse_dockerfile("# escape=`\nfrom x\nenv A=`$B\nRun echo `\n  hi\n")
    assert recipe.steps == (Step("ENV", ("A", "$B"), line=3), Step("RUN", ("echo   hi",), line=4))


def test_limits() -> None:
    with pytest.raises(PayloadTooLarge) as too_big:
        parse_dockerfile("FROM x\n" + "# pad\n" * 200_000)
    assert too_big.value.details["limit"] == 1 << 20
    with pytest.raises(PayloadTooLarge) as too_many:
        parse_dockerfile("FROM x\n" + "RUN true\n" * (MAX_STEPS + 1))
    assert too_many.value.details["limit"] == MAX_STEPS
    assert too_many.value.http_status == 413
