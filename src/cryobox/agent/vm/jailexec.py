"""The jail launcher: run as ``python -I -S jailexec.py SPEC -- QEMU ARGV...`` by :mod:`.jail` (as root).

Standard library only and nothing imported from cryobox: it starts fast (it is on every QEMU spawn), and it is
the one piece of code that runs between the agent and a jailed QEMU. It

1. enters the slot's network namespace (``setns``) and the VM's cgroups (writes its pid to each ``procs`` file);
2. ``unshare``s mount, PID and IPC namespaces and forks: the child is PID 1 of the new PID namespace;
3. in the child: makes every mount private, mounts a small tmpfs on the jail directory, bind-mounts into it
   exactly the files the spec names (at their own absolute paths, read-only unless marked ``rw``), makes the
   device nodes it needs, ``pivot_root``s into it and detaches the old root; drops every capability from the
   bounding set, sets ``no_new_privs``, switches to the VM's uid/gid with no supplementary groups (the uid
   change clears the permitted and effective sets) and ``execve``s QEMU with an empty environment;
4. in the parent: waits until the child has exec'd (a close-on-exec pipe closes) or failed (the pipe carries
   the error), prints the child's pid (as the host sees it) and exits. QEMU is then re-parented to init.

The spec is one directive per line, fields separated by tabs (paths containing tabs or newlines are refused
by :mod:`.jail`): ``netns PATH``, ``cgroup PROCS_FILE``, ``root DIR``, ``bind PATH ro|rw``, ``dev PATH``,
``mknod PATH MAJOR MINOR``, ``symlink TARGET PATH``, ``tap NAME`` (handed to the uid), ``uid N``, ``gid N``,
``groups GID``.
"""

import ctypes
import fcntl
import os
import struct
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
SYS_PIVOT_ROOT = 155  # x86_64
CAP_LAST = 63
TUNSETIFF = 0x400454CA
TUNSETOWNER = 0x400454CC
TUNSETGROUP = 0x400454CE
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000

libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = [None if s is None else s.encode() for s in (source, target, fstype, data)]
    _check(libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]), f"mount {target}")


def _parse(path: str) -> list[list[str]]:
    with open(path) as spec:
        return [line.rstrip("\n").split("\t") for line in spec if line.strip()]


def _mountpoint(target: str, is_dir: bool) -> None:
    if is_dir:
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not os.path.exists(target):
            os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o600))


def _build_root(spec: list[list[str]], root: str) -> None:
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("cryobox-jail", root, "tmpfs", MS_NOSUID, "mode=0755,size=1m,nr_inodes=4096")
    read_only: list[str] = []
    for fields in spec:
        op, args = fields[0], fields[1:]
        if op == "bind" or op == "dev":
            source = args[0]
            target = root + source
            _mountpoint(target, os.path.isdir(source))
            _mount(source, target, None, MS_BIND)
            if op == "dev" or args[1] == "ro":
                read_only.append(target)
        elif op == "mknod":
            target = root + args[0]
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.mknod(target, 0o600 | 0o020000, os.makedev(int(args[1]), int(args[2])))
        elif op == "symlink":
            os.symlink(args[0], root + args[1])
    for target in read_only:
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID
        if not target.startswith(root + "/dev/"):
            flags |= MS_NODEV
        _mount(None, target, None, flags)
    uid, gid = _one(spec, "uid"), _one(spec, "gid")
    for fields in spec:
        if fields[0] == "mknod":
            os.chown(root + fields[1], int(uid), int(gid))
    os.makedirs(root + "/.old", exist_ok=True)
    os.chdir(root)
    _check(libc.syscall(SYS_PIVOT_ROOT, b".", b".old"), "pivot_root")
    os.chdir("/")
    _check(libc.umount2(b"/.old", MNT_DETACH), "umount old root")
    os.rmdir("/.old")
    _mount(None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID)


def _one(spec: list[list[str]], op: str) -> str:
    for fields in spec:
        if fields[0] == op:
            return fields[1]
    raise ValueError(f"jail spec has no {op!r}")


def _drop_privileges(uid: int, gid: int, groups: list[int]) -> None:
    for cap in range(CAP_LAST + 1):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() != 22:  # EINVAL: no such cap
            _check(-1, f"drop capability {cap}")
    os.setgroups(groups)
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


def _give_tap(name: str, uid: int, gid: int) -> None:
    """Make the slot's persistent tap usable by ``uid`` without ``CAP_NET_ADMIN`` (and by no other uid)."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH22x", name.encode(), IFF_TAP | IFF_NO_PI))
        fcntl.ioctl(fd, TUNSETOWNER, uid)
        fcntl.ioctl(fd, TUNSETGROUP, gid)
    finally:
        os.close(fd)


def _child(spec: list[list[str]], argv: list[str], status_w: int) -> None:
    try:
        _build_root(spec, _one(spec, "root"))
        groups = [int(f[1]) for f in spec if f[0] == "groups"]
        _drop_privileges(int(_one(spec, "uid")), int(_one(spec, "gid")), groups)
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.dup2(2, 1)  # stdout is the pipe the parent reports our pid on: QEMU writes to its log instead
        os.execve(argv[0], argv, {})
    except BaseException as err:  # noqa: BLE001 - everything goes back to the parent, then we die
        os.write(status_w, f"jail: {err}".encode()[:4000])
    os._exit(127)


def main(args: list[str]) -> int:
    if len(args) < 3 or args[1] != "--":
        sys.stderr.write("usage: jailexec.py SPEC -- ARGV...\n")
        return 2
    spec = _parse(args[0])
    argv = args[2:]
    for fields in spec:
        if fields[0] == "netns":
            fd = os.open(fields[1], os.O_RDONLY | os.O_CLOEXEC)
            _check(libc.setns(fd, CLONE_NEWNET), f"setns {fields[1]}")
            os.close(fd)
        elif fields[0] == "tap":
            _give_tap(fields[1], int(_one(spec, "uid")), int(_one(spec, "gid")))
        elif fields[0] == "cgroup":
            with open(fields[1], "w") as procs:
                procs.write(str(os.getpid()))
    _check(libc.unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC), "unshare")
    status_r, status_w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        os.close(status_r)
        _child(spec, argv, status_w)
    os.close(status_w)
    chunks = []
    while chunk := os.read(status_r, 4096):
        chunks.append(chunk)
    if chunks:
        os.waitpid(pid, 0)
        sys.stderr.write(b"".join(chunks).decode(errors="replace") + "\n")
        return 1
    sys.stdout.write(f"{pid}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
