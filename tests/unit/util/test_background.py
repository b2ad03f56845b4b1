"""Background threads run at a lower CPU priority, and so do the threads they start."""

from __future__ import annotations

import os
import threading

from cryobox.util.background import NICE, Background


async def test_background_work_runs_niced_and_its_threads_inherit_it() -> None:
    pool = Background(workers=1)
    try:

        def priorities() -> tuple[int, int, str]:
            seen: list[int] = []
            child = threading.Thread(target=lambda: seen.append(os.getpriority(os.PRIO_PROCESS, 0)))
            child.start()
            child.join()
            return os.getpriority(os.PRIO_PROCESS, 0), seen[0], threading.current_thread().name

        own, child, name = await pool.run(priorities)
    finally:
        pool.close()
    base = os.getpriority(os.PRIO_PROCESS, 0)
    assert own == child == max(base, NICE)  # lowered, never raised
    assert name.startswith("background")
    assert os.getpriority(os.PRIO_PROCESS, 0) == base  # the caller's thread is untouched
