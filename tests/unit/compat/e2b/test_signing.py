"""E2B's signed file URLs (``compat/e2b/signing.py``): the signature is byte for byte the SDK's (vectors made with
the pinned ``e2b`` SDK's ``get_signature``), and ``check`` refuses every tampered field, a swapped operation, another
sandbox's token and an expired URL, on an injected clock."""

from __future__ import annotations

import dataclasses

import pytest

from cryobox.compat.e2b.signing import FileSignature, check, from_query, parse_expiration, sign
from cryobox.errors import InvalidArgument, Unauthorized

TOKEN = "tok-123"
NOW = 1_700_000_000.7

# e2b 2.63: get_signature("/home/user/a b/ü.txt", "read", None, "tok-123") and, at time.time() == NOW,
# get_signature("x.txt", "write", "root", "tok-123", 60)
SDK_READ = "v1_xEbA8mWPY/s2UHyd470MeVqxcRQPG6eM0uFmAsqCdXA"
SDK_WRITE = "v1_gvWS9rT3BBo9cfkBPTQZUahsl8N2LRUu0NkewzW2ZIc"


def test_signatures_are_the_sdks() -> None:
    assert sign("/home/user/a b/ü.txt", "read", "", TOKEN) == SDK_READ
    assert sign("x.txt", "write", "root", TOKEN, 1_700_000_060) == SDK_WRITE


def claim(**changes: object) -> FileSignature:
    good = FileSignature("x.txt", "write", "root", SDK_WRITE, 1_700_000_060)
    return dataclasses.replace(good, **changes)  # type: ignore[arg-type]


def test_a_good_signature_passes_until_its_expiry_second_ends() -> None:
    check(claim(), [TOKEN], NOW)
    check(claim(), [TOKEN], 1_700_000_060.99)  # envd: expired once expiration < now's whole second
    with pytest.raises(Unauthorized, match="expired"):
        check(claim(), [TOKEN], 1_700_000_061.0)  # expired by 1 s
    check(FileSignature("/home/user/a b/ü.txt", "read", "", SDK_READ), [TOKEN], 4e9)  # no expiration: none


def test_a_rotated_key_keeps_signatures_made_with_the_old_token() -> None:
    check(claim(), ["new-token", TOKEN], NOW)
    with pytest.raises(Unauthorized, match="invalid signature"):
        check(claim(), ["new-token"], NOW)
    with pytest.raises(Unauthorized):
        check(claim(), [], NOW)


@pytest.mark.parametrize(
    "changes",
    [
        {"path": "y.txt"},
        {"path": "/home/root/x.txt"},
        {"operation": "read"},  # a write URL's signature on a download
        {"username": ""},
        {"username": "user"},
        {"expiration": 1_700_000_061},  # pushed later
        {"expiration": None},  # dropped: a signature made with one needs it
        {"signature": SDK_WRITE[:-1] + "A"},
        {"signature": SDK_WRITE + "="},
        {"signature": SDK_WRITE.removeprefix("v1_")},
        {"signature": ""},
        {"signature": "v1_ü"},
    ],
)
def test_any_tampered_field_is_an_invalid_signature(changes: dict[str, object]) -> None:
    with pytest.raises(Unauthorized, match="invalid signature"):
        check(claim(**changes), [TOKEN], NOW)


def test_another_sandboxes_token_and_a_read_signature_on_a_write_are_refused() -> None:
    with pytest.raises(Unauthorized):
        check(claim(), ["tok-of-another-sandbox"], NOW)
    read = FileSignature("/home/user/a b/ü.txt", "write", "", SDK_READ)
    with pytest.raises(Unauthorized):
        check(read, [TOKEN], NOW)


def test_the_query_becomes_the_claim() -> None:
    query = {"path": "x.txt", "username": "root", "signature": SDK_WRITE, "signature_expiration": "1700000060"}
    assert from_query(query, "write") == claim()
    assert from_query({"path": "a"}, "read") is None  # no signature: the token's business
    assert from_query({"signature": "s"}, "read") == FileSignature("", "read", "", "s", None)
    assert from_query({"signature": "s", "signature_expiration": "+0060"}, "read") == FileSignature(
        "", "read", "", "s", 60
    )  # what Go's strconv.ParseInt reads, signed as Go formats it


@pytest.mark.parametrize("raw", ["", "soon", "1.5", "1e9", " 60", "60 ", "0x10", "9223372036854775808", "١٢"])
def test_a_malformed_expiration_is_a_400_naming_it(raw: str) -> None:
    with pytest.raises(InvalidArgument, match="signature_expiration"):
        parse_expiration(raw)
    with pytest.raises(InvalidArgument):
        from_query({"signature": SDK_WRITE, "signature_expiration": raw}, "write")


def test_expirations_go_accepts() -> None:
    assert parse_expiration("-1") == -1 and parse_expiration("9223372036854775807") == (1 << 63) - 1
