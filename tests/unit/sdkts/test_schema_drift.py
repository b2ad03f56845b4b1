"""``sdk-ts/src/schema.ts`` is what ``npm run gen`` makes of the OpenAPI document the current API serves: the
document built in this process (:func:`cryobox.compose.openapi.document`, no server, no VMs) through the SDK's
own generator script, compared with the committed file."""

from __future__ import annotations

import subprocess
from pathlib import Path

from cryobox.compose import openapi
from tests.support.node import NODE, SDK_TS, node_env


def test_the_committed_types_are_the_served_documents(tmp_path: Path) -> None:
    document = tmp_path / "openapi.json"
    document.write_text(openapi.render(openapi.document()))
    generated = tmp_path / "schema.ts"
    subprocess.run(
        [str(NODE), "scripts/gen.mjs", "--openapi", str(document), "--out", str(generated)],
        cwd=SDK_TS,
        env=node_env(),
        check=True,
        timeout=120,
    )
    committed = (SDK_TS / "src" / "schema.ts").read_text()
    assert generated.read_text() == committed, (
        "sdk-ts/src/schema.ts is stale: the API's OpenAPI document changed; run `npm run gen` in sdk-ts/ and commit it"
    )


def test_the_document_is_the_public_api() -> None:
    paths = openapi.document()["paths"]
    assert "/v1/sandboxes/{sandbox_id}/exec/stream" in paths
    assert "/v1/sandboxes/{sandbox_id}/fork-tree" in paths
    assert not any(path.startswith("/e2b") for path in paths)
