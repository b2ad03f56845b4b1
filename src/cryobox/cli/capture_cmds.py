"""``cryobox capture``: run a test command in a sandbox and keep the machine when it fails or hangs.

Thin: the logic is :class:`cryobox.capture.runner.CaptureRunner`.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer

from ..errors import CryoboxError
from ._common import ApiKey, ApiUrl, Json, err, fail, print_json


def join_command(words: list[str]) -> str:
    """One word is taken as a shell command as is (``-- 'make test && echo ok'``); several are quoted and joined."""
    return words[0] if len(words) == 1 else shlex.join(words)


def capture(
    command: Annotated[list[str], typer.Argument(help="the test command (after --)", show_default=False)],
    template: Annotated[str, typer.Option("--template", "-t", help="template of the sandbox")] = "base",
    setup: Annotated[str | None, typer.Option(help="command run in /work before the test")] = None,
    upload: Annotated[Path, typer.Option(help="project directory uploaded to /work")] = Path("."),
    timeout: Annotated[float, typer.Option(help="seconds before the test counts as hung")] = 600.0,
    ttl: Annotated[int, typer.Option(help="time to live of the sandbox (a kept failure lives this long)")] = 3600,
    seed: Annotated[int | None, typer.Option(help="exported to the test as CRYOBOX_SEED")] = None,
    as_json: Json = False,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
) -> None:
    """Run a test command in a fresh sandbox; a failure or hang is snapshotted (retained) for `cryobox debug`.

    Exit code: the test's; 124 for a hang; 3 when --setup failed.
    """
    from ..capture.runner import CaptureOptions, sdk_runner

    if not upload.is_dir():
        raise typer.BadParameter(f"--upload {upload} is not a directory")
    options = CaptureOptions(
        template=template,
        command=join_command(command),
        upload=upload.resolve(),
        setup=setup,
        timeout_s=timeout,
        ttl_s=ttl,
        seed=seed,
    )
    try:
        with sdk_runner(api_url, api_key, log=lambda line: err.print(f"cryobox: {line}", highlight=False)) as runner:
            result = runner.run(options)
    except CryoboxError as error:
        fail(error)
    log_stream = sys.stderr if as_json else sys.stdout
    if result.outcome == "setup_failed":
        log_stream.write(result.setup_output)
    else:
        log_stream.write(result.log.decode(errors="replace"))
    log_stream.flush()
    for note in result.notes:
        err.print(f"cryobox: {note}", highlight=False)
    if as_json:
        print_json(result.to_json())
    elif result.outcome == "passed":
        err.print(f"cryobox: passed in {result.duration_s:.1f} s (sandbox killed, nothing kept)", highlight=False)
    elif result.outcome == "setup_failed":
        err.print(f"cryobox: setup failed with exit code {result.exit_code}; sandbox killed", highlight=False)
    else:
        what = "hung" if result.outcome == "hang" else f"failed with exit code {result.exit_code}"
        snap = result.snapshot_id
        err.print(
            f"cryobox: test {what}; captured the running machine as snapshot {snap}\n"
            f"  sandbox {result.sandbox_id} stays up until its TTL ({ttl} s)\n"
            f"  restore: cryobox debug {snap}   or   cryobox sandbox create --from-snapshot {snap}\n"
            f"  evidence: cryobox snapshot evidence {snap} --out DIR",
            highlight=False,
        )
    raise typer.Exit(result.exit_status)
