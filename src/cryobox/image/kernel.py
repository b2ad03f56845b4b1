"""Guest kernel: Debian's cloud kernel package, downloaded (never installed on the host) and unpacked.

The cache entry holds ``vmlinuz``, the virtio modules the initramfs needs (``modules/*.ko``) and
``modules.order`` listing them in load order (dependencies first: ``virtio.ko`` silently fails to load before
``virtio_ring.ko``). Dependencies are read from each module's ``.modinfo`` ``depends=`` string, so no ``depmod``
is needed on the host.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import ImageBuildError
from ..util.files import write_json_atomic
from ..util.proc import Progress, Runner, run
from .cache import ContentCache

META_PACKAGE = "linux-image-cloud-amd64"
# What the guest needs at boot, as roots of the dependency walk.
BOOT_MODULES = ("virtio_mmio", "virtio_blk", "virtio_console", "virtio_net", "virtio-rng")


@dataclass(frozen=True)
class KernelPackage:
    name: str
    version: str
    sha256: str


@dataclass(frozen=True)
class Kernel:
    path: Path

    @property
    def vmlinuz(self) -> Path:
        return self.path / "vmlinuz"

    @property
    def module_order(self) -> list[str]:
        return (self.path / "modules.order").read_text().split()

    @property
    def modules_dir(self) -> Path:
        return self.path / "modules"


def _field(text: str, name: str) -> str:
    match = re.search(rf"^{name}: (.+)$", text, re.MULTILINE)
    if not match:
        raise ImageBuildError(f"apt-cache show output has no {name} field")
    return match.group(1).strip()


def resolve_package(runner: Runner = run) -> KernelPackage:
    """Find the concrete kernel package behind the meta package, with the archive's checksum."""
    meta = runner(["apt-cache", "show", "--no-all-versions", META_PACKAGE])
    depends = _field(meta, "Depends")
    name = depends.split(",")[0].split()[0]
    info = runner(["apt-cache", "show", "--no-all-versions", name])
    return KernelPackage(name=name, version=_field(info, "Version"), sha256=_field(info, "SHA256"))


def module_dependencies(ko: Path) -> list[str]:
    match = re.search(rb"depends=([^\x00]*)\x00", ko.read_bytes())
    if not match:
        return []
    return [d.decode() for d in match.group(1).split(b",") if d]


def module_load_order(modules: dict[str, Path], roots: tuple[str, ...]) -> list[str]:
    """Topological order (dependencies first) of ``roots`` and everything they depend on."""
    order: list[str] = []

    def canonical(name: str) -> str:
        for candidate in (name, name.replace("_", "-"), name.replace("-", "_")):
            if candidate in modules:
                return candidate
        raise ImageBuildError(f"kernel module {name} not found in the kernel package")

    def visit(name: str, stack: tuple[str, ...]) -> None:
        name = canonical(name)
        if name in order:
            return
        if name in stack:
            raise ImageBuildError(f"module dependency cycle: {' -> '.join(stack + (name,))}")
        for dep in module_dependencies(modules[name]):
            visit(dep, stack + (name,))
        order.append(name)

    for root in roots:
        visit(root, ())
    return order


APT_STATE = (Path("/var/lib/apt/lists"), Path("/etc/apt/preferences"), Path("/etc/apt/preferences.d"))


def apt_fingerprint(paths: tuple[Path, ...] = APT_STATE) -> str:
    """What ``apt-cache show`` answers from: the package lists and the pinning files (name, size, mtime)."""
    entries: list[str] = []
    for root in paths:
        found = sorted(root.iterdir()) if root.is_dir() else [root] if root.exists() else []
        for path in found:
            with contextlib.suppress(OSError):
                st = path.stat()
                entries.append(f"{path}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha256("\n".join(entries).encode()).hexdigest()


def resolve_package_cached(memo: Path, runner: Runner = run, fingerprint: str | None = None) -> KernelPackage:
    """:func:`resolve_package`, remembered in ``memo`` until apt's package lists (or pins) change: two
    ``apt-cache show`` runs cost ~1 s of every agent start (7 s each on a loaded 2-core host)."""
    stamp = fingerprint if fingerprint is not None else apt_fingerprint()
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        saved = json.loads(memo.read_text())
        if saved["apt"] == stamp:
            return KernelPackage(**saved["package"])
    package = resolve_package(runner)
    memo.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(memo, {"apt": stamp, "package": asdict(package)})
    return package


def build_kernel(cache: ContentCache, progress: Progress, runner: Runner = run) -> Kernel:
    package = resolve_package_cached(cache.root / ".resolved-kernel.json", runner)
    inputs = {
        "package": package.name,
        "version": package.version,
        "sha256": package.sha256,
        "modules": BOOT_MODULES,
        "layout": 1,
    }

    def build(out: Path) -> None:
        progress(f"downloading {package.name} {package.version}")
        with unpacked_package(package, runner) as root:
            vmlinuz = next((root / "boot").glob("vmlinuz-*"))
            shutil.copy2(vmlinuz, out / "vmlinuz")
            modules = {p.stem: p for p in (root / "lib" / "modules").rglob("*.ko")}
            order = module_load_order(modules, BOOT_MODULES)
            (out / "modules").mkdir()
            for name in order:
                shutil.copy2(modules[name], out / "modules" / f"{name}.ko")
            (out / "modules.order").write_text("\n".join(order) + "\n")
            progress(f"kernel ready ({len(order)} boot modules: {' '.join(order)})")

    path, _ = cache.get_or_build("kernel", inputs, build)
    return Kernel(path)


@contextlib.contextmanager
def unpacked_package(package: KernelPackage, runner: Runner = run) -> Iterator[Path]:
    """The kernel package downloaded (never installed) and unpacked into a temporary root, removed on exit."""
    with tempfile.TemporaryDirectory(prefix="cryobox-kernel-") as tmp:
        work = Path(tmp)
        if _has_user("_apt"):  # apt downloads as _apt when it can write the target directory
            shutil.chown(work, user="_apt")
        runner(["apt-get", "download", f"{package.name}={package.version}"], cwd=work)
        debs = list(work.glob("*.deb"))
        if len(debs) != 1:
            raise ImageBuildError(f"expected one kernel .deb, found {debs}")
        runner(["dpkg-deb", "-x", str(debs[0]), str(work / "root")])
        yield work / "root"


def _has_user(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True
