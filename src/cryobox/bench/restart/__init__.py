"""``cryobox bench restart``: what a restart of the agent costs the sandboxes on it, measured for real.

Phases (each its own data dir under ``/var/tmp``, every process stopped by PID, the data dir reclaimed after):

1. ``survival`` (:mod:`.survival`): ``n`` sandboxes with a background process each, on a ``cryobox serve`` with
   ``CRYOBOX_ON_STOP=keep``; after every SIGKILL and SIGTERM restart, how many are listed ``running`` and answer an
   exec showing the same process (pid and start time).
2. ``window`` (same server, :mod:`.survival`): client threads exec ``true`` in a tight loop through ``rounds``
   restarts of each kind (SIGKILL, an upgrade by ``SIGUSR2`` whose successor the bench reaps as a child subreaper:
   :mod:`.successor`, SIGTERM); the window is last success before the old process exited → first success after, worst
   client; reported p50/p99/max per kind with the new process's start-up (launch → ``/healthz``) beside it.
3. ``stop`` (:mod:`.many`): SIGTERM-to-exit with ``vms`` running sandboxes, with ``keep`` and then with ``kill``;
   host MemAvailable before and after.
4. ``drain`` (:mod:`.drain`): a fleet of two agents; one is drained; seconds per sandbox for the drain and for
   each one's first exec (its wake elsewhere), and where it ended up.

Then ``targets`` (all survive, window p99 ≤ 2 s, SIGTERM exit ≤ 10 s, and issue 37's per kind: SIGKILL ≤ 2 s,
upgrade and SIGTERM ≤ 1 s) and ``chaos`` (copied from the newest
``chaos-*.json`` in the results dir, if any). Pure parts: :mod:`.analysis`.
"""

from __future__ import annotations

from .run import run_restart_bench

__all__ = ["run_restart_bench"]
