"""The console's Dockerfile build form, server side: with a console session (cookie + CSRF token, as
``js/api.js`` sends it) the multipart POST the form makes (``name``, ``dockerfile``, ``build_args`` JSON, a
``context`` tar as a gzip Blob) starts a build, and the SSE log stream the log view opens with ``EventSource``
(cookie only) delivers its lines and a ``done`` event; without the CSRF token the POST is refused. The page's
script carries the form and the log view. (Not a browser test: the Playwright harness runs on ``cryobox serve``
with real VMs; this checks the same requests without a browser.)"""

from __future__ import annotations

import httpx

from cryobox.console import static as console_static
from tests.support.buildapp import BuildEnv, build_env, registry
from tests.support.contexttar import Member, context_tar

__all__ = ["build_env", "registry"]  # fixtures

DOCKERFILE = "FROM debian:bookworm\nARG V=1\nCOPY src/ /opt/src/\nRUN echo $V\n"


async def test_the_form_posts_a_dockerfile_build_and_the_log_view_streams_it(build_env: BuildEnv) -> None:
    tar = context_tar([Member("src/a.txt", b"a"), Member("src/deep/b.txt", b"b")], gzipped=True)
    async with httpx.AsyncClient(base_url=build_env.url, timeout=30) as browser:
        login = await browser.post("/ui/login", json={"api_key": build_env.key})
        assert login.status_code == 200, login.text
        csrf = login.json()["csrf_token"]
        form = {"name": "from-ui", "dockerfile": DOCKERFILE, "build_args": '{"V": "2"}'}
        files = {"context": ("ctx.tar.gz", tar, "application/gzip")}
        refused = await browser.post("/v1/templates/build", data=form, files=files)
        assert refused.status_code == 403 and refused.json()["code"] == "csrf"
        started = await browser.post("/v1/templates/build", data=form, files=files, headers={"X-CSRF-Token": csrf})
        assert started.status_code == 202, started.text
        build = started.json()
        stream = await browser.get(f"/v1/templates/from-ui/builds/{build['id']}/logs/stream")
    assert stream.status_code == 200 and stream.headers["content-type"].startswith("text/event-stream")
    assert stream.text.count("event: log") == 3 * 4 and "event: done" in stream.text
    assert build_env.recipes()[0].steps[-1].env == ("V=2",)


def test_the_templates_page_has_the_dockerfile_form_and_log_view() -> None:
    script = (console_static.STATIC_DIR / "js" / "pages" / "templates.js").read_text()
    for testid in ("dockerfile-form", "dockerfile-text", "dockerfile-context", "dockerfile-image", "build-log"):
        assert f'testid: "{testid}"' in script, testid
    assert "/v1/templates/build" in script and "new EventSource(" in script and "innerHTML" not in script
