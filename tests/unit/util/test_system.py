"""Child processes of the agent do not inherit the control plane's secrets."""

from __future__ import annotations

import pytest

from cryobox.util.system import CONTROL_SECRETS, scrubbed_env


def test_helpers_lose_the_secrets_and_keep_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in CONTROL_SECRETS:
        monkeypatch.setenv(name, "s3cret")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "store-credential")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    env = scrubbed_env()
    assert not set(CONTROL_SECRETS) & set(env)
    assert env["AWS_SECRET_ACCESS_KEY"] == "store-credential"  # the memory server reads the store
    assert scrubbed_env(minimal=True) == {"PATH": "/usr/bin:/bin"}  # an unjailed QEMU needs nothing else
    assert "CRYOBOX_SECRET_KEY" in CONTROL_SECRETS and "CRYOBOX_API_KEY" in CONTROL_SECRETS
