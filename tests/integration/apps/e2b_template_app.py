"""An application of E2B's template SDK, run unchanged (its own virtualenv) against a control plane: it builds a
template from a directory and prints one JSON report line. ``argv[1]``: the context directory; ``argv[2]``: the
template name; ``argv[3]``: ``ok`` or ``fail`` (the build is expected to fail)."""

import json
import sys

from e2b import Template, wait_for_port
from e2b.exceptions import BuildException


def main() -> None:
    context, name, expect = sys.argv[1], sys.argv[2], sys.argv[3]
    report = {}
    logs = []
    template = (
        Template(file_context_path=context)
        .from_debian_image("bookworm")
        .copy("app", "/app")
        .run_cmd("pip install -r /app/requirements.txt")
        .set_envs({"MODE": "prod"})
        .set_workdir("/app")
        .set_user("user")
        .set_start_cmd("python3 -m http.server 8000", wait_for_port(8000))
    )
    report["exists_before"] = Template.alias_exists(name)
    try:
        info = Template.build(
            template,
            name,
            cpu_count=1,
            memory_mb=512,
            on_build_logs=lambda e: logs.append({"level": e.level, "message": e.message}),
        )
        report["build"] = {"template_id": info.template_id, "build_id": info.build_id, "tags": info.tags}
    except BuildException as err:
        report["build_error"] = str(err)
    report["logs"] = logs
    report["exists_after"] = Template.alias_exists(name)
    report["unknown_exists"] = Template.alias_exists("no-such-template")
    if expect == "ok":
        report["tags"] = [t.tag for t in Template.get_tags(name)]
    print(json.dumps(report))


main()
