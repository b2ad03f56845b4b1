"""The program the volume content API runs *inside* its system sandbox (``python3 -`` with this on stdin, as root),
so a tenant's file system is only ever parsed by a guest kernel, never by the host. One call per request:

    python3 - <op> <mount> <json args>

It prints one JSON object: the answer, or ``{"error": <kind>, "message": ...}`` with ``kind`` one of
``not_found``, ``exists``, ``not_dir``, ``is_dir``, ``invalid``. Paths are absolute *in the volume* (``/a/b``);
one that leaves the volume (``..``, or a parent that resolves through a symlink to outside the mount) is
``invalid``. Entries are never followed when they are symlinks (``lstat``); a listing walks ``depth`` levels of
real directories.

Ops: ``stat``, ``list`` (``depth``), ``mkdir`` (``force``: make parents, and an existing directory is fine;
``uid``/``gid``/``mode``), ``chmeta`` (``uid``/``gid``/``mode``), ``remove`` (a directory with everything in it),
``prewrite`` (``force``: ``False`` refuses an existing file; the parent must be a directory), ``postwrite``
(``uid``/``gid``/``mode`` of the written file: unset ones default to the volume root's owner and 0644),
``readable`` (a regular file: its size). Unset ``uid``/``gid`` of a new directory default to the root's owner.
"""

from __future__ import annotations

SCRIPT = r"""
import json, os, shutil, stat, sys

op, ROOT, args = sys.argv[1], sys.argv[2].rstrip("/"), json.loads(sys.argv[3])


def done(value):
    print(json.dumps(value))
    sys.exit(0)


def fail(kind, message):
    done({"error": kind, "message": message})


def inside(p):
    return p == ROOT or p.startswith(ROOT + "/")


def real(rel):
    p = os.path.normpath(os.path.join(ROOT, rel.lstrip("/")))
    if not inside(p):
        fail("invalid", "the path leaves the volume")
    if p != ROOT and not inside(os.path.realpath(os.path.dirname(p))):
        fail("invalid", "the path leads out of the volume through a symlink")
    return p


def entry(p):
    st = os.lstat(p)
    mode = st.st_mode
    kinds = ((stat.S_ISDIR, "directory"), (stat.S_ISREG, "file"), (stat.S_ISLNK, "symlink"))
    kind = next((name for test, name in kinds if test(mode)), "unknown")
    rel = "/" + os.path.relpath(p, ROOT) if p != ROOT else "/"
    found = {
        "name": rel.rsplit("/", 1)[-1] or "/", "type": kind, "path": rel, "size": st.st_size,
        "mode": stat.S_IMODE(mode), "uid": st.st_uid, "gid": st.st_gid,
        "atime": st.st_atime, "mtime": st.st_mtime, "ctime": st.st_ctime,
    }
    if kind == "symlink":
        found["target"] = os.readlink(p)
    return found


def existing(p):
    if not os.path.lexists(p):
        fail("not_found", "no such file or directory")
    return p


def owner(p, uid, gid, mode, new_mode):
    root = os.lstat(ROOT)
    if uid is not None or gid is not None or new_mode is not None:
        os.lchown(p, root.st_uid if uid is None else uid, root.st_gid if gid is None else gid)
    if mode is not None or new_mode is not None:
        if not os.path.islink(p):
            os.chmod(p, new_mode if mode is None else mode)


def children(p, depth, out):
    for name in sorted(os.listdir(p)):
        child = os.path.join(p, name)
        out.append(entry(child))
        if depth > 1 and os.path.isdir(child) and not os.path.islink(child):
            children(child, depth - 1, out)


try:
    if op == "stat":
        done(entry(existing(real(args["path"]))))
    if op == "list":
        p = existing(real(args["path"]))
        if not os.path.isdir(p) or os.path.islink(p):
            fail("not_dir", "not a directory")
        out = []
        children(p, max(1, int(args.get("depth") or 1)), out)
        done(out)
    if op == "mkdir":
        p = real(args["path"])
        if os.path.lexists(p):
            if args.get("force") and os.path.isdir(p) and not os.path.islink(p):
                done(entry(p))
            fail("exists", "it exists already")
        parent = os.path.dirname(p)
        if not os.path.isdir(parent):
            if not args.get("force"):
                fail("not_found", "its parent directory does not exist")
            os.makedirs(parent)
        os.mkdir(p)
        owner(p, args.get("uid"), args.get("gid"), args.get("mode"), 0o755)
        done(entry(p))
    if op == "chmeta":
        p = existing(real(args["path"]))
        owner(p, args.get("uid"), args.get("gid"), args.get("mode"), None)
        done(entry(p))
    if op == "remove":
        p = existing(real(args["path"]))
        if p == ROOT:
            fail("invalid", "the volume's root cannot be removed")
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p)
        else:
            os.unlink(p)
        done({})
    if op == "prewrite":
        p = real(args["path"])
        if not os.path.isdir(os.path.dirname(p)):
            fail("not_found", "its parent directory does not exist")
        if os.path.lexists(p):
            if os.path.isdir(p) and not os.path.islink(p):
                fail("is_dir", "a directory is there")
            if args.get("force") is False:
                fail("exists", "the file exists (force to overwrite)")
            if os.path.islink(p):
                os.unlink(p)  # written as a file of the volume, never through the link
        done({"path": p})
    if op == "postwrite":
        p = existing(real(args["path"]))
        owner(p, args.get("uid"), args.get("gid"), args.get("mode"), 0o644)
        done(entry(p))
    if op == "readable":
        p = existing(real(args["path"]))
        if not stat.S_ISREG(os.lstat(p).st_mode):
            fail("is_dir" if os.path.isdir(p) else "invalid", "not a regular file")
        done({"path": p, "size": os.lstat(p).st_size})
    fail("invalid", "unknown op")
except (PermissionError, OSError) as err:
    fail("invalid", err.strerror or str(err))
"""
