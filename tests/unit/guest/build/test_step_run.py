"""RUN in a busybox chroot built by the test: user, workdir, environment, exit status, and the mounts and
temporary files around it cleaned up on every way out."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cryobox.guest.build.errors import BuildError
from cryobox.guest.build.mounts import mounts_under, run_command
from cryobox.guest.build.overlays import POLICY_RC, overlaid
from cryobox.guest.build.state import BuildState, StepSpec
from cryobox.guest.build.step_run import cleanup, command_argv, run_env, run_step
from tests.support.busyroot import busybox_root

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="chroot and mount need root")


@dataclass
class Chroot:
    root: Path
    state_dir: Path
    resolv: Path
    out: Path
    logs: list[str]

    def run(
        self, *args: str, state: BuildState | None = None, user: str = "", env: tuple[str, ...] = (), **kw: object
    ) -> tuple[int, str]:
        step = StepSpec("RUN", args, user=user, env=env, line=7)
        with open(self.out, "wb") as handle:
            status = run_step(
                str(self.root),
                step,
                state or BuildState(),
                str(self.state_dir),
                self.logs.append,
                out=handle.fileno(),
                err=handle.fileno(),
                vm_resolv=str(self.resolv),
                **kw,  # type: ignore[arg-type]
            )
        return status, self.out.read_text()


@pytest.fixture
def chroot(tmp_path: Path) -> Iterator[Chroot]:
    root = busybox_root(tmp_path / "root")
    (root / "etc" / "resolv.conf").symlink_to("../run/systemd/resolve/stub-resolv.conf")  # as Ubuntu has it
    resolv = tmp_path / "vm-resolv.conf"
    resolv.write_text("nameserver 10.0.2.3\n")
    yield Chroot(root, tmp_path / "state", resolv, tmp_path / "out.log", [])
    leftover = mounts_under(str(root))
    for point in leftover:  # keep the host clean even when the test failed
        os.system(f"umount -l '{point}'")
    assert leftover == [], "a mount was left in the chroot"
    assert os.readlink(root / "etc" / "resolv.conf") == "../run/systemd/resolve/stub-resolv.conf"
    assert not os.path.lexists(root / "usr" / "sbin" / "policy-rc.d")
    assert not [n for n in os.listdir(root / "etc") if n.startswith(".cryobox")]


def test_user_workdir_env_and_status(chroot: Chroot) -> None:
    state = BuildState(env={"FOO": "from-env", "PATH": "/bin:/usr/bin"}, workdir="/work/new", user="user")
    script = 'echo "$(id -u):$(id -g):$(id -G)"; pwd; echo "$FOO $BAR $HOME $PATH"; touch "$HOME/mine"; exit 7'
    status, out = chroot.run(script, state=state, env=("BAR=from-step",))
    assert status == 7
    assert out.splitlines() == ["1000:1000:1000", "/work/new", "from-env from-step /home/user /bin:/usr/bin"]
    assert os.stat(chroot.root / "home" / "user" / "mine").st_uid == 1000
    assert os.stat(chroot.root / "work" / "new").st_uid == 0  # created for the RUN, as root (like Docker)


def test_the_step_user_wins_with_a_group_and_supplementary_groups(chroot: Chroot) -> None:
    status, out = chroot.run('echo "$(id -u):$(id -g):$(id -G) $HOME"', user="app", state=BuildState(user="user"))
    assert (status, out.strip()) == (0, "1500:1501:1501 1600 /srv/app")
    status, out = chroot.run('echo "$(id -u):$(id -g)"; echo "$PATH"', user="user:extra")
    assert out.splitlines() == ["1000:1600", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
    with pytest.raises(BuildError, match="unable to find user 'ghost'"):
        chroot.run("true", user="ghost")


def test_exec_form_looks_the_command_up_in_the_target(chroot: Chroot) -> None:
    status, out = chroot.run("exec", "echo", "two  words", "$NOT_EXPANDED")
    assert (status, out) == (0, "two  words $NOT_EXPANDED\n")
    status, out = chroot.run("exec", "no-such-tool")
    assert status == 127
    assert "cannot start 'no-such-tool'" in out


def test_mounts_resolv_conf_and_policy_rc_during_the_step(chroot: Chroot) -> None:
    script = (
        "test -r /proc/self/status && test -d /sys/kernel && test -c /dev/null && test -d /dev/pts"
        " && echo dirs-ok; cat /etc/resolv.conf; /usr/sbin/policy-rc.d; echo rc=$?;"
        " grep -c ' /run tmpfs' /proc/mounts; echo junk > /run/junk; echo mine > /etc/resolv.conf"
    )
    status, out = chroot.run(script)
    assert out.splitlines() == ["dirs-ok", "nameserver 10.0.2.3", "rc=101", "1"]
    assert status == 0
    assert not (chroot.root / "run" / "junk").exists()  # /run was a tmpfs
    assert POLICY_RC.endswith("exit 101\n")


def test_tmp_is_the_images_unless_asked(chroot: Chroot) -> None:
    (chroot.root / "tmp" / "copied.sh").write_text("echo copied-ran\n")
    assert chroot.run("sh /tmp/copied.sh") == (0, "copied-ran\n")
    status, out = chroot.run("ls /tmp; echo x > /tmp/scratch", tmpfs=("/run", "/tmp"))
    assert (status, out) == (0, "")
    assert not (chroot.root / "tmp" / "scratch").exists()


def test_processes_left_running_are_killed_and_unmounted(chroot: Chroot) -> None:
    status, _ = chroot.run("sleep 300 </dev/null >/dev/null 2>&1 & echo started")
    assert status == 0
    assert any("killing 1 processes" in line for line in chroot.logs)


def test_a_failing_mount_still_cleans_up(chroot: Chroot) -> None:
    def runner(argv: list[str]) -> None:
        if "devpts" in argv:
            raise BuildError("devpts refused (test)")
        run_command(argv)

    with pytest.raises(BuildError, match="devpts refused"):
        chroot.run("true", runner=runner)
    assert mounts_under(str(chroot.root)) == []


def test_an_interrupted_step_is_cleaned_up_by_the_next(chroot: Chroot) -> None:
    """Leftover mounts and a swapped resolv.conf from a killed driver go away in cleanup."""
    with overlaid(str(chroot.root), {"/etc/resolv.conf": ("x\n", 0o644)}, str(chroot.state_dir)):
        run_command(["mount", "-t", "tmpfs", "tmpfs", str(chroot.root / "tmp")])
        # simulate the driver dying here: the record stays, restore has not run
        record = (chroot.state_dir / "overlays.json").read_text()
        cleanup(str(chroot.root), str(chroot.state_dir), chroot.logs.append)
        assert mounts_under(str(chroot.root)) == []
        (chroot.state_dir / "overlays.json").write_text(record)  # the with block's own restore is then a no-op
    assert os.path.islink(chroot.root / "etc" / "resolv.conf")


def test_run_env_and_argv_rules() -> None:
    assert run_env({"HOME": "/h"}, ("A=1", "B=x=y"), "/root") == {
        "HOME": "/h",
        "A": "1",
        "B": "x=y",
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    }
    with pytest.raises(BuildError, match="not KEY=value"):
        run_env({}, ("NOEQUALS",), "/")
    assert command_argv(StepSpec("RUN", ("echo hi",))) == ["/bin/sh", "-c", "echo hi"]
    assert command_argv(StepSpec("RUN", ("exec", "ls", "-l"))) == ["ls", "-l"]
    with pytest.raises(BuildError):
        command_argv(StepSpec("RUN", ("exec",)))
