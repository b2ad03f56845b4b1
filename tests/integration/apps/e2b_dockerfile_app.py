"""An application of E2B's template SDK, run unchanged (its own virtualenv) against cryobox on real VMs: it builds
a template from a Dockerfile (COPY, RUN apt-get install, ENV, WORKDIR, USER) with a start command and a ready
check, creates a sandbox from it and reports what holds there, as one JSON line.

``argv``: context directory, template name, extra last RUN (``-`` for none), ``create`` or ``build-only``."""

import json
import sys
import time

from e2b import Sandbox, Template, wait_for_port
from e2b.exceptions import BuildException

DOCKERFILE = """\
FROM debian:bookworm
RUN apt-get update && apt-get install -y --no-install-recommends jq && rm -rf /var/lib/apt/lists/*
COPY app/ /srv/app/
ENV GREETING="hello from a dockerfile"
WORKDIR /srv/app
RUN chown -R user:user /srv/app && echo "built by $(id -un)" > /srv/app/built.txt
USER user
"""


def main() -> None:
    context, name, extra, mode = sys.argv[1:5]
    dockerfile = DOCKERFILE + (f"RUN {extra}\n" if extra != "-" else "")
    logs = []
    report = {"exists_before": Template.alias_exists(name)}
    template = (
        Template(file_context_path=context)
        .from_dockerfile(dockerfile)
        .set_start_cmd("python3 -m http.server 8000", wait_for_port(8000))
    )
    started = time.monotonic()
    try:
        info = Template.build(
            template, name, cpu_count=1, memory_mb=512, on_build_logs=lambda e: logs.append(e.message)
        )
        report["build"] = {"template_id": info.template_id, "build_id": info.build_id}
    except BuildException as err:
        report["build_error"] = str(err)
    report["build_s"] = round(time.monotonic() - started, 1)
    report["logs"] = logs
    report["exists_after"] = Template.alias_exists(name)
    if mode == "create" and "build" in report:
        started = time.monotonic()
        sbx = Sandbox.create(name, timeout=300)
        report["create_s"] = round(time.monotonic() - started, 3)
        try:
            # first thing after create: the start command is already serving
            fetch = sbx.commands.run(
                'python3 -c "import urllib.request; '
                "print(urllib.request.urlopen('http://127.0.0.1:8000/hello.txt', timeout=5).read().decode(), end='')\""
            )
            report["served"] = fetch.stdout
            probe = sbx.commands.run('pwd; id -un; echo "$GREETING"; jq -n \'{"a": 1}\' -c; cat built.txt')
            report["probe"] = probe.stdout.splitlines()
            report["as_root"] = sbx.commands.run("id -un", user="root").stdout.strip()
            host = sbx.get_host(8000)
            report["host"] = host
        finally:
            sbx.kill()
    print(json.dumps(report))


try:
    main()
except Exception as err:  # the report says what broke
    print(json.dumps({"error": repr(err)}))
    raise
