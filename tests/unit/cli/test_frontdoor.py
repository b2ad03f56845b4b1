"""``cryobox serve``/``control``'s front-door options (``cli/frontdoor.py``): checked before anything starts, a bad
one a usage error naming what is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from cryobox.cli.frontdoor import front_door
from cryobox.cli.main import app
from tests.support.internet_tls import Authority


def test_the_options_in_normal_form(tmp_path: Path) -> None:
    cert, key = Authority("cli", tmp_path).issue(["*.cbx.test"])
    domain, tls = front_door("CBX.Test.", cert, key, "0.0.0.0", 8443)
    assert domain == "cbx.test" and tls is not None
    assert (tls.host, tls.port, tls.cert, tls.key) == ("0.0.0.0", 8443, cert, key)
    assert front_door(None, None, None, "127.0.0.1", 443) == (None, None)


def test_bad_options_are_usage_errors(tmp_path: Path) -> None:
    cert, _ = Authority("cli", tmp_path).issue(["*.cbx.test"])
    with pytest.raises(typer.BadParameter, match="not a DNS name"):
        front_door("*.cbx.test", None, None, "127.0.0.1", 443)
    with pytest.raises(typer.BadParameter, match="cannot use TLS certificate"):
        front_door(None, cert, cert, "127.0.0.1", 443)  # the certificate given as its own key


def test_serve_refuses_them_before_starting(tmp_path: Path) -> None:
    done = CliRunner().invoke(app, ["serve", "--data-dir", str(tmp_path), "--sandbox-domain", "https://x.test"])
    assert done.exit_code == 2 and "not a DNS name" in done.output
    assert not (tmp_path / "api_key").exists()  # nothing started
    only_cert = CliRunner().invoke(
        app,
        ["control", "--data-dir", str(tmp_path), "--tls-cert", str(tmp_path / "c.pem")],
        env={"CRYOBOX_NODE_TOKEN": "t"},
    )
    assert only_cert.exit_code == 2 and "go together" in only_cert.output
