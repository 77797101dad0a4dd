"""The VM lab's guest image: an uncompressed kernel and an initramfs, built from
Debian packages and this tree, cached by a hash over every input.

    image = vmimage.ensure(vmimage.Options(...))   # build when the key is new
    image.vmlinux, image.initramfs, image.manifest

Inputs (docs/lab/vmlab.md): the kernel package named in vmlab/guest/packages.txt
(`apt-get download`ed into CACHE/debs and unpacked with dpkg-deb -x, never
installed), its vmlinux (the bzImage payload, decompressed here), the modules of
vmlab/guest/modules.txt with their dependencies (read from each .ko's .modinfo),
busybox and fio from installed packages (fio with the libraries ldd names), the
static tierfs and tierprobe (TIERFS_STATIC=ON build) and vmlab/guest/init.

Invariants: the cache key is the SHA-256 of a canonical list of every input
(contents, not timestamps) and of this file, and what is packed is the bytes
the key hashed (each input is checked again as it is packed); an image
directory is complete only when its manifest.json exists (built aside and
renamed into place); an image a process holds (hold_image) is never removed,
neither by prune() nor by --rebuild; the initramfs is byte-for-byte a function
of the inputs (sorted entries, uid 0, mtime 0); an image whose artifacts do not
match its manifest is refused, never booted. Every mistake is a LabError with
one line."""

from __future__ import annotations

import fcntl
import gzip
import hashlib
import json
import lzma
import os
import re
import shutil
import struct
import subprocess
import tempfile
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable

from tierlab import REPO_ROOT, LabError

GUEST_DIR = REPO_ROOT / "vmlab" / "guest"
# Bump when the image layout changes in a way the builder's source hash would
# not show (it always does today; kept for the manifest).
FORMAT = 1


def build_root() -> Path:
    return Path(os.environ.get("TIERFS_BUILD", REPO_ROOT / "build"))


def default_cache() -> Path:
    return build_root() / "vmlab"


def default_static() -> Path:
    """The static build ctest's static_build makes too (scripts/check-static-build,
    same flags), so that `make test` compiles the static programs once."""
    return build_root() / "static"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(1 << 20)
            if not b:
                return h.hexdigest()
            h.update(b)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ------------------------------------------------------------------ guest lists

@dataclass
class PackageLine:
    kind: str        # kernel | busybox | program
    package: str     # Debian package ("-": a file of no package, for tests)
    path: str = ""   # busybox/program: the file on the host


def read_guest_file(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise LabError(f"{path}: cannot read ({e.strerror})") from None


def read_packages(path: Path, data: bytes | None = None) -> list[PackageLine]:
    """vmlab/guest/packages.txt (or `data`, its bytes as read): `kernel PKG`,
    `busybox PKG PATH`, `program PKG PATH`."""
    text = (read_guest_file(path) if data is None else data).decode(errors="replace")
    out: list[PackageLine] = []
    for n, raw in enumerate(text.splitlines(), 1):
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        kind = words[0]
        want = {"kernel": 2, "busybox": 3, "program": 3}.get(kind)
        if want is None:
            raise LabError(f"{path}:{n}: unknown kind '{kind}' (kernel, busybox or program)")
        if len(words) != want:
            raise LabError(f"{path}:{n}: '{kind}' takes {want - 1} fields, got {len(words) - 1}")
        out.append(PackageLine(kind, words[1], words[2] if want == 3 else ""))
    for kind in ("kernel", "busybox"):
        if sum(p.kind == kind for p in out) != 1:
            raise LabError(f"{path}: needs exactly one '{kind}' line")
    return out


def read_modules(path: Path, data: bytes | None = None) -> list[str]:
    """vmlab/guest/modules.txt (or `data`, its bytes as read): one name a line."""
    text = (read_guest_file(path) if data is None else data).decode(errors="replace")
    names = []
    for n, raw in enumerate(text.splitlines(), 1):
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) != 1 or not re.fullmatch(r"[A-Za-z0-9_-]+", words[0]):
            raise LabError(f"{path}:{n}: want one module name per line, got '{raw.strip()}'")
        names.append(words[0].replace("-", "_"))
    return names


# ------------------------------------------------------------------ kernel

def run_tool(cmd: list[str], what: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    except FileNotFoundError:
        raise LabError(f"{what}: {cmd[0]} is not installed") from None
    return p


def last_error_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errs = [ln for ln in lines if ln.startswith("E:")]
    return (errs or lines or ["(no output)"])[-1][:300]


# A kernel line naming this metapackage means "the kernel it depends on now";
# the image's manifest records the package that was used.
KERNEL_META = "linux-image-amd64"


def current_kernel_package() -> str:
    """What linux-image-amd64 depends on now ('' when apt knows no such package)."""
    p = subprocess.run(["apt-cache", "depends", KERNEL_META], capture_output=True, text=True)
    m = re.search(r"Depends:\s*(linux-image-\S+)", p.stdout)
    return m.group(1) if m else ""


def resolve_kernel_package(package: str, log: Callable[[str], None]) -> str:
    """The kernel package to fetch: `package`, or for the metapackage the
    ABI package it depends on now (after one `apt-get update` when apt has no
    lists yet, as on a fresh machine; root only)."""
    if package != KERNEL_META:
        return package
    cur = current_kernel_package()
    if not cur and os.geteuid() == 0:
        log("apt knows no linux-image-amd64: apt-get update")
        run_tool(["apt-get", "update", "-q"], "apt-get update")
        cur = current_kernel_package()
    if not cur:
        raise LabError(f"apt-cache depends {KERNEL_META} names no kernel package: run apt-get update")
    log(f"kernel: {KERNEL_META} is {cur} now")
    return cur


def fetch_deb(package: str, debs: Path, log: Callable[[str], None] = lambda s: None) -> Path:
    """The package's .deb in `debs`, downloaded with apt-get when not there yet."""
    debs.mkdir(parents=True, exist_ok=True)
    have = sorted(debs.glob(f"{package}_*.deb"), key=lambda p: p.stat().st_mtime)
    if have:
        return have[-1]
    log(f"downloading {package} (apt-get download) into {debs}")
    # apt drops privileges to _apt for downloads, which cannot write a
    # directory root owns; download as the caller instead.
    p = run_tool(["apt-get", "download", "-q", "-o", "APT::Sandbox::User=root", package],
                 f"downloading {package}", cwd=debs)
    have = sorted(debs.glob(f"{package}_*.deb"))
    if p.returncode != 0 or not have:
        hint = "run apt-get update, or fix vmlab/guest/packages.txt"
        if package.startswith("linux-image-"):
            cur = current_kernel_package()
            if cur and cur != package:
                hint = f"the current kernel package is {cur} (apt-cache depends linux-image-amd64): " \
                       "set it in vmlab/guest/packages.txt"
        raise LabError(f"package {package} cannot be downloaded ({last_error_line(p.stderr)}); {hint}")
    return have[-1]


def deb_version(deb: Path) -> str:
    p = run_tool(["dpkg-deb", "-f", str(deb), "Version"], "reading a .deb")
    if p.returncode != 0:
        raise LabError(f"{deb}: not a readable .deb ({last_error_line(p.stderr)}); remove it to download again")
    return p.stdout.strip()


BZIMAGE_MAGICS: list[tuple[bytes, str]] = [
    (b"\xfd7zXZ\x00", "xz"),
    (b"\x1f\x8b", "gzip"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
]


def extract_vmlinux(bz: bytes) -> tuple[bytes, str]:
    """The ELF kernel inside a bzImage, and its compression.

    The x86 boot header (at 0x1f1; "HdrS" at 0x202) says where the protected
    mode code starts ((setup_sects + 1) * 512) and, from protocol 2.08 on, the
    compressed payload's offset and length within it (0x248, 0x24c). The
    payload's first bytes name the compressor."""
    if len(bz) < 0x250 or bz[0x202:0x206] != b"HdrS":
        raise LabError("the kernel is not a bzImage (no HdrS boot header)")
    version = struct.unpack_from("<H", bz, 0x206)[0]
    if version < 0x208:
        raise LabError(f"boot protocol {version >> 8}.{version & 0xff} has no payload fields (need 2.08)")
    setup_sects = bz[0x1f1] or 4
    offset, length = struct.unpack_from("<II", bz, 0x248)
    start = (setup_sects + 1) * 512 + offset
    payload = bz[start:start + length]
    for magic, kind in BZIMAGE_MAGICS:
        if payload.startswith(magic):
            break
    else:
        raise LabError(f"unknown kernel compression (payload starts {payload[:6].hex()})")
    try:
        if kind == "xz":
            elf = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(payload)
        elif kind == "gzip":
            # The kernel appends the uncompressed size after the gzip stream:
            # decompress one member and ignore what follows.
            elf = zlib.decompressobj(wbits=31).decompress(payload)
        else:
            try:
                import zstandard  # type: ignore[import-not-found]
            except ImportError:
                raise LabError("the kernel is zstd-compressed: install python3-zstandard") from None
            elf = zstandard.ZstdDecompressor().decompressobj().decompress(payload)
    except (lzma.LZMAError, zlib.error, OSError, EOFError) as e:
        raise LabError(f"the kernel's {kind} payload does not decompress ({e})") from None
    if not elf.startswith(b"\x7fELF"):
        raise LabError(f"the kernel's {kind} payload is not an ELF file")
    if not has_pvh_note(elf):
        raise LabError("the kernel has no PVH entry note (XEN_ELFNOTE_PHYS32_ENTRY): QEMU cannot boot it directly")
    return elf, kind


# ELF64 little-endian, enough to read sections: the header's e_shoff (0x28),
# e_shentsize (0x3a), e_shnum (0x3c), e_shstrndx (0x3e); each section header's
# name (0), type (4), offset (0x18), size (0x20).
def elf_sections(elf: bytes) -> list[tuple[str, int, bytes]]:
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    shoff = struct.unpack_from("<Q", elf, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3a)
    raw = []
    for i in range(shnum):
        name, typ, _flags, _addr, off, size = struct.unpack_from("<IIQQQQ", elf, shoff + i * shentsize)
        raw.append((name, typ, off, size))
    _, _, stroff, strsize = raw[shstrndx]
    strtab = elf[stroff:stroff + strsize]
    out = []
    for name, typ, off, size in raw:
        end = strtab.find(b"\0", name)
        body = b"" if typ == 8 else elf[off:off + size]   # SHT_NOBITS has no bytes
        out.append((strtab[name:end].decode(errors="replace"), typ, body))
    return out


XEN_ELFNOTE_PHYS32_ENTRY = 18


def has_pvh_note(elf: bytes) -> bool:
    try:
        sections = elf_sections(elf)
    except (ValueError, struct.error, IndexError):
        return False
    for _name, typ, body in sections:
        if typ != 7:  # SHT_NOTE
            continue
        pos = 0
        while pos + 12 <= len(body):
            namesz, descsz, ntype = struct.unpack_from("<III", body, pos)
            name = body[pos + 12:pos + 12 + namesz].rstrip(b"\0")
            if name == b"Xen" and ntype == XEN_ELFNOTE_PHYS32_ENTRY:
                return True
            pos += 12 + (namesz + 3) // 4 * 4 + (descsz + 3) // 4 * 4
    return False


def module_bytes(path: Path) -> bytes:
    data = path.read_bytes()
    if path.name.endswith(".xz"):
        return lzma.decompress(data)
    if path.name.endswith(".gz"):
        return gzip.decompress(data)
    if path.name.endswith(".zst"):
        try:
            import zstandard  # type: ignore[import-not-found]
        except ImportError:
            raise LabError(f"{path.name} is zstd-compressed: install python3-zstandard") from None
        return zstandard.ZstdDecompressor().decompressobj().decompress(data)
    return data


def module_depends(ko: bytes, name: str) -> list[str]:
    """The `depends=` of a module's .modinfo section (NUL-separated key=value)."""
    try:
        sections = elf_sections(ko)
    except (ValueError, struct.error, IndexError):
        raise LabError(f"module {name} is not an ELF object") from None
    for sname, _typ, body in sections:
        if sname == ".modinfo":
            for item in body.split(b"\0"):
                if item.startswith(b"depends="):
                    return [d.replace("-", "_") for d in item[8:].decode().split(",") if d]
            return []
    raise LabError(f"module {name} has no .modinfo section")


def module_name(path: Path) -> str:
    return path.name.split(".ko", 1)[0].replace("-", "_")


def resolve_modules(wanted: list[str], moddir: Path) -> tuple[list[tuple[str, bytes]], list[str]]:
    """The wanted modules and their dependencies, dependencies first (each once),
    as (name, uncompressed .ko); and the wanted names that are built in."""
    index = {module_name(p): p for p in moddir.rglob("*.ko*") if re.search(r"\.ko(\.(xz|gz|zst))?$", p.name)}
    builtin_file = moddir / "modules.builtin"
    builtin = set()
    if builtin_file.exists():
        builtin = {module_name(Path(ln.strip())) for ln in builtin_file.read_text().splitlines() if ln.strip()}
    order: list[tuple[str, bytes]] = []
    done: set[str] = set()
    built_in: list[str] = []

    def visit(name: str, by: str, stack: tuple[str, ...]) -> None:
        if name in done:
            return
        if name in stack:
            raise LabError(f"module dependency cycle: {' -> '.join(stack + (name,))}")
        if name not in index:
            if name in builtin:
                if not by:
                    built_in.append(name)
                done.add(name)
                return
            needed = f" (needed by {by})" if by else ""
            raise LabError(f"module {name}{needed} is not in the kernel package")
        ko = module_bytes(index[name])
        for dep in module_depends(ko, name):
            visit(dep, name, stack + (name,))
        done.add(name)
        order.append((name, ko))

    for w in wanted:
        visit(w, "", ())
    return order, built_in


# ------------------------------------------------------------------ host files

def dpkg_versions(packages: list[str]) -> dict[str, str]:
    """Installed versions of `packages` (one dpkg-query for all); a package that
    is not installed is an error naming it."""
    want = sorted(set(packages))
    if not want:
        return {}
    p = run_tool(["dpkg-query", "-W", "-f", "${Package}\t${Status}\t${Version}\n", *want],
                 "checking packages")
    found = {}
    for line in p.stdout.splitlines():
        parts = line.split("\t")
        if len(parts) == 3 and parts[1].endswith(" installed"):
            found[parts[0].split(":")[0]] = parts[2]
    for pkg in want:
        if pkg not in found:
            raise LabError(f"package {pkg} is not installed: run scripts/install-deps lab")
    return found


def file_packages(paths: list[str]) -> dict[str, str]:
    """The installed package owning each path ("-" for none), from one `dpkg -S`
    per spelling: ldd names /lib/... where a merged-/usr package may list
    /usr/lib/..., and the other way round."""
    owner: dict[str, str] = {}
    spellings = [list(paths), [p[4:] if p.startswith("/usr/") else "/usr" + p for p in paths]]
    for attempt in spellings:
        ask = [a for a, orig in zip(attempt, paths) if orig not in owner]
        back = {a: orig for a, orig in zip(attempt, paths)}
        if not ask:
            break
        p = subprocess.run(["dpkg", "-S", *ask], capture_output=True, text=True)
        for line in p.stdout.splitlines():
            pkgs, sep, path = line.partition(": ")
            if sep and path.strip() in back:
                owner[back[path.strip()]] = pkgs.split(",")[0].strip().split(":")[0]
    return {p: owner.get(p, "-") for p in paths}


def ldd_libraries(path: Path) -> list[str]:
    """Every library the dynamic loader would map for `path`, and the loader
    itself, as the paths ldd prints (empty for a static program)."""
    p = subprocess.run(["ldd", str(path)], capture_output=True, text=True)
    if p.returncode != 0:
        if "not a dynamic executable" in p.stdout + p.stderr:
            return []
        raise LabError(f"ldd {path} failed: {last_error_line(p.stdout + p.stderr)}")
    libs = []
    for line in p.stdout.splitlines():
        line = line.strip()
        if "not found" in line:
            raise LabError(f"{path} needs a library that is not installed: {line}")
        m = re.match(r"\S+ => (/\S+) \(", line) or re.match(r"(/\S+) \(", line)
        if m:
            libs.append(m.group(1))
    return libs


# ------------------------------------------------------------------ static binaries

STATIC_TARGETS = ("tierfs", "tierprobe")


STATIC_LOCK = ".static-build.lock"


def static_lock(out: Path) -> IO[str]:
    """Exclusive hold of the static build directory `out`: the image builder
    keeps it from building until it has packed the binaries, and
    scripts/check-static-build (ctest's static_build) takes the same lock
    (flock(1) on the same file), so neither sees the other's half-linked
    binaries. Closing the file releases it."""
    out.mkdir(parents=True, exist_ok=True)
    f = open(out / STATIC_LOCK, "w")
    fcntl.flock(f, fcntl.LOCK_EX)
    return f


def build_static(out: Path, log: Callable[[str], None]) -> None:
    """Configure and build the static targets into `out` (incremental). The
    flags are scripts/check-static-build's: the two share the directory.
    Call with static_lock(out) held."""
    cache = out / "CMakeCache.txt"
    if not cache.exists() or "CMAKE_BUILD_TYPE:STRING=RelWithDebInfo" not in cache.read_text(errors="replace"):
        log(f"configuring the static build in {out}")
        p = run_tool(["cmake", "-S", str(REPO_ROOT), "-B", str(out), "-DTIERFS_STATIC=ON",
                      "-DCMAKE_BUILD_TYPE=RelWithDebInfo"], "static build")
        if p.returncode != 0:
            raise LabError(f"configuring the static build failed: {last_error_line(p.stdout + p.stderr)}")
    log("building static tierfs and tierprobe (cmake --build, -j2)")
    p = run_tool(["cmake", "--build", str(out), "-j2", "--target", *STATIC_TARGETS], "static build")
    if p.returncode != 0:
        errs = [ln for ln in (p.stdout + p.stderr).splitlines() if "error" in ln.lower()]
        raise LabError(f"the static build failed: {(errs or [last_error_line(p.stdout + p.stderr)])[0][:300]}")


def static_binaries(bin_dir: Path) -> dict[str, Path]:
    out = {}
    for name in STATIC_TARGETS:
        p = bin_dir / name
        if not p.is_file():
            raise LabError(f"{p} is missing (build the static targets: cmake -DTIERFS_STATIC=ON)")
        if ldd_libraries(p):
            raise LabError(f"{p} is dynamically linked; the guest needs a TIERFS_STATIC=ON build")
        out[name] = p
    return out


# ------------------------------------------------------------------ cpio

class Cpio:
    """An initramfs (cpio "newc", uncompressed). Entries are written in sorted
    path order with uid/gid 0 and mtime 0, so equal contents give equal bytes.
    Parent directories are added implicitly."""

    def __init__(self) -> None:
        self.entries: dict[str, tuple[int, bytes]] = {}   # path -> (mode, data)

    def _parents(self, path: str) -> None:
        parts = path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            d = "/".join(parts[:i])
            if d not in self.entries:
                self.entries[d] = (0o040755, b"")

    def dir(self, path: str) -> None:
        path = path.strip("/")
        self._parents(path)
        self.entries.setdefault(path, (0o040755, b""))

    def file(self, path: str, data: bytes, executable: bool = False) -> None:
        path = path.strip("/")
        self._parents(path)
        self.entries[path] = (0o100755 if executable else 0o100644, data)

    def symlink(self, path: str, target: str) -> None:
        path = path.strip("/")
        self._parents(path)
        self.entries[path] = (0o120777, target.encode())

    def __contains__(self, path: str) -> bool:
        return path.strip("/") in self.entries

    @staticmethod
    def _header(name: str, mode: int, size: int, ino: int) -> bytes:
        raw = name.encode() + b"\0"
        nlink = 2 if mode & 0o170000 == 0o040000 else 1
        fields = (ino, mode, 0, 0, nlink, 0, size, 0, 0, 0, 0, len(raw), 0)
        head = b"070701" + b"".join(b"%08X" % v for v in fields) + raw
        return head + b"\0" * (-len(head) % 4)

    def write(self, f: Any) -> int:
        n = 0
        for ino, path in enumerate(sorted(self.entries), 1):
            mode, data = self.entries[path]
            for chunk in (self._header(path, mode, len(data), ino), data, b"\0" * (-len(data) % 4)):
                f.write(chunk)
                n += len(chunk)
        end = self._header("TRAILER!!!", 0, 0, 0)
        f.write(end)
        return n + len(end)


# ------------------------------------------------------------------ the image

@dataclass
class Options:
    guest: Path = GUEST_DIR                 # init, modules.txt, packages.txt
    cache: Path = field(default_factory=default_cache)   # debs/, images/
    static_build: Path = field(default_factory=default_static)  # built incrementally
    static_bin: Path | None = None          # use these static binaries (no build)
    # tierprobe from the default static build, tierfs from static_bin: the
    # instrument is the same in both arms of an A/B pair (vm pair --baseline).
    probe_from_default: bool = False
    rebuild: bool = False                   # build even when the key's image exists
    log: Callable[[str], None] = lambda s: None


@dataclass
class Image:
    key: str
    dir: Path
    manifest: dict[str, Any]
    built: bool          # built by this call (not taken from the cache)
    seconds: float       # what this call took
    # A shared flock on the image's manifest while this process may boot it:
    # prune() leaves such images alone (docs/lab/vmlab.md, "Cache key").
    hold: IO[str] | None = field(default=None, repr=False, compare=False)

    def source(self, name: str) -> str:
        """The host file the guest's /usr/bin/NAME was packed from."""
        for f in self.manifest.get("files", []):
            if f.get("path") == f"/usr/bin/{name}":
                return str(f.get("source", ""))
        return ""

    @property
    def vmlinux(self) -> Path:
        return self.dir / "vmlinux"

    @property
    def initramfs(self) -> Path:
        return self.dir / "initramfs.cpio"


@dataclass
class Inputs:
    """Everything the image is made of, resolved on the host; `key()` hashes it."""
    guest_files: dict[str, Path]
    kernel_package: str
    kernel_deb: Path
    kernel_version: str
    busybox: tuple[str, str, Path]                  # package, version, path
    programs: list[tuple[str, str, Path]]           # package, version, path
    libraries: list[tuple[str, str, Path]]          # package, version, path (as ldd names it)
    binaries: dict[str, Path]                       # tierfs, tierprobe
    hashes: dict[str, str] = field(default_factory=dict)

    def _h(self, p: Path) -> str:
        k = str(p)
        if k not in self.hashes:
            self.hashes[k] = sha256_file(p)
        return self.hashes[k]

    def listing(self) -> list[dict[str, str]]:
        items = [{"kind": "builder", "name": "vmimage.py", "sha256": self._h(Path(__file__)),
                  "format": str(FORMAT)}]
        for name, p in sorted(self.guest_files.items()):
            items.append({"kind": "guest", "name": name, "sha256": self._h(p)})
        items.append({"kind": "kernel", "name": self.kernel_package, "version": self.kernel_version,
                      "sha256": self._h(self.kernel_deb)})
        for kind, entries in (("busybox", [self.busybox]), ("program", self.programs),
                              ("library", self.libraries)):
            for pkg, ver, p in entries:
                items.append({"kind": kind, "name": str(p), "package": pkg, "version": ver,
                              "sha256": self._h(p)})
        for name, p in sorted(self.binaries.items()):
            items.append({"kind": "binary", "name": name, "sha256": self._h(p)})
        return items

    def key(self) -> str:
        return cache_key(self.listing())


def cache_key(listing: list[dict[str, str]]) -> str:
    canon = json.dumps(listing, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()


def resolve_inputs(opts: Options) -> Inputs:
    guest = opts.guest
    files = {n: guest / n for n in ("init", "modules.txt", "packages.txt")}
    for n, p in files.items():
        if not p.is_file():
            raise LabError(f"{p} is missing")
    # Parsed from the bytes the key lists (their hash is kept, not taken again later).
    packages_txt = read_guest_file(files["packages.txt"])
    packages = read_packages(files["packages.txt"], packages_txt)
    read_modules(files["modules.txt"])  # syntax errors before any download; packed from its bytes

    kernel = next(p for p in packages if p.kind == "kernel")
    host_lines = [p for p in packages if p.kind in ("busybox", "program")]
    versions = dpkg_versions([p.package for p in host_lines if p.package != "-"])
    versions["-"] = "-"

    def host(pl: PackageLine) -> tuple[str, str, Path]:
        p = Path(pl.path)
        if not p.is_file():
            raise LabError(f"{p} is missing (package {pl.package}): run scripts/install-deps lab")
        return pl.package, versions[pl.package], p

    busybox = host(next(p for p in host_lines if p.kind == "busybox"))
    programs = [host(p) for p in host_lines if p.kind == "program"]
    libs: list[str] = []
    for _pkg, _ver, prog in programs:
        libs += [lib for lib in ldd_libraries(prog) if lib not in libs]
    owners = file_packages(libs)
    versions.update(dpkg_versions([o for o in owners.values() if o != "-" and o not in versions]))
    libraries = [(owners[lib], versions[owners[lib]], Path(lib)) for lib in libs]

    kernel_package = resolve_kernel_package(kernel.package, opts.log)
    deb = fetch_deb(kernel_package, opts.cache / "debs", opts.log)
    # The slow part last, so that a missing package is reported at once.
    # ensure() holds static_lock(opts.static_build).
    if opts.static_bin is None or opts.probe_from_default:
        build_static(opts.static_build, opts.log)
    if opts.static_bin is not None:
        binaries = static_binaries(opts.static_bin)
        if opts.probe_from_default:
            binaries["tierprobe"] = static_binaries(opts.static_build / "bin")["tierprobe"]
    else:
        binaries = static_binaries(opts.static_build / "bin")
    return Inputs(guest_files=files, kernel_package=kernel_package, kernel_deb=deb,
                  kernel_version=deb_version(deb), busybox=busybox, programs=programs,
                  libraries=libraries, binaries=binaries,
                  hashes={str(files["packages.txt"]): sha256_bytes(packages_txt)})


def strip_copy(path: Path, data: bytes) -> bytes:
    """The binary `data` (read from `path`) without debug sections (the
    unstripped one stays in the build)."""
    if not data.startswith(b"\x7fELF"):
        return data
    with tempfile.TemporaryDirectory() as td:
        src, out = Path(td) / "in", Path(td) / "out"
        src.write_bytes(data)
        p = subprocess.run(["strip", "--strip-debug", "-o", str(out), str(src)], capture_output=True, text=True)
        if p.returncode != 0:
            raise LabError(f"strip {path} failed: {last_error_line(p.stderr)}")
        return out.read_bytes()


def busybox_applets(busybox: Path) -> list[str]:
    p = subprocess.run([str(busybox), "--list-full"], capture_output=True, text=True)
    if p.returncode != 0:
        raise LabError(f"{busybox} --list-full failed: is it busybox?")
    return [ln.strip() for ln in p.stdout.splitlines() if ln.strip()]


def changed(p: Path) -> LabError:
    return LabError(f"{p} changed while the image was being built; run again")


def verified_copy(src: Path, dst: Path, want: str | None) -> None:
    """Copy `src` to `dst`, hashing what is copied: the copy has the bytes the
    key hashed (`want`), or this is an error."""
    h = hashlib.sha256()
    with open(src, "rb") as f, open(dst, "wb") as out:
        while True:
            chunk = f.read(1 << 20)
            if not chunk:
                break
            h.update(chunk)
            out.write(chunk)
    if h.hexdigest() != want:
        raise changed(src)


def assemble(inp: Inputs, out: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """Unpack the kernel package, write vmlinux and initramfs.cpio into `out`;
    return the manifest (without the key). Every input is packed from bytes
    checked against the hash the key lists (packed(), verified_copy())."""

    def packed(p: Path) -> bytes:
        """The file's bytes, the same the key hashed: a file that changed
        since (a rebuild or an upgrade beside this build, an edit of the
        guest's files) is an error, never an image whose bytes differ from
        what its key lists."""
        data = p.read_bytes()
        if sha256_bytes(data) != inp.hashes.get(str(p)):
            raise changed(p)
        return data

    with tempfile.TemporaryDirectory(dir=out.parent, prefix="unpack-") as td:
        # The .deb is unpacked from a copy checked against its hash (and its
        # version read again from it), not from the path apt may replace.
        deb = Path(td) / "kernel.deb"
        verified_copy(inp.kernel_deb, deb, inp.hashes.get(str(inp.kernel_deb)))
        if deb_version(deb) != inp.kernel_version:
            raise changed(inp.kernel_deb)
        root = Path(td) / "root"
        root.mkdir()
        log(f"unpacking {inp.kernel_deb.name}")
        p = run_tool(["dpkg-deb", "-x", str(deb), str(root)], "unpacking the kernel")
        if p.returncode != 0:
            raise LabError(f"{inp.kernel_deb}: dpkg-deb -x failed ({last_error_line(p.stderr)}); "
                           "remove it to download again")
        vmlinuz = sorted((root / "boot").glob("vmlinuz-*"))
        if len(vmlinuz) != 1:
            raise LabError(f"{inp.kernel_deb.name} holds {len(vmlinuz)} boot/vmlinuz-* files, want one")
        release = vmlinuz[0].name[len("vmlinuz-"):]
        moddir = root / "lib" / "modules" / release
        if not moddir.is_dir():
            raise LabError(f"{inp.kernel_deb.name} has no lib/modules/{release}")
        log("extracting vmlinux")
        elf, compression = extract_vmlinux(vmlinuz[0].read_bytes())
        (out / "vmlinux").write_bytes(elf)
        modules_txt = inp.guest_files["modules.txt"]
        wanted = read_modules(modules_txt, packed(modules_txt))
        modules, built_in = resolve_modules(wanted, moddir)

    cpio = Cpio()
    for d in ("proc", "sys", "dev", "tmp", "run", "root", "job", "results", "mnt"):
        cpio.dir(d)
    cpio.file("init", packed(inp.guest_files["init"]), executable=True)
    files: list[dict[str, Any]] = []

    def add(guest_path: str, data: bytes, source: Path, package: str, version: str, kind: str) -> None:
        cpio.file(guest_path, data, executable=True)
        files.append({"path": guest_path, "kind": kind, "source": str(source), "package": package,
                      "version": version, "size": len(data), "sha256": sha256_bytes(data)})

    bb_pkg, bb_ver, bb = inp.busybox
    add("/bin/busybox", packed(bb), bb, bb_pkg, bb_ver, "busybox")
    applets = busybox_applets(bb)
    for a in applets:
        if a.strip("/") not in cpio:
            cpio.symlink(a, "/bin/busybox")
    for name, p in sorted(inp.binaries.items()):
        add(f"/usr/bin/{name}", strip_copy(p, packed(p)), p, "tierfs", "(this tree)", "binary")
    for pkg, ver, p in inp.programs:
        add(str(p), packed(p), p, pkg, ver, "program")
    for pkg, ver, p in inp.libraries:
        add(str(p), packed(p), p, pkg, ver, "library")
    mods = []
    for name, ko in modules:
        cpio.file(f"/lib/modules/{name}.ko", ko)
        mods.append({"name": name, "size": len(ko), "sha256": sha256_bytes(ko)})
    cpio.file("/etc/tierlab/modules", "".join(f"{n}\n" for n, _ in modules).encode())
    cpio.file("/etc/tierlab/release", f"{release}\n".encode())
    log("writing initramfs.cpio")
    with open(out / "initramfs.cpio", "wb") as f:
        cpio.write(f)

    return {
        "format": FORMAT,
        "kernel": {"package": inp.kernel_package, "version": inp.kernel_version, "release": release,
                   "deb": inp.kernel_deb.name, "compression": compression},
        "modules": mods,
        "modules_built_in": built_in,
        "busybox_applets": len(applets),
        "files": files,
        "artifacts": {name: {"size": (out / name).stat().st_size, "sha256": sha256_file(out / name)}
                      for name in ("vmlinux", "initramfs.cpio")},
    }


def check_artifacts(d: Path, manifest: dict[str, Any]) -> None:
    for name, want in manifest.get("artifacts", {}).items():
        p = d / name
        if not p.is_file():
            raise LabError(f"cached image {d} is corrupt: {name} is missing; run with --rebuild")
        if p.stat().st_size != want["size"] or sha256_file(p) != want["sha256"]:
            raise LabError(f"cached image {d} is corrupt: {name} does not match its manifest; "
                           "run with --rebuild")


def load_cached(d: Path, key: str) -> dict[str, Any] | None:
    mf = d / "manifest.json"
    if not mf.exists():
        return None
    try:
        manifest = json.loads(mf.read_text())
    except (OSError, ValueError) as e:
        raise LabError(f"cached image {d} is corrupt: manifest.json unreadable ({e}); run with --rebuild") from None
    if not isinstance(manifest, dict) or manifest.get("key") != key or "artifacts" not in manifest:
        raise LabError(f"cached image {d} is corrupt: its manifest is not for key {key[:16]}; run with --rebuild")
    check_artifacts(d, manifest)
    os.utime(mf)  # last use: prune() keeps images in use
    return manifest


def ensure(opts: Options) -> Image:
    """The image for the current inputs: from the cache, or built now. The
    returned Image holds a shared lock on its manifest (Image.hold) for as long
    as it lives, so that no other process prunes it meanwhile."""
    t0 = time.monotonic()
    images = opts.cache / "images"
    images.mkdir(parents=True, exist_ok=True)
    # One builder at a time per cache (two boots starting together build
    # once), and the static build held from its build until its binaries are
    # packed (their hashes are the key).
    with open(opts.cache / "images.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        own_static = opts.static_bin is None or opts.probe_from_default
        static = static_lock(opts.static_build) if own_static else None
        try:
            inputs = resolve_inputs(opts)
            listing = inputs.listing()
            key = cache_key(listing)
            d = images / key
            if not opts.rebuild:
                manifest = load_cached(d, key)
                if manifest is not None:
                    return Image(key, d, manifest, False, time.monotonic() - t0, hold_image(d))
            elif in_use(d):
                # Holds are taken with images.lock held, as now: none can
                # start between this check and the replacement below.
                raise LabError(f"cannot rebuild image {key[:16]}: a running tierlab vm process uses it "
                               f"(a shared lock on {d / 'manifest.json'}); run --rebuild again once it "
                               "has ended")
            opts.log(f"building image {key[:16]}")
            tmp = Path(tempfile.mkdtemp(dir=images, prefix=f".{key[:16]}-"))
            tmp.chmod(0o755)   # mkdtemp makes it 0700; the image is not secret
            try:
                manifest = assemble(inputs, tmp, opts.log)
                manifest.update({"key": key, "inputs": listing, "built_unix": time.time(),
                                 "build_s": round(time.monotonic() - t0, 3)})
                (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
                if d.exists():
                    shutil.rmtree(d)
                os.rename(tmp, d)
            finally:
                if tmp.exists():
                    shutil.rmtree(tmp, ignore_errors=True)
        finally:
            if static is not None:
                static.close()
        # Every change to fs/ makes new static binaries, hence a new image
        # (~160 MB): keep only the newest few (and those in use).
        hold = hold_image(d)
        prune(opts.cache, key, KEEP_IMAGES)
        return Image(key, d, manifest, True, time.monotonic() - t0, hold)


KEEP_IMAGES = 3


def hold_image(d: Path) -> IO[str]:
    """A shared flock on d's manifest: the image is in use (call with the
    images lock held, as prune() is)."""
    f = open(d / "manifest.json")
    fcntl.flock(f, fcntl.LOCK_SH)
    return f


def in_use(d: Path) -> bool:
    """Whether a process (this one included) holds hold_image(d)."""
    try:
        with open(d / "manifest.json") as f:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    return False


def prune(cache: Path, keep: str, newest: int = 1) -> list[Path]:
    """Remove cached images but `keep`, the `newest` - 1 most recently built or
    used others, those a process holds (hold_image: a long `vm pair` boots
    its image for hours), and leftovers of interrupted builds. Call with the
    images lock held (ensure() does; `vm image --prune` runs after ensure()
    released it, when a concurrent build's leftovers would be removed too --
    it is a manual tool)."""
    images = cache / "images"
    done = []
    for d in images.iterdir():
        if not d.is_dir() or d.name == keep:
            continue
        if (d / "manifest.json").exists():
            done.append(d)
        else:
            shutil.rmtree(d, ignore_errors=True)
    done.sort(key=lambda d: (d / "manifest.json").stat().st_mtime, reverse=True)
    gone = [d for d in done[max(newest - 1, 0):] if not in_use(d)]
    for d in gone:
        shutil.rmtree(d, ignore_errors=True)
    return sorted(gone)


def describe(image: Image) -> str:
    """What `tierlab vm image` prints."""
    m = image.manifest
    k = m["kernel"]
    lines = [
        f"image {image.key}",
        f"  dir        {image.dir}",
        f"  {'built' if image.built else 'cached'} in {image.seconds:.1f} s"
        + (f" (first built in {m['build_s']:.1f} s)" if not image.built else ""),
        f"  kernel     {k['package']} {k['version']} (release {k['release']}, {k['compression']} bzImage "
        f"-> vmlinux {m['artifacts']['vmlinux']['size'] / 2**20:.1f} MiB)",
        f"  initramfs  {m['artifacts']['initramfs.cpio']['size'] / 2**20:.1f} MiB uncompressed cpio, "
        f"sha256 {m['artifacts']['initramfs.cpio']['sha256'][:16]}",
        "  modules    " + " ".join(x["name"] for x in m["modules"]) + "  (load order)",
    ]
    if m.get("modules_built_in"):
        lines.append("  built in   " + " ".join(m["modules_built_in"]))
    libs = [f for f in m["files"] if f["kind"] == "library"]
    for f in m["files"]:
        if f["kind"] == "library":
            continue
        lines.append(f"  {f['kind']:<10} {f['path']:<20} {f['size']:>10} B  sha256 {f['sha256'][:16]}  "
                     f"{f['package']} {f['version']}")
    if libs:
        lines.append(f"  libraries  {len(libs)} ({sum(f['size'] for f in libs) / 2**20:.1f} MiB) "
                     "for the programs above; --json lists them")
    lines.append(f"  busybox    {m['busybox_applets']} applets linked")
    return "\n".join(lines)
