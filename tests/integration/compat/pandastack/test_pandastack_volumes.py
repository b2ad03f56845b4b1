"""PandaStack's volumes on real VMs through its SDK (the installed ``pandastack`` 0.10.0, unchanged):
``client.volumes.create``, ``Sandbox.create(volumes=[{"name"}])`` (no path: mounted at ``/mnt/<name>``, the file
system labelled ``fcvol-<name>``), written, killed, read by a read-only sandbox after."""

from __future__ import annotations

import secrets

import pandastack

from cryobox.bench.server import ServeProcess


def test_pandastack_volumes_keep_data_across_sandboxes(server: ServeProcess) -> None:
    client = pandastack.Client(api_url=server.url, api_key=server.api_key, timeout=120)
    pandastack.set_default_client(client)
    name = f"ps{secrets.token_hex(3)}"
    client.volumes.create(name, size_mb=64)
    try:
        writer = pandastack.Sandbox.create(template="base", volumes=[{"name": name, "read_only": False}])
        try:
            label = writer.exec(f"blkid -o value -s LABEL $(findmnt -n -o SOURCE /mnt/{name})").stdout.strip()
            assert label == f"fcvol-{name}"
            writer.exec(f"echo from-pandastack > /mnt/{name}/note && sync", check=True)
        finally:
            writer.kill()
        reader = pandastack.Sandbox.create(template="base", volumes=[{"name": name, "readOnly": True}])
        try:
            assert reader.exec(f"cat /mnt/{name}/note").stdout == "from-pandastack\n"
            assert reader.exec(f"touch /mnt/{name}/x").exit_code != 0
        finally:
            reader.kill()
        assert client.volumes.get(name)["attached_to"] == []
    finally:
        client.volumes.delete(name)
