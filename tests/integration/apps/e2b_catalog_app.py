"""An application of E2B's SDK, run unchanged (its own virtualenv) against a control plane: it builds a template
twice with ``Template.build``, then reads the template catalog through the SDK's generated client (the one the SDK
itself uses, configured from the environment) and prints one JSON report line: for every call its status, the
class its response was parsed into, and what it said. ``argv[1]``: the template name."""

import datetime
import json
import sys
from typing import Any

from e2b import Template
from e2b.api import ApiClient
from e2b.api.client.api.templates import (
    get_default_templates,
    get_templates,
    get_templates_template_id,
    get_templates_template_id_builds_build_id_logs,
)
from e2b.api.client.models import (
    Error,
    LogLevel,
    LogsDirection,
    LogsSource,
    TemplateBuildLogsResponse,
    TemplateWithBuilds,
)
from e2b.api.client.models import Template as TemplateModel
from e2b.connection_config import ConnectionConfig


def kind(parsed: object) -> object:
    if isinstance(parsed, list):
        return [type(p).__name__ for p in parsed]
    return type(parsed).__name__


def main() -> None:
    name = sys.argv[1]
    report: dict[str, Any] = {}
    builds = []
    for command in ("echo one", "echo two"):
        info = Template.build(Template().from_debian_image("bookworm").run_cmd(command), name, cpu_count=2)
        builds.append(info.build_id)
    report["builds"] = builds
    client = ApiClient(ConnectionConfig())

    listed = get_templates.sync_detailed(client=client)
    report["list"] = {"status": listed.status_code, "kind": kind(listed.parsed)}
    if isinstance(listed.parsed, list):
        report["list"]["templates"] = [t.to_dict() for t in listed.parsed if isinstance(t, TemplateModel)]
    other = get_templates.sync_detailed(client=client, team_id="someone-else")
    report["other_team"] = {"status": other.status_code, "kind": kind(other.parsed)}
    if isinstance(other.parsed, Error):
        report["other_team"]["message"] = other.parsed.message
    defaults = get_default_templates.sync_detailed(client=client)
    report["defaults"] = {"status": defaults.status_code, "kind": kind(defaults.parsed)}
    if isinstance(defaults.parsed, list):
        report["defaults"]["ids"] = [t.template_id for t in defaults.parsed]
        report["defaults"]["is_default"] = [t.is_default for t in defaults.parsed]

    pages: list[dict[str, Any]] = []
    token = None
    while True:
        page = get_templates_template_id.sync_detailed(name, client=client, limit=1, next_token=token)
        entry: dict[str, Any] = {"status": page.status_code, "kind": kind(page.parsed)}
        if isinstance(page.parsed, TemplateWithBuilds):
            entry["template"] = page.parsed.to_dict()
        pages.append(entry)
        token = page.headers.get("x-next-token")
        if not token or len(pages) > 5:
            break
    report["pages"] = pages
    whole = get_templates_template_id.sync_detailed(name, client=client)
    report["whole"] = {"status": whole.status_code, "kind": kind(whole.parsed)}
    if isinstance(whole.parsed, TemplateWithBuilds):
        report["whole"]["builds"] = [str(b.build_id) for b in whole.parsed.builds]

    last = builds[-1]

    def logs(**params: Any) -> dict[str, Any]:
        got = get_templates_template_id_builds_build_id_logs.sync_detailed(name, last, client=client, **params)
        out: dict[str, Any] = {"status": got.status_code, "kind": kind(got.parsed)}
        if isinstance(got.parsed, TemplateBuildLogsResponse):
            out["logs"] = [e.to_dict() for e in got.parsed.logs]
        return out

    report["logs"] = logs()
    report["logs_first_two"] = logs(limit=2, source=LogsSource.PERSISTENT)
    report["logs_last_two"] = logs(limit=2, direction=LogsDirection.BACKWARD)
    report["logs_errors"] = logs(level=LogLevel.ERROR, source=LogsSource.TEMPORARY)
    lines = report["logs"].get("logs") or []
    if len(lines) > 2:  # from the third line's millisecond on
        third = datetime.datetime.fromisoformat(lines[2]["timestamp"])
        report["logs_from_cursor"] = logs(cursor=int(third.timestamp() * 1000), limit=100)
    print(json.dumps(report, default=str))


main()
