"""Shared-library dependencies of ELF files inside a root tree, read from their ``DT_NEEDED`` entries.

Nothing is executed: the files belong to a guest tree, not to the host. :func:`needed` parses one ELF64
little-endian file (the only kind a guest here has); :func:`resolve_closure` follows ``DT_NEEDED`` through the
tree's library directories the way the guest's dynamic loader would find them (symlinks resolved inside the
tree, an absolute link target taken relative to the tree's root).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable
from pathlib import Path

from ..errors import ImageBuildError

ELF_MAGIC = b"\x7fELF"
ELFCLASS64 = 2
ELFDATA2LSB = 1
PT_LOAD = 1
PT_DYNAMIC = 2
DT_NULL = 0
DT_NEEDED = 1
DT_STRTAB = 5
LIBRARY_DIRS = ("lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu", "lib64", "lib", "usr/lib")
"""Where Debian's loader finds libraries (its multiarch directories first), relative to the tree's root."""

_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_PHDR = struct.Struct("<IIQQQQQQ")
_DYN = struct.Struct("<qQ")


def is_elf(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(4) == ELF_MAGIC
    except OSError:
        return False


def needed(path: Path) -> list[str]:
    """The ``DT_NEEDED`` names of the ELF64 file at ``path`` (empty for a static file).

    :raises ImageBuildError: ``path`` is not a little-endian ELF64 file, or its dynamic section is malformed.
    """
    data = path.read_bytes()
    if data[:4] != ELF_MAGIC or data[4] != ELFCLASS64 or data[5] != ELFDATA2LSB:
        raise ImageBuildError(f"{path} is not a little-endian ELF64 file")
    try:
        fields = _EHDR.unpack_from(data, 0)
        phoff, phentsize, phnum = fields[5], fields[9], fields[10]
        loads: list[tuple[int, int, int]] = []  # (vaddr, offset, filesz)
        dynamic: tuple[int, int] | None = None
        for i in range(phnum):
            p_type, _flags, offset, vaddr, _paddr, filesz, _memsz, _align = _PHDR.unpack_from(
                data, phoff + i * phentsize
            )
            if p_type == PT_LOAD:
                loads.append((vaddr, offset, filesz))
            elif p_type == PT_DYNAMIC:
                dynamic = (offset, filesz)
        if dynamic is None:
            return []
        names: list[int] = []
        strtab = None
        offset, size = dynamic
        for pos in range(offset, offset + size, _DYN.size):
            tag, value = _DYN.unpack_from(data, pos)
            if tag == DT_NULL:
                break
            if tag == DT_NEEDED:
                names.append(value)
            elif tag == DT_STRTAB:
                strtab = _file_offset(loads, value)
        if strtab is None:
            raise ImageBuildError(f"{path} has a dynamic section without a string table")
        return [data[strtab + n : data.index(b"\0", strtab + n)].decode() for n in names]
    except (struct.error, ValueError, UnicodeDecodeError) as err:
        raise ImageBuildError(f"{path}: malformed ELF dynamic section ({err})") from err


def _file_offset(loads: list[tuple[int, int, int]], vaddr: int) -> int:
    for start, offset, size in loads:
        if start <= vaddr < start + size:
            return offset + vaddr - start
    raise ValueError(f"address {vaddr:#x} is in no loaded segment")


def in_tree(root: Path, path: Path, max_links: int = 40) -> Path:
    """``path`` (inside ``root``) with every symlink resolved as the guest would, staying inside ``root``.

    :raises ImageBuildError: a link loops or points outside ``root``.
    """
    root = root.resolve()
    parts = list(path.relative_to(root).parts) if path.is_absolute() else list(path.parts)
    done = root
    links = 0
    while parts:
        part = parts.pop(0)
        if part in ("", "."):
            continue
        if part == "/":  # an absolute link target: the tree's root
            done = root
            continue
        if part == "..":
            done = done.parent if done != root else root
            continue
        candidate = done / part
        if candidate.is_symlink():
            links += 1
            if links > max_links:
                raise ImageBuildError(f"too many symlinks resolving {path} in {root}")
            target = os.readlink(candidate)
            parts = list(Path(target).parts) + parts
            continue
        done = candidate
    if done != root and root not in done.parents:
        raise ImageBuildError(f"{path} resolves outside {root}")
    return done


def find_library(root: Path, name: str) -> Path | None:
    """Where the guest's loader would find library ``name`` in the tree at ``root`` (symlinks resolved)."""
    for directory in LIBRARY_DIRS:
        candidate = root / directory / name
        if candidate.exists() or candidate.is_symlink():
            resolved = in_tree(root, candidate)
            if resolved.is_file():
                return resolved
    return None


def resolve_closure(root: Path, files: Iterable[Path]) -> tuple[dict[str, Path], dict[Path, list[str]]]:
    """Every library the ELF ``files`` need, directly or not: ``({soname: file in the tree}, {file: [names the
    tree lacks]})``. A file whose needs cannot all be met is reported in the second map, not raised."""
    found: dict[str, Path] = {}
    missing: dict[Path, list[str]] = {}
    queue = [(f, f) for f in files]  # (the file asking, the top-level file it was needed for)
    seen: set[Path] = set()
    while queue:
        path, origin = queue.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in needed(path):
            if name in found:
                continue
            lib = find_library(root, name)
            if lib is None:
                missing.setdefault(origin, []).append(name)
                continue
            found[name] = lib
            queue.append((lib, origin))
    return found, missing
