"""OCI images made by the tests themselves (plain module): layer tars, OCI layouts, ``docker save`` archives.

:class:`LayoutWriter` writes an OCI image layout (``oci-layout``, ``index.json``, ``blobs/sha256/…``) blob by blob:
layers (plain, gzip or zstd), configs, manifests, indexes; :func:`busybox_files` is a root filesystem of the
host's static busybox (package ``busybox-static``). :func:`write_docker_archive` writes a legacy ``docker save``;
:func:`merge_docker_archives` one of several images; :func:`layout_tar` a tar of a layout (``skopeo``'s
``oci-archive:``).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zstandard

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER_TYPES = {
    "none": "application/vnd.oci.image.layer.v1.tar",
    "gzip": "application/vnd.oci.image.layer.v1.tar+gzip",
    "zstd": "application/vnd.oci.image.layer.v1.tar+zstd",
}
BUSYBOX = Path("/bin/busybox")

Files = Mapping[str, "bytes | Link"]


@dataclass(frozen=True)
class Link:
    """A symlink in a layer."""

    target: str


def digest(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def tar_bytes(files: Files) -> bytes:
    """A plain tar of ``files`` (path -> contents or :class:`Link`), deterministic (fixed mtimes, root-owned)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, content in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.mtime = 0
            if isinstance(content, Link):
                info.type, info.linkname = tarfile.SYMTYPE, content.target
                tar.addfile(info)
            else:
                info.size, info.mode = len(content), 0o755
                tar.addfile(info, io.BytesIO(content))
    return buf.getvalue()


def compress(data: bytes, compression: str) -> bytes:
    if compression == "gzip":
        return gzip.compress(data, mtime=0)
    if compression == "zstd":
        return zstandard.ZstdCompressor().compress(data)
    return data


def busybox_files(applets: tuple[str, ...] = ("sh", "echo")) -> Files:
    """``/bin/busybox`` (the host's static one) with ``/bin/<applet>`` linking to it for each of ``applets``."""
    return {"bin/busybox": BUSYBOX.read_bytes(), **{f"bin/{applet}": Link("busybox") for applet in applets}}


def image_config(diff_ids: list[str], *, arch: str = "amd64", **run: Any) -> dict[str, Any]:
    return {
        "architecture": arch,
        "os": "linux",
        "config": run,
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }


@dataclass
class LayoutWriter:
    root: Path
    refs: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        (self.root / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
        (self.root / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')

    def blob(self, data: bytes, media_type: str) -> dict[str, Any]:
        d = digest(data)
        (self.root / "blobs" / "sha256" / d.removeprefix("sha256:")).write_bytes(data)
        return {"mediaType": media_type, "digest": d, "size": len(data)}

    def image(
        self, layers: list[Files], *, compression: str = "gzip", arch: str = "amd64", **run: Any
    ) -> dict[str, Any]:
        """An image of ``layers`` (each a dict of files), its config's ``config`` being ``run``; its descriptor."""
        tars = [tar_bytes(files) for files in layers]
        layer_descs = [self.blob(compress(t, compression), LAYER_TYPES[compression]) for t in tars]
        config = self.blob(json.dumps(image_config([digest(t) for t in tars], arch=arch, **run)).encode(), OCI_CONFIG)
        manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": config, "layers": layer_descs}
        desc = self.blob(json.dumps(manifest).encode(), OCI_MANIFEST)
        desc["platform"] = {"os": "linux", "architecture": arch}
        return desc

    def index(self, manifests: list[dict[str, Any]]) -> dict[str, Any]:
        doc = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests}
        return self.blob(json.dumps(doc).encode(), OCI_INDEX)

    def tag(self, name: str, desc: dict[str, Any]) -> None:
        entry = {k: v for k, v in desc.items() if k != "platform"}
        entry["annotations"] = {"org.opencontainers.image.ref.name": name}
        self.refs.append(entry)
        doc = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": self.refs}
        (self.root / "index.json").write_text(json.dumps(doc))


def layout_tar(root: Path, path: Path) -> Path:
    """A tar of the OCI layout at ``root`` as ``tar -C root -cf path .`` writes it (names start ``./``)."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for file in sorted(root.rglob("*")):
            if file.is_file():
                tar.add(file, arcname=f"./{file.relative_to(root).as_posix()}")
    return path


def write_docker_archive(path: Path, layers: list[Files], *, tags: list[str], **run: Any) -> str:
    """A legacy ``docker save`` archive (``manifest.json``, ``<id>.json``, ``<id>/layer.tar``); the config digest."""
    tars = [tar_bytes(files) for files in layers]
    config = json.dumps(image_config([digest(t) for t in tars], **run)).encode()
    config_hex = digest(config).removeprefix("sha256:")
    members: dict[str, bytes] = {f"{config_hex}.json": config}
    names = []
    for n, data in enumerate(tars):
        layer_id = hashlib.sha256(f"layer{n}".encode() + data).hexdigest()
        members[f"{layer_id}/layer.tar"] = data
        names.append(f"{layer_id}/layer.tar")
    members["manifest.json"] = json.dumps(
        [{"Config": f"{config_hex}.json", "RepoTags": tags, "Layers": names}]
    ).encode()
    path.write_bytes(tar_bytes(dict(members)))
    return f"sha256:{config_hex}"


def merge_docker_archives(dest: Path, archives: list[Path]) -> Path:
    """One ``docker save`` tar holding the images of several (``manifest.json`` entries concatenated; a member
    more than one has, a layer or config named by its content, is written once)."""
    entries: list[Any] = []
    members: dict[str, bytes] = {}
    for path in archives:
        with tarfile.open(path) as tar:
            for member in tar.getmembers():
                stream = tar.extractfile(member) if member.isfile() else None
                if stream is None:
                    continue
                data = stream.read()
                if member.name == "manifest.json":
                    entries += json.loads(data)
                else:
                    members.setdefault(member.name, data)
    members["manifest.json"] = json.dumps(entries).encode()
    dest.write_bytes(tar_bytes(members))
    return dest


__all__ = [
    "Link",
    "LayoutWriter",
    "busybox_files",
    "compress",
    "digest",
    "layout_tar",
    "merge_docker_archives",
    "tar_bytes",
    "write_docker_archive",
]
