"""``npm pack`` of the TypeScript SDK makes an installable package: a copy of ``sdk-ts/`` is packed (``prepack``
builds ``dist/`` with tsc), the tarball is installed into an empty project, imported by node, and a consumer
compiled strict against its type declarations."""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
from pathlib import Path

from tests.support.node import NODE, SDK_TS, node_env, npm

CONSUMER = """
import { NotFound, Sandbox, type ExecResult, type SandboxInfo } from "cryobox";

export async function run(): Promise<ExecResult> {
  const sbx: Sandbox = await Sandbox.create({ template: "base", apiUrl: "http://127.0.0.1:9" });
  const info: SandboxInfo = sbx.info;
  if (info.status === "running") return sbx.exec("true", { timeoutSeconds: 5 });
  throw new NotFound("x");
}
"""


def _run(args: list[str], cwd: Path) -> str:
    done = subprocess.run(args, cwd=cwd, env=node_env(), capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout}{done.stderr}"
    return done.stdout


def test_the_packed_tarball_installs_imports_and_type_checks(tmp_path: Path) -> None:
    source = tmp_path / "sdk-ts"
    shutil.copytree(SDK_TS, source, ignore=shutil.ignore_patterns("node_modules", "dist", "build", "*.tgz"))
    (source / "node_modules").symlink_to(SDK_TS / "node_modules")
    packed = json.loads(_run(npm("pack", "--json", "--pack-destination", str(tmp_path)), source))
    tarball = tmp_path / packed[0]["filename"]
    with tarfile.open(tarball) as tar:
        names = set(tar.getnames())
    assert {"package/dist/index.js", "package/dist/index.d.ts", "package/dist/schema.d.ts"} <= names
    assert "package/README.md" in names
    assert not any("/test/" in name or name.endswith(".ts") and not name.endswith(".d.ts") for name in names)

    app = tmp_path / "app"
    app.mkdir()
    (app / "package.json").write_text(json.dumps({"name": "app", "private": True, "type": "module"}))
    _run(npm("install", "--no-audit", "--no-fund", "--offline", str(tarball)), app)
    script = (
        "import * as sdk from 'cryobox'; import net from 'node:net';"
        "const closed = net.createServer(); await new Promise((r) => closed.listen(0, '127.0.0.1', r));"
        "const { port } = closed.address(); await new Promise((r) => closed.close(r));"
        "const s = await sdk.Sandbox.connect('x', { apiUrl: `http://127.0.0.1:${port}`, retry: { budgetMs: 0 } })"
        ".catch((e) => e);"
        "console.log(JSON.stringify({ unavailable: s instanceof sdk.HostUnavailable, code: s.code,"
        " exports: ['Sandbox', 'Snapshots', 'Templates', 'Volumes', 'Pty', 'CryoboxError'].filter((n) => n in sdk) }));"
    )
    seen = json.loads(_run([str(NODE), "--input-type=module", "-e", script], app))
    assert seen == {
        "unavailable": True,
        "code": "capacity",
        "exports": ["Sandbox", "Snapshots", "Templates", "Volumes", "Pty", "CryoboxError"],
    }

    (app / "consumer.ts").write_text(CONSUMER)
    tsconfig = {
        "compilerOptions": {
            "strict": True,
            "module": "NodeNext",
            "moduleResolution": "NodeNext",
            "target": "ES2022",
            "lib": ["ES2022", "DOM"],
            "noEmit": True,
            "skipLibCheck": False,
            "types": [],
        },
        "files": ["consumer.ts"],
    }
    (app / "tsconfig.json").write_text(json.dumps(tsconfig))
    _run([str(NODE), str(SDK_TS / "node_modules" / "typescript" / "bin" / "tsc"), "-p", "tsconfig.json"], app)
