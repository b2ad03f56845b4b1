"""Custom template builds in the control plane: the operator's allowlist (403, nothing written) and the bound on
builds one agent gets at a time (429 ``build_queue_full``, nothing written), over a fake agent."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from cryobox import models
from cryobox.agentapi import models as am
from cryobox.agentapi.heartbeat import heartbeat_of
from cryobox.agentapi.models_templates import spec_from_request
from cryobox.errors import BuildQueueFull, Forbidden, NotFound
from cryobox.image.buildpolicy import BuildAllowlist
from cryobox.image.specs import by_name
from cryobox.objstore.client import open_store
from cryobox.objstore.owners import claim_key
from cryobox.registry import Registry
from cryobox.server.control.fleet import Fleet, FleetConfig
from cryobox.server.control.ownership import StoreOwnership
from cryobox.server.control.templates import TemplateJobs
from tests.support import registry as registry_support
from tests.support.fake_agent import FakeAgent

registry = registry_support.sqlite_registry


class HeldAgent(FakeAgent):
    """Builds run until ``release`` is set."""

    def __init__(self) -> None:
        super().__init__(name="a")
        self.release = asyncio.Event()
        self.running = 0
        self.most = 0

    async def build_template(self, build: am.TemplateBuild) -> AsyncIterator[am.BuildEvent]:
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await self.release.wait()
            async for event in super().build_template(build):
                yield event
        finally:
            self.running -= 1


@pytest.fixture
async def jobs(registry: Registry) -> AsyncIterator[tuple[TemplateJobs, HeldAgent]]:
    agent = HeldAgent()
    fleet = Fleet(registry, FleetConfig(deadline_s=10.0, node_token="t"), local={"a": agent})
    await fleet.heartbeat(await heartbeat_of(agent))
    templates = TemplateJobs(registry, fleet)
    try:
        yield templates, agent
    finally:
        agent.release.set()
        await templates.close()
        await fleet.close()


def request(name: str, **kw: object) -> models.TemplateCreateRequest:
    return models.TemplateCreateRequest.model_validate({"name": name, **kw})


async def test_packages_outside_the_allowlist_are_refused_before_anything_is_written(
    jobs: tuple[TemplateJobs, HeldAgent], registry: Registry
) -> None:
    templates, agent = jobs
    templates.allowlist = BuildAllowlist(packages=("jq", "python3-*"), pip=("requests",))
    ws = registry.ensure_workspace("alpha").id
    with pytest.raises(Forbidden) as refused:
        await templates.start_build(ws, request("t1", packages=["jq", "curl"], pip=["Requests[socks]==2.32.3", "x"]))
    assert refused.value.http_status == 403 and refused.value.code == "forbidden"
    assert refused.value.details == {"packages": ["curl"], "pip": ["x"]}
    with pytest.raises(NotFound):
        registry.get_template("t1")
    assert agent.call_names().count("build_template") == 0
    row = await templates.start_build(ws, request("t2", packages=["jq", "python3-yaml"], pip=["requests>=2"]))
    assert row.status == "building"


async def test_builds_past_the_per_agent_bound_are_429_and_write_nothing(
    jobs: tuple[TemplateJobs, HeldAgent], registry: Registry
) -> None:
    templates, agent = jobs
    templates.max_builds = 2
    ws = registry.ensure_workspace("alpha").id
    for name in ("b1", "b2"):
        assert (await templates.start_build(ws, request(name))).status == "building"
    with pytest.raises(BuildQueueFull) as full:
        await templates.start_build(ws, request("b3"))
    assert full.value.http_status == 429 and full.value.code == "build_queue_full"
    assert full.value.details == {"agent": "a", "builds": 2, "limit": 2}
    with pytest.raises(NotFound):
        registry.get_template("b3")
    agent.release.set()
    for _ in range(500):
        if templates.progress.get("b1") == "ready" and templates.progress.get("b2") == "ready":
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)  # the finished jobs leave the table
    assert (await templates.start_build(ws, request("b3"))).status == "building"  # room again
    assert agent.most == 2


async def test_a_built_template_is_servable_before_the_agents_next_heartbeat(
    jobs: tuple[TemplateJobs, HeldAgent], registry: Registry
) -> None:
    """Placement reads what an agent serves from its row; a create right after "ready" must not wait for the
    next heartbeat (it got 503 ``capacity`` until then)."""
    templates, agent = jobs
    ws = registry.ensure_workspace("alpha").id
    await templates.start_build(ws, request("fresh"))
    assert "fresh" not in registry.fleet.get_agent("a").capacity["templates_ready"]
    agent.release.set()
    for _ in range(500):
        if templates.progress.get("fresh") == "ready":
            break
        await asyncio.sleep(0.01)
    assert registry.get_template("fresh").status == "ready"
    served = registry.fleet.get_agent("a").capacity["templates_ready"]
    assert served["fresh"] == agent.template_infos["fresh"].generation  # no heartbeat was sent since the first


async def test_the_agent_gets_the_spec_read_from_the_request_and_the_request_for_older_agents(
    jobs: tuple[TemplateJobs, HeldAgent], registry: Registry
) -> None:
    templates, agent = jobs
    ws = registry.ensure_workspace("alpha").id
    asked = request("typed", base="code-interpreter", packages=["jq"], pip=["requests"], cpu=2, memory_mb=2048)
    await templates.start_build(ws, asked)
    agent.release.set()
    for _ in range(500):
        if templates.progress.get("typed") == "ready":
            break
        await asyncio.sleep(0.01)
    [build] = [args[0] for name, args in agent.calls if name == "build_template"]
    assert isinstance(build, am.TemplateBuild)
    spec = build.spec.template_spec()
    assert spec == spec_from_request(asked) and am.BuildSpec.of(spec) == build.spec
    assert (spec.base, spec.cpus, spec.memory_mib, spec.pip) == ("code-interpreter", 2, 2048, ("requests",))
    base = by_name("code-interpreter")
    assert base is not None and spec.packages[-1] == "jq" and spec.warmup == base.warmup
    assert build.request == asked.model_dump()  # what an agent of the previous version reads
    assert registry.get_template("typed").spec == asked.model_dump()  # the registry keeps the public request


async def test_a_build_claims_its_template_in_the_store_before_the_agent_builds(
    jobs: tuple[TemplateJobs, HeldAgent], registry: Registry
) -> None:
    """The agent publishes what it builds; a store GC must know whose it is (``owners/``)."""
    templates, agent = jobs
    store = open_store("memory://")
    templates.owners = StoreOwnership.announced(store, registry, "m1")
    ws = registry.ensure_workspace("alpha").id
    await templates.start_build(ws, request("mine"))
    for _ in range(500):
        if agent.running:
            break
        await asyncio.sleep(0.01)
    assert agent.running == 1 and claim_key(registry.identity(), "templates/mine") in store.list("owners")
