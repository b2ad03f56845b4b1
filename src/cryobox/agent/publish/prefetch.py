"""Prefetch traces: the order in which a restore first reads its memory image's chunks.

During a bake the guest's RAM is a local ``share=on`` file, so its reads cannot be observed; what prefetch should
replay is what a *restore* reads anyway. So right after a template is published, one restore is made through the
memory server, runs the create path (rejoin + ``exec true``), and the server's first-read order of that image
is stored beside it as ``memory.trace``. Lazy restores replay it in the background through the same resolver.
"""

from __future__ import annotations

import asyncio
import logging
import time

from ...objstore.chunkfmt import PrefetchTrace
from ...objstore.client import ObjectStore
from ...objstore.keys import template_prefix
from ..guest.exec import run_exec
from ..memory.client import MemoryServerProcess, image_name
from ..memory.server.fusefs import TRACE_NAME
from ..sandbox.factory import VmFactory
from ..sandbox.fidelity import rejoin
from ..templates.bake import Template

log = logging.getLogger(__name__)


async def ensure_trace(
    factory: VmFactory, memserver: MemoryServerProcess, store: ObjectStore, template: Template
) -> int | None:
    """Record and store ``template``'s trace unless the store has one; returns its length (None: existed)."""
    prefix = template_prefix(template.name, template.generation)
    key = f"{prefix}/{TRACE_NAME}"
    if await asyncio.to_thread(store.exists, key):
        return None
    name = image_name(template.manifest, prefix)  # what the lazy restore maps (its index pin included)
    started = time.monotonic()
    vm = await factory.spawn_incoming(template, lazy=True)
    try:
        await memserver.forget_reads(name)
        await vm.restore(template.vmstate)
        guest = await vm.connect_guest()
        await rejoin(guest, "trace", run_hooks=False)
        await run_exec(guest, "true", timeout_s=60)
        order = await memserver.first_reads(name)
    finally:
        await factory.destroy(vm)
    await asyncio.to_thread(store.put, key, PrefetchTrace(tuple(order)).to_bytes())
    log.info("recorded the prefetch trace of %s: %d chunks in %.1fs", prefix, len(order), time.monotonic() - started)
    return len(order)
