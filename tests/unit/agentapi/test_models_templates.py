"""A template build on the wire carries the whole spec: :class:`BuildSpec` is :class:`TemplateSpec` field for field
(a field added to one and not the other would be dropped between the control plane and the agent)."""

from __future__ import annotations

import dataclasses

from cryobox.agentapi.models_templates import BuildSpec, TemplateBuild
from cryobox.image.specs import CODE_INTERPRETER, TemplateSpec, derived_spec


def test_build_spec_has_every_field_of_the_template_spec() -> None:
    assert set(BuildSpec.model_fields) == {f.name for f in dataclasses.fields(TemplateSpec)}


def test_a_spec_survives_the_wire() -> None:
    spec = derived_spec(
        "tpl-x",
        CODE_INTERPRETER,
        packages=("jq",),
        pip=("six",),
        files={"/a": "b"},
        warmup=("true",),
        cpus=2,
        memory_mib=768,
    )
    sent = TemplateBuild(spec=BuildSpec.of(spec)).model_dump_json()
    assert TemplateBuild.model_validate_json(sent).spec.template_spec() == spec
