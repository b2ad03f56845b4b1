"""The interface's ``counters`` method, mixed into :class:`~.agent.HostAgent`: the host's herd counters, read from
its memory server's exposition (:mod:`cryobox.agent.memory.server.metrics`) and answered typed
(:class:`~cryobox.agentapi.models_obs.AgentCounters`), so the control plane gathers them without parsing text."""

from __future__ import annotations

import logging
import math
from typing import Final

from prometheus_client.parser import text_string_to_metric_families

from ...agentapi.models_obs import AgentCounters
from ...errors import HostUnavailable
from ..host.startup import Host

log = logging.getLogger(__name__)

EXPOSED: Final = {
    "faults_total": "faults",
    "chunk_fetches_total": "chunk_fetches",
    "zero_fills_total": "zero_fills",
    "cache_hits_total": "cache_hits",
    "prefetch_hits_total": "prefetch_hits",
    "prefetch_chunks_total": "prefetch_chunks",
    "store_gets_total": "store_gets",
    "chunk_fetch_failures_total": "chunk_fetch_failures",
    "chunk_cache_bytes": "chunk_cache_bytes",
}
"""The memory server's sample name -> the :class:`AgentCounters` field."""


def counters_from_text(text: str) -> AgentCounters:
    """The :data:`EXPOSED` samples of a text exposition (each summed over its label sets; absent ones are 0, a
    negative or non-finite one too: the model holds what a counter can be)."""
    values = dict.fromkeys(EXPOSED.values(), 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = EXPOSED.get(sample.name)
            if key is not None and math.isfinite(sample.value):
                values[key] += sample.value
    return AgentCounters.model_validate({key: max(0, int(value)) for key, value in values.items()})


class CounterEndpoints:
    host: Host

    async def counters(self) -> AgentCounters:
        try:
            text = await self.host.memserver.metrics_text()
        except Exception as err:
            log.warning("memory server metrics failed: %s", err)
            raise HostUnavailable("this agent's memory server does not answer", retry_after_s=2.0) from None
        return counters_from_text(text)
