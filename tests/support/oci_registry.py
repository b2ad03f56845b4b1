"""A real OCI registry on loopback for tests (plain module): Debian's ``docker-registry`` (distribution 2.8).

:func:`run_registry` starts one on ``127.0.0.1:<free port>`` with its storage in a temporary directory and stops
it on exit (also after failures); with ``users`` it requires bearer tokens from a small token server this module
runs beside it (also on loopback): JWTs signed by a key whose self-signed certificate is the registry's
``rootcertbundle``, sent in the token's ``x5c`` header. :func:`push_layout` pushes an OCI layout with ``skopeo``.

Fixtures are shared by binding them into a test module under the name its tests ask for, e.g.
``oci_registry = oci_registry_support.oci_registry``; :attr:`OciRegistry.host` is ``127.0.0.1:<port>``.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import json
import secrets
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID

REGISTRY = "docker-registry"
SERVICE = "cryobox-test-registry"
ISSUER = "cryobox-test-tokens"


@dataclass
class OciRegistry:
    host: str
    """``127.0.0.1:<port>``"""
    users: dict[str, str] = field(default_factory=dict)
    """user -> password the token server accepts (empty: no auth at all)."""
    token_requests: list[str] = field(default_factory=list)
    tls: bool = False
    """HTTPS (a certificate of the test's CA) instead of plain HTTP."""
    """The ``scope`` of every token the token server issued (tests check a pull asked for one)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class _Signer:
    def __init__(self) -> None:
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ISSUER)])
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )

    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def token(self, subject: str, access: list[dict[str, object]]) -> str:
        der = self.cert.public_bytes(serialization.Encoding.DER)
        header = {"alg": "RS256", "typ": "JWT", "x5c": [base64.b64encode(der).decode()]}
        now = int(time.time())
        claims = {
            "iss": ISSUER,
            "sub": subject,
            "aud": SERVICE,
            "exp": now + 300,
            "nbf": now - 60,
            "iat": now,
            "jti": secrets.token_hex(8),
            "access": access,
        }
        signing = f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
        signature = self.key.sign(signing.encode(), padding.PKCS1v15(), hashes.SHA256())
        return f"{signing}.{_b64url(signature)}"


def _token_server(signer: _Signer, registry: OciRegistry) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            query = parse_qs(urlparse(self.path).query)
            user = self._user()
            if user is None:
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="tokens"')
                self.end_headers()
                return
            access: list[dict[str, object]] = []
            for scope in query.get("scope", []):
                kind, _, rest = scope.partition(":")
                name, _, actions = rest.rpartition(":")
                access.append({"type": kind, "name": name, "actions": actions.split(",")})
                registry.token_requests.append(scope)
            body = json.dumps({"token": signer.token(user, access), "expires_in": 300}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _user(self) -> str | None:
            auth = self.headers.get("Authorization", "")
            if not auth.startswith("Basic "):
                return None
            user, _, password = base64.b64decode(auth[6:]).decode().partition(":")
            return user if registry.users.get(user) == password else None

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's name
            pass

    return ThreadingHTTPServer(("127.0.0.1", 0), Handler)


@contextlib.contextmanager
def run_registry(users: dict[str, str] | None = None, tls: tuple[Path, Path] | None = None) -> Iterator[OciRegistry]:
    """A registry on loopback, stopped (and its storage removed) when the block ends; with ``tls`` (certificate and
    key files) it serves HTTPS."""
    if shutil.which(REGISTRY) is None:
        pytest.fail(f"{REGISTRY} is not installed (Debian package docker-registry; `make setup` installs it)")
    port = free_port()
    registry = OciRegistry(host=f"127.0.0.1:{port}", users=dict(users or {}), tls=tls is not None)
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="cbx-registry-")))
        http: dict[str, object] = {"addr": registry.host, "secret": secrets.token_hex(16)}
        if tls is not None:
            http["tls"] = {"certificate": str(tls[0]), "key": str(tls[1])}
        config: dict[str, object] = {
            "version": 0.1,
            "log": {"level": "warn", "accesslog": {"disabled": True}},
            "storage": {"filesystem": {"rootdirectory": str(work / "storage")}, "delete": {"enabled": True}},
            "http": http,
        }
        if users:
            signer = _Signer()
            (work / "tokens.pem").write_bytes(signer.pem())
            server = _token_server(signer, registry)
            thread = threading.Thread(target=server.serve_forever, name="oci-token-server", daemon=True)
            thread.start()
            stack.callback(thread.join, 10)
            stack.callback(server.server_close)
            stack.callback(server.shutdown)
            realm = f"http://127.0.0.1:{server.server_address[1]}/token"
            config["auth"] = {
                "token": {
                    "realm": realm,
                    "service": SERVICE,
                    "issuer": ISSUER,
                    "rootcertbundle": str(work / "tokens.pem"),
                }
            }
        (work / "config.yml").write_text(json.dumps(config))  # JSON is YAML
        log = stack.enter_context(open(work / "registry.log", "wb"))
        proc = subprocess.Popen([REGISTRY, "serve", str(work / "config.yml")], stdout=log, stderr=subprocess.STDOUT)
        stack.callback(_stop, proc)
        _wait_ready(registry, proc, work / "registry.log")
        yield registry


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def _wait_ready(registry: OciRegistry, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{REGISTRY} exited with {proc.returncode}: {log.read_text()[-2000:]}")
        with contextlib.suppress(httpx.HTTPError):
            scheme = "https" if registry.tls else "http"
            if httpx.get(f"{scheme}://{registry.host}/v2/", timeout=2, verify=False).status_code in (200, 401):
                return
        time.sleep(0.1)
    pytest.fail(f"{REGISTRY} did not answer on {registry.host}: {log.read_text()[-2000:]}")


def push_layout(registry: OciRegistry, layout: Path, tag: str, name: str, *, all_platforms: bool = False) -> None:
    """``skopeo copy oci:<layout>:<tag> docker://<registry>/<name>`` (plain HTTP, the first user's credentials)."""
    cmd = ["skopeo", "--insecure-policy", "copy", "--dest-tls-verify=false", "--quiet"]
    if all_platforms:
        cmd.append("--all")
    if registry.users:
        user, password = next(iter(registry.users.items()))
        cmd += ["--dest-creds", f"{user}:{password}"]
    cmd += [f"oci:{layout}:{tag}", f"docker://{registry.host}/{name}"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    if result.returncode != 0:
        pytest.fail(f"skopeo copy failed ({result.returncode}): {result.stderr[-2000:]}")


@pytest.fixture(scope="session")
def oci_registry() -> Iterator[OciRegistry]:
    """A registry without auth, shared by a session's tests (push under distinct names)."""
    with run_registry() as registry:
        yield registry


@pytest.fixture(scope="session")
def oci_registry_with_auth() -> Iterator[OciRegistry]:
    """A registry that wants bearer tokens; its token server accepts ``puller``/``secret-pw``."""
    with run_registry(users={"puller": "secret-pw"}) as registry:
        yield registry


__all__ = ["OciRegistry", "free_port", "oci_registry", "oci_registry_with_auth", "push_layout", "run_registry"]
