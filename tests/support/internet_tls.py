"""TLS for the stand-in internet (:mod:`tests.support.internet`): a throwaway CA made at start and the leaf
certificates it signs, so HTTPS tests verify for real (a proxy that forgot to check certificates, or that sent the
wrong SNI, fails against them), and a server side that records the SNI every handshake carried."""

from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl
import threading
from collections.abc import Iterable
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALID = datetime.timedelta(days=2)
_SKEW = datetime.timedelta(hours=1)  # a client clock slightly behind still accepts a certificate made just now


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


class Authority:
    """A CA that lives as long as one stand-in internet; its certificate is what clients are told to trust."""

    def __init__(self, label: str, directory: Path) -> None:
        self._dir = directory
        self._key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"cryobox test internet CA {label}")])
        now = datetime.datetime.now(datetime.UTC)
        public = self._key.public_key()
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _SKEW)
            .not_valid_after(now + _VALID)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        self.pem = self.cert.public_bytes(serialization.Encoding.PEM)
        self.file = directory / "ca.pem"
        self.file.write_bytes(self.pem)
        self._issued = 0
        self._lock = threading.Lock()

    def issue(self, names: Iterable[str], ips: Iterable[str] = ()) -> tuple[Path, Path]:
        """A leaf for ``names`` (DNS) and ``ips``, written out as (certificate, key) files: :mod:`ssl` loads a
        certificate chain only from files."""
        key = ec.generate_private_key(ec.SECP256R1())
        dns_names = sorted(set(names))
        alt: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
        alt += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns_names[0] if dns_names else "internet")])
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _SKEW)
            .not_valid_after(now + _VALID)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(alt), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        with self._lock:
            self._issued += 1
            serial = self._issued
        cert_file, key_file = self._dir / f"leaf{serial}.pem", self._dir / f"leaf{serial}.key"
        cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM) + self.pem)
        key_file.write_bytes(_pem_key(key))
        return cert_file, key_file


def _server_context(cert_file: Path, key_file: Path) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert_file, key_file)
    ctx.set_alpn_protocols(["http/1.1"])  # a client offering h2 settles on what the servers speak
    return ctx


class ServerTls:
    """The HTTPS servers' side of TLS. One certificate covers every name the internet knows at start (and its
    server addresses, for clients that send no SNI); a name added later gets a certificate of its own the first
    time a client asks for it. The SNI of every handshake is recorded for the handler to report."""

    def __init__(self, authority: Authority, names: Iterable[str], ips: Iterable[str]) -> None:
        self._authority = authority
        self._covered = {n.lower() for n in names}
        self._default = _server_context(*authority.issue(self._covered, ips))
        self._default.sni_callback = self._on_sni
        self._lock = threading.Lock()
        self._extra: dict[str, ssl.SSLContext] = {}
        self._sni: dict[int, str] = {}

    def wrap(self, sock: socket.socket) -> ssl.SSLSocket:
        """``sock`` as a server-side TLS socket, handshake not yet done (the caller tracks it first, so stopping
        the internet interrupts a handshake a client never finishes)."""
        return self._default.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)

    def handshake(self, tls: ssl.SSLSocket) -> str | None:
        """Complete the handshake; returns the SNI the client sent (None: it sent none)."""
        try:
            tls.do_handshake()
        finally:
            with self._lock:
                sni = self._sni.pop(id(tls), None)
        return sni

    def _on_sni(self, conn: ssl.SSLObject, server_name: str | None, _ctx: ssl.SSLContext) -> None:
        # ``conn`` is the SSLSocket being handshaken (typeshed calls it an SSLObject)
        if server_name is None:
            return
        name = server_name.lower().rstrip(".")
        with self._lock:
            self._sni[id(conn)] = server_name
        if name not in self._covered:
            conn.context = self._context_for(name)

    def _context_for(self, name: str) -> ssl.SSLContext:
        with self._lock:
            found = self._extra.get(name)
        if found is None:
            found = _server_context(*self._authority.issue([name]))
            with self._lock:
                found = self._extra.setdefault(name, found)
        return found
