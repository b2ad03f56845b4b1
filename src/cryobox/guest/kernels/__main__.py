"""``python3 -m cryobox_guest.kernels [--port 49999] [--user user] [--cold] [--spares N]``: become ``--user``
(E2B runs its kernels as ``user`` in ``/home/user``), start the default context (warm unless ``--cold``), then
serve; spare kernels start in the background once the server is up (``GET /health`` says when they are)."""

from __future__ import annotations

import argparse
import os
import pwd
import signal
import sys
import threading

from .contexts import INSTANCE_ID_PATH
from .server import Contexts, make_server

PORT = 49999


def become(name: str) -> None:
    account = pwd.getpwnam(name)
    os.initgroups(name, account.pw_gid)
    os.setgid(account.pw_gid)
    os.setuid(account.pw_uid)
    os.environ.update(HOME=account.pw_dir, USER=name, LOGNAME=name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cryobox_guest.kernels", description=__doc__)
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=PORT)
    parser.add_argument("--cwd", default="/home/user")
    parser.add_argument("--cold", action="store_true", help="do not import numpy, pandas and matplotlib at start")
    parser.add_argument("--spares", type=int, default=1, help="warm kernels kept ready for new contexts")
    parser.add_argument("--user", help="run as this account (the server starts as root)")
    parser.add_argument("--instance-id-path", default=INSTANCE_ID_PATH, help="where the agent's resume writes it")
    options = parser.parse_args(argv)
    if options.user:
        become(options.user)
    contexts = Contexts(
        cwd=options.cwd, warm=not options.cold, spares=options.spares, instance_path=options.instance_id_path
    )
    contexts.start_default()
    server = make_server(options.host, options.port, contexts)

    def stop(signum: int, frame: object) -> None:  # SIGTERM: stop serving, then shut every kernel down
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    threading.Thread(target=contexts.fill_spares, daemon=True, name="kernel-spares").start()
    host, port = str(server.server_address[0]), int(server.server_address[1])
    print(f"cryobox kernels serving on {host}:{port}", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    finally:
        contexts.close_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
