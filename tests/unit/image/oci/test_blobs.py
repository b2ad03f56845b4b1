"""Streaming blobs: digest checks, size limits (a gzip bomb stops at its limit), gzip and zstd to plain tars."""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path

import pytest
import zstandard

from cryobox.errors import ImageDigestMismatch, ImagePullFailed, ImageTooLarge, InvalidArgument
from cryobox.image.oci.blobs import write_blob
from cryobox.image.oci.decompress import decompress_layer
from cryobox.image.oci.limits import ByteLimit, ImageLimits, tightest
from tests.support.oci import compress, digest, tar_bytes

TAR = tar_bytes({"etc/hello": b"hello\n" * 1000})
GZ = "application/vnd.oci.image.layer.v1.tar+gzip"


def test_write_blob_verifies_the_digest(tmp_path: Path) -> None:
    dest = tmp_path / "blob"
    assert write_blob([TAR[:100], TAR[100:]], dest, digest(TAR), limit=ByteLimit("x", 10**9), what="b") == len(TAR)
    assert dest.read_bytes() == TAR
    with pytest.raises(ImageDigestMismatch) as info:
        write_blob([TAR + b"x"], tmp_path / "bad", digest(TAR), limit=ByteLimit("x", 10**9), what="layer 1")
    assert info.value.details == {"expected": digest(TAR), "actual": digest(TAR + b"x")}
    assert list(tmp_path.iterdir()) == [dest]  # nothing of the bad blob is left


def test_write_blob_stops_at_its_limit(tmp_path: Path) -> None:
    def endless() -> Iterator[bytes]:
        while True:
            yield b"\0" * 65536

    with pytest.raises(ImageTooLarge) as info:
        write_blob(
            endless(), tmp_path / "b", digest(b""), limit=ByteLimit("max_layer_compressed_bytes", 10**6), what="x"
        )
    assert info.value.details == {"limit": "max_layer_compressed_bytes", "max": 10**6}
    assert "max_layer_compressed_bytes" in info.value.message
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("compression", "media_type"),
    [
        ("gzip", GZ),
        ("zstd", "application/vnd.oci.image.layer.v1.tar+zstd"),
        ("none", "application/vnd.oci.image.layer.v1.tar"),
    ],
)
def test_decompress(tmp_path: Path, compression: str, media_type: str) -> None:
    (tmp_path / "blob").write_bytes(compress(TAR, compression))
    out = decompress_layer(
        tmp_path / "blob",
        tmp_path / "l.tar",
        media_type=media_type,
        limit=ByteLimit("max_layer_bytes", 10**9),
        what="layer",
    )
    assert (tmp_path / "l.tar").read_bytes() == TAR
    assert out.diff_id == digest(TAR) and out.size == len(TAR) and out.compression == compression


def test_multi_member_gzip_and_multi_frame_zstd(tmp_path: Path) -> None:
    (tmp_path / "gz").write_bytes(gzip.compress(TAR[:5000]) + gzip.compress(TAR[5000:]))
    (tmp_path / "zst").write_bytes(
        zstandard.ZstdCompressor().compress(TAR[:5000]) + zstandard.ZstdCompressor().compress(TAR[5000:])
    )
    for name in ("gz", "zst"):
        decompress_layer(
            tmp_path / name, tmp_path / f"{name}.tar", media_type="", limit=ByteLimit("m", 10**9), what="l"
        )
        assert (tmp_path / f"{name}.tar").read_bytes() == TAR


def test_a_gzip_bomb_stops_at_the_limit(tmp_path: Path) -> None:
    # 256 MiB of zeros in ~256 KiB of gzip, written in pieces (the test never holds it all)
    raw = tmp_path / "bomb.gz"
    with gzip.open(raw, "wb", compresslevel=9) as bomb:
        chunk = b"\0" * (16 << 20)
        for _ in range(16):
            bomb.write(chunk)
    assert raw.stat().st_size < 1 << 20
    limit = ByteLimit("max_layer_bytes", 8 << 20)
    with pytest.raises(ImageTooLarge) as info:
        decompress_layer(raw, tmp_path / "out.tar", media_type=GZ, limit=limit, what="layer 1")
    assert info.value.details["limit"] == "max_layer_bytes"
    assert not (tmp_path / "out.tar").exists() and not list(tmp_path.glob(".*part"))


def test_corrupt_gzip(tmp_path: Path) -> None:
    data = bytearray(gzip.compress(TAR))
    data[len(data) // 2] ^= 0xFF
    (tmp_path / "blob").write_bytes(bytes(data))
    with pytest.raises(ImagePullFailed, match="not valid gzip"):
        decompress_layer(tmp_path / "blob", tmp_path / "l.tar", media_type=GZ, limit=ByteLimit("m", 10**9), what="l")
    assert not (tmp_path / "l.tar").exists()


def test_limits() -> None:
    limits = ImageLimits(max_layer_bytes=100, max_total_bytes=250)
    total = limits.limit("max_total_bytes").after(200)
    assert tightest(limits.limit("max_layer_bytes"), total).name == "max_total_bytes"
    with pytest.raises(ImageTooLarge, match="200 of it taken by earlier layers"):
        total.check(60, "layer 3")
    with pytest.raises(ImageTooLarge) as info:
        ImageLimits(max_layers=2).check_layer_count(3)
    assert info.value.details == {"limit": "max_layers", "max": 2} and info.value.http_status == 413
    env = {"CRYOBOX_IMAGE_MAX_LAYERS": "7", "CRYOBOX_IMAGE_MAX_TOTAL_BYTES": "1000"}
    assert ImageLimits.from_env(env) == ImageLimits(max_layers=7, max_total_bytes=1000)
    with pytest.raises(InvalidArgument):
        ImageLimits.from_env({"CRYOBOX_IMAGE_MAX_LAYERS": "-1"})
