"""Tests of the VM lab's image builder (vmimage.py) on small fake inputs: a fake
kernel package (a bzImage around a tiny ELF with a PVH note, modules with
.modinfo dependencies), a fake busybox and fake static binaries. Fast: no
download, no compile, no QEMU. The real image is built and booted by
vmboot_test.py."""

from __future__ import annotations

import gzip
import hashlib
import lzma
import struct
import subprocess
from pathlib import Path

import pytest

from tierlab import LabError, vmimage
from tierlab.testing import assert_one_line_error, run, tool


# ------------------------------------------------------------------ fakes

def fake_elf(sections: list[tuple[str, int, bytes]]) -> bytes:
    """A 64-bit little-endian ELF file with just these sections (name, type, data)."""
    allsec = sections + [(".shstrtab", 3, b"")]
    names = b"\0"
    name_off = []
    for name, _, _ in allsec:
        name_off.append(len(names))
        names += name.encode() + b"\0"
    allsec[-1] = (".shstrtab", 3, names)
    body = bytearray(64)
    placed = []
    for _, _, data in allsec:
        body += b"\0" * (-len(body) % 8)
        placed.append((len(body), len(data)))
        body += data
    body += b"\0" * (-len(body) % 8)
    shoff = len(body)
    table = bytes(64)
    for (_, typ, _), (off, size), noff in zip(allsec, placed, name_off):
        table += struct.pack("<IIQQQQIIQQ", noff, typ, 0, 0, off, size, 0, 0, 1, 0)
    n = len(allsec) + 1
    body[:64] = (b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)
                 + struct.pack("<HHIQQQIHHHHHH", 1, 62, 1, 0, 0, shoff, 0, 64, 0, 0, 64, n, n - 1))
    return bytes(body) + table


def pvh_note() -> bytes:
    return struct.pack("<III", 4, 4, vmimage.XEN_ELFNOTE_PHYS32_ENTRY) + b"Xen\0" + struct.pack("<I", 0x1000000)


def fake_vmlinux(extra: bytes = b"") -> bytes:
    return fake_elf([(".text", 1, b"\x90" * 64 + extra), (".notes", 7, pvh_note())])


def fake_bzimage(payload: bytes, *, setup_sects: int = 1, version: int = 0x20f) -> bytes:
    head = bytearray((setup_sects + 1) * 512)
    head[0x1f1] = setup_sects
    head[0x202:0x206] = b"HdrS"
    struct.pack_into("<H", head, 0x206, version)
    struct.pack_into("<II", head, 0x248, 16, len(payload))
    return bytes(head) + b"\xcc" * 16 + payload + struct.pack("<I", 12345)


def fake_module(depends: str) -> bytes:
    return fake_elf([(".text", 1, b"\xc3"), (".modinfo", 1, f"license=GPL\0depends={depends}\0".encode())])


def write_deb(debs: Path, work: Path, *, version: str = "1.0", module_b: bytes | None = None) -> Path:
    root = work / f"deb-{version}"
    rel = "9.9.9-fake"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        f"Package: fake-kernel\nVersion: {version}\nArchitecture: amd64\n"
        "Maintainer: tierfs tests <tests@example.invalid>\nDescription: a fake kernel package\n")
    (root / "boot").mkdir()
    (root / "boot" / f"vmlinuz-{rel}").write_bytes(
        fake_bzimage(lzma.compress(fake_vmlinux(), format=lzma.FORMAT_XZ)))
    mods = root / "lib" / "modules" / rel
    (mods / "kernel" / "fs").mkdir(parents=True)
    (mods / "kernel" / "drivers").mkdir(parents=True)
    (mods / "kernel" / "fs" / "fake_a.ko").write_bytes(fake_module("fake_b,fake_c"))
    (mods / "kernel" / "drivers" / "fake_b.ko.xz").write_bytes(
        lzma.compress(module_b or fake_module(""), format=lzma.FORMAT_XZ))
    (mods / "kernel" / "drivers" / "fake-d.ko").write_bytes(fake_module(""))
    (mods / "modules.builtin").write_text("kernel/drivers/fake_c.ko\n")
    debs.mkdir(parents=True, exist_ok=True)
    for old in debs.glob("fake-kernel_*.deb"):
        old.unlink()
    out = debs / f"fake-kernel_{version}_amd64.deb"
    subprocess.run(["dpkg-deb", "-Zgzip", "--root-owner-group", "--build", str(root), str(out)],
                   check=True, capture_output=True)
    return out


@pytest.fixture
def fake(tmp_path: Path) -> dict[str, Path]:
    guest = tmp_path / "guest"
    guest.mkdir()
    (guest / "init").write_text("#!/bin/sh\necho fake init\n")
    (guest / "modules.txt").write_text("# fake\nfake_a\nfake-d\n")
    bb = tmp_path / "busybox"
    bb.write_text("#!/bin/sh\n[ \"$1\" = --list-full ] && printf 'bin/sh\\nbin/ls\\nusr/bin/tar\\n'\n")
    bb.chmod(0o755)
    (guest / "packages.txt").write_text(
        f"kernel fake-kernel\nbusybox - {bb}\nprogram coreutils /usr/bin/true   # dynamic: libc\n")
    static = tmp_path / "static"
    (static / "bin").mkdir(parents=True)
    for name in ("tierfs", "tierprobe"):
        (static / "bin" / name).write_text(f"#!/bin/sh\necho fake {name}\n")
    cache = tmp_path / "cache"
    write_deb(cache / "debs", tmp_path)
    return {"guest": guest, "cache": cache, "static": static, "tmp": tmp_path}


def options(f: dict[str, Path], **kw: object) -> vmimage.Options:
    return vmimage.Options(guest=f["guest"], cache=f["cache"], static_bin=f["static"] / "bin", **kw)  # type: ignore[arg-type]


def read_cpio(data: bytes) -> dict[str, tuple[int, bytes]]:
    out = {}
    pos = 0
    while True:
        h = data[pos:pos + 110]
        assert h[:6] == b"070701", pos
        fields = [int(h[6 + 8 * i:14 + 8 * i], 16) for i in range(13)]
        mode, size, namesize = fields[1], fields[6], fields[11]
        name = data[pos + 110:pos + 110 + namesize - 1].decode()
        pos = (pos + 110 + namesize + 3) & ~3
        body = data[pos:pos + size]
        pos = (pos + size + 3) & ~3
        if name == "TRAILER!!!":
            return out
        out[name] = (mode, body)


# ------------------------------------------------------------------ tests

def test_extract_vmlinux_xz_and_gzip() -> None:
    elf = fake_vmlinux(b"payload")
    got, kind = vmimage.extract_vmlinux(fake_bzimage(lzma.compress(elf, format=lzma.FORMAT_XZ)))
    assert (got, kind) == (elf, "xz")
    got, kind = vmimage.extract_vmlinux(fake_bzimage(gzip.compress(elf), setup_sects=3))
    assert (got, kind) == (elf, "gzip")


@pytest.mark.parametrize("image,needle", [
    (b"MZ" + bytes(4096), "not a bzImage"),
    (fake_bzimage(b"\x00\x01\x02\x03junk"), "unknown kernel compression"),
    (fake_bzimage(lzma.compress(b"no elf here", format=lzma.FORMAT_XZ)), "not an ELF"),
    (fake_bzimage(lzma.compress(fake_elf([(".text", 1, b"x")]), format=lzma.FORMAT_XZ)), "no PVH entry"),
    (fake_bzimage(b"", version=0x206), "need 2.08"),
])
def test_extract_vmlinux_errors(image: bytes, needle: str) -> None:
    with pytest.raises(LabError, match=needle):
        vmimage.extract_vmlinux(image)


def test_image_from_fake_inputs(fake: dict[str, Path]) -> None:
    img = vmimage.ensure(options(fake))
    assert img.built
    m = img.manifest
    assert m["kernel"] == {"package": "fake-kernel", "version": "1.0", "release": "9.9.9-fake",
                           "deb": "fake-kernel_1.0_amd64.deb", "compression": "xz"}
    # Dependencies first, each once; the built-in one (fake_c) is skipped.
    assert [x["name"] for x in m["modules"]] == ["fake_b", "fake_a", "fake_d"]
    assert img.vmlinux.read_bytes() == fake_vmlinux()
    files = read_cpio(img.initramfs.read_bytes())
    assert files["etc/tierlab/modules"][1] == b"fake_b\nfake_a\nfake_d\n"
    assert files["init"] == (0o100755, b"#!/bin/sh\necho fake init\n")
    assert files["bin/ls"] == (0o120777, b"/bin/busybox")
    assert files["usr/bin/tierfs"][1].startswith(b"#!/bin/sh")
    assert files["lib/modules/fake_b.ko"][1] == fake_module("")   # decompressed
    assert "usr/bin/true" in files
    libs = [f for f in m["files"] if f["kind"] == "library"]
    assert any(f["path"].endswith("/libc.so.6") and f["package"] == "libc6" for f in libs), libs
    assert any("ld-linux" in f["path"] for f in libs), libs
    for d in ("proc", "sys", "dev", "tmp"):
        assert files[d][0] == 0o040755

    again = vmimage.ensure(options(fake))
    assert not again.built and again.key == img.key


def test_stale_entry_is_rebuilt_when_an_input_changes(fake: dict[str, Path]) -> None:
    first = vmimage.ensure(options(fake))
    keys = {first.key}

    def changed(step: str) -> vmimage.Image:
        img = vmimage.ensure(options(fake))
        assert img.built, step
        assert img.key not in keys, step
        keys.add(img.key)
        assert img.hold is not None and vmimage.in_use(img.dir)
        img.hold.close()  # done with it: the next build may prune it
        return img

    init = fake["guest"] / "init"
    init.write_text(init.read_text() + "echo changed\n")
    img = changed("init")
    assert read_cpio(img.initramfs.read_bytes())["init"][1].endswith(b"echo changed\n")
    (fake["static"] / "bin" / "tierprobe").write_text("#!/bin/sh\necho a new tierprobe\n")
    changed("static tierprobe")
    write_deb(fake["cache"] / "debs", fake["tmp"] / "v2", version="1.1")
    assert changed("kernel package").manifest["kernel"]["version"] == "1.1"
    write_deb(fake["cache"] / "debs", fake["tmp"] / "v3", version="1.1", module_b=fake_module("fake_d"))
    img = changed("same version, other module bytes")
    assert [x["name"] for x in img.manifest["modules"]] == ["fake_d", "fake_b", "fake_a"]
    (fake["guest"] / "modules.txt").write_text("fake-d\n")
    img = changed("modules.txt")
    # Only the newest few images stay, and the first one, which this test
    # still holds (as a long vm pair holds the image it boots).
    left = {d.name for d in (fake["cache"] / "images").iterdir()}
    assert len(left) == vmimage.KEEP_IMAGES + 1 and img.key in left and left <= keys
    assert first.key in left
    assert first.hold is not None
    first.hold.close()
    vmimage.ensure(options(fake))  # cached: prunes nothing
    assert vmimage.prune(fake["cache"], img.key, vmimage.KEEP_IMAGES) == [first.dir]


def test_same_inputs_give_the_same_bytes(fake: dict[str, Path]) -> None:
    a = vmimage.ensure(options(fake))
    digest = hashlib.sha256(a.initramfs.read_bytes()).hexdigest()
    assert a.hold is not None
    a.hold.close()   # no longer in use: --rebuild may replace it
    b = vmimage.ensure(options(fake, rebuild=True))
    assert b.built and b.key == a.key
    assert hashlib.sha256(b.initramfs.read_bytes()).hexdigest() == digest


def test_cache_key_covers_every_field() -> None:
    base = [{"kind": "guest", "name": "init", "sha256": "00"}]
    k = vmimage.cache_key(base)
    assert vmimage.cache_key([dict(base[0])]) == k
    assert vmimage.cache_key([{**base[0], "sha256": "01"}]) != k
    assert vmimage.cache_key([{**base[0], "version": "2"}]) != k
    assert vmimage.cache_key(base + base) != k


def cli(fake: dict[str, Path], *extra: str) -> subprocess.CompletedProcess[str]:
    return run([tool("tierlab"), "vm", "image", "--guest", fake["guest"], "--cache", fake["cache"],
                "--static-build", fake["static"], *extra])


def test_cli_describes_the_image(fake: dict[str, Path]) -> None:
    p = cli(fake)
    assert p.returncode == 0, p.stderr
    assert "fake-kernel 1.0 (release 9.9.9-fake" in p.stdout
    assert "fake_b fake_a fake_d  (load order)" in p.stdout
    assert "/usr/bin/tierfs" in p.stdout and "/usr/bin/true" in p.stdout
    assert "built in" in p.stdout
    p = cli(fake)
    assert p.returncode == 0 and "cached in" in p.stdout


def test_corrupt_cache_entry_is_an_error_until_rebuilt(fake: dict[str, Path]) -> None:
    img = vmimage.ensure(options(fake))
    data = bytearray(img.initramfs.read_bytes())
    data[200] ^= 0xff
    img.initramfs.write_bytes(bytes(data))
    assert_one_line_error(cli(fake), 2, "tierlab vm image: cached image", "is corrupt",
                          "initramfs.cpio", "--rebuild")
    (img.dir / "manifest.json").write_text("{not json")
    assert_one_line_error(cli(fake), 2, "is corrupt", "manifest.json")
    assert img.hold is not None
    img.hold.close()   # this process no longer uses it
    p = cli(fake, "--rebuild")
    assert p.returncode == 0, p.stderr
    assert vmimage.ensure(options(fake)).key == img.key


def test_missing_kernel_package_is_one_line_error(fake: dict[str, Path]) -> None:
    pk = fake["guest"] / "packages.txt"
    pk.write_text(pk.read_text().replace("kernel fake-kernel", "kernel linux-image-0.0.0-no-such-amd64"))
    assert_one_line_error(cli(fake), 2, "tierlab vm image: package linux-image-0.0.0-no-such-amd64 "
                          "cannot be downloaded")


def test_host_package_not_installed_is_one_line_error(fake: dict[str, Path]) -> None:
    pk = fake["guest"] / "packages.txt"
    pk.write_text(pk.read_text() + "program tierfs-no-such-package /usr/bin/nothing\n")
    assert_one_line_error(cli(fake), 2, "package tierfs-no-such-package is not installed",
                          "scripts/install-deps lab")


@pytest.mark.parametrize("line,needle", [
    ("kernal fake-kernel", "packages.txt:4: unknown kind 'kernal'"),
    ("program fio", "packages.txt:4: 'program' takes 2 fields, got 1"),
    ("kernel other-kernel", "needs exactly one 'kernel' line"),
])
def test_bad_package_list(fake: dict[str, Path], line: str, needle: str) -> None:
    pk = fake["guest"] / "packages.txt"
    pk.write_text(pk.read_text() + line + "\n")
    assert_one_line_error(cli(fake), 2, needle)


def test_missing_module_names_who_needs_it(fake: dict[str, Path]) -> None:
    write_deb(fake["cache"] / "debs", fake["tmp"] / "v2", version="2", module_b=fake_module("fake_zz"))
    assert_one_line_error(cli(fake), 2, "module fake_zz (needed by fake_b) is not in the kernel package")
    (fake["guest"] / "modules.txt").write_text("fake_a x y\n")
    assert_one_line_error(cli(fake), 2, "modules.txt:1: want one module name per line")


def test_missing_static_binary(fake: dict[str, Path]) -> None:
    (fake["static"] / "bin" / "tierprobe").unlink()
    assert_one_line_error(cli(fake), 2, "tierprobe is missing")


def test_packages_file_of_the_tree_parses() -> None:
    pk = vmimage.read_packages(vmimage.GUEST_DIR / "packages.txt")
    assert [p.kind for p in pk if p.kind == "kernel"] == ["kernel"]
    assert vmimage.read_modules(vmimage.GUEST_DIR / "modules.txt") == ["virtio_pci", "virtio_blk", "fuse"]


def test_kernel_metapackage_resolves_to_what_it_depends_on_now(monkeypatch: pytest.MonkeyPatch) -> None:
    said: list[str] = []
    monkeypatch.setattr(vmimage, "current_kernel_package", lambda: "linux-image-6.1.0-99-amd64")
    assert vmimage.resolve_kernel_package("linux-image-amd64", said.append) == "linux-image-6.1.0-99-amd64"
    assert said == ["kernel: linux-image-amd64 is linux-image-6.1.0-99-amd64 now"]
    # A pinned package is taken as it is, without asking apt.
    monkeypatch.setattr(vmimage, "current_kernel_package", lambda: pytest.fail("asked apt"))
    assert vmimage.resolve_kernel_package("linux-image-6.1.0-57-amd64", said.append) == "linux-image-6.1.0-57-amd64"


def test_kernel_metapackage_apt_does_not_know_is_one_line_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vmimage, "current_kernel_package", lambda: "")
    monkeypatch.setattr(vmimage.os, "geteuid", lambda: 1000)  # no apt-get update as a user
    with pytest.raises(LabError, match="names no kernel package: run apt-get update"):
        vmimage.resolve_kernel_package("linux-image-amd64", lambda s: None)


def test_prune_keeps_the_newest_and_images_in_use(tmp_path: Path) -> None:
    import os
    import time
    images = tmp_path / "images"
    old = time.time() - 10 * 3600
    for i, name in enumerate(["a", "b", "c", "d", "e"]):
        d = images / name
        d.mkdir(parents=True)
        (d / "manifest.json").write_text("{}")
        os.utime(d / "manifest.json", (old + i, old + i))  # e newest, all long unused
    (images / "half-built").mkdir()
    hold = vmimage.hold_image(images / "b")  # b: a long vm pair boots it
    assert vmimage.in_use(images / "b") and not vmimage.in_use(images / "c")
    gone = vmimage.prune(tmp_path, "a", 3)
    # Kept: a (current), e and d (the newest two others), b (held); c goes.
    assert [p.name for p in gone] == ["c"]
    assert sorted(p.name for p in images.iterdir()) == ["a", "b", "d", "e"]
    # --prune: everything but the current one and those in use.
    assert sorted(p.name for p in vmimage.prune(tmp_path, "a")) == ["d", "e"]
    hold.close()
    assert [p.name for p in vmimage.prune(tmp_path, "a")] == ["b"]


def test_a_binary_that_changes_during_the_build_is_an_error(fake: dict[str, Path],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # The key hashes the inputs before they are packed; a rebuild of the
    # static binaries in between must not give an image whose bytes differ
    # from what its key lists.
    real = vmimage.assemble

    def racing(inp: vmimage.Inputs, out: Path, log: object) -> dict[str, object]:
        (fake["static"] / "bin" / "tierprobe").write_text("#!/bin/sh\necho rebuilt meanwhile\n")
        return real(inp, out, log)  # type: ignore[arg-type]
    monkeypatch.setattr(vmimage, "assemble", racing)
    with pytest.raises(LabError, match=r"tierprobe changed while the image was being built; run again"):
        vmimage.ensure(options(fake))
    assert not [d for d in (fake["cache"] / "images").iterdir() if (d / "manifest.json").exists()]


def test_rebuild_refuses_an_image_in_use(fake: dict[str, Path]) -> None:
    # A running boot holds its image; --rebuild must not remove it under it.
    img = vmimage.ensure(options(fake))
    before = img.initramfs.stat().st_ino
    assert_one_line_error(cli(fake, "--rebuild"), 2, f"tierlab vm image: cannot rebuild image {img.key[:16]}: "
                          "a running tierlab vm process uses it", "run --rebuild again once it has ended")
    assert img.initramfs.stat().st_ino == before and (img.dir / "manifest.json").is_file()
    assert img.hold is not None
    img.hold.close()
    p = cli(fake, "--rebuild")
    assert p.returncode == 0, p.stderr
    assert img.initramfs.stat().st_ino != before   # rebuilt now


@pytest.mark.parametrize("what", ["init", "modules.txt", "kernel .deb"])
def test_a_guest_file_or_the_kernel_that_changes_during_the_build_is_an_error(
        what: str, fake: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    # As for the binaries: the key hashed them before they are packed, so an
    # edit in between must be an error, not an image its key does not describe.
    real = vmimage.assemble

    def racing(inp: vmimage.Inputs, out: Path, log: object) -> dict[str, object]:
        if what == "init":
            (fake["guest"] / "init").write_text("#!/bin/sh\necho edited meanwhile\n")
        elif what == "modules.txt":
            (fake["guest"] / "modules.txt").write_text("fake_a\n")
        else:   # a new download of the same name and version, other bytes
            write_deb(fake["cache"] / "debs", fake["tmp"] / "race", version="1.0",
                      module_b=fake_module("fake_d"))
        return real(inp, out, log)  # type: ignore[arg-type]
    monkeypatch.setattr(vmimage, "assemble", racing)
    name = {"init": "init", "modules.txt": "modules.txt", "kernel .deb": "fake-kernel_1.0_amd64.deb"}[what]
    with pytest.raises(LabError, match=rf"/{name} changed while the image was being built; run again"):
        vmimage.ensure(options(fake))
    assert not [d for d in (fake["cache"] / "images").iterdir() if (d / "manifest.json").exists()]


def test_ab_images_share_the_default_builds_tierprobe(fake: dict[str, Path],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # vm pair --baseline/--candidate: tierfs from the arm's build, tierprobe
    # from the default static build (one instrument for both arms).
    default = fake["tmp"] / "default-static"
    (default / "bin").mkdir(parents=True)
    for name in vmimage.STATIC_TARGETS:
        (default / "bin" / name).write_text(f"#!/bin/sh\necho default {name}\n")
    built: list[Path] = []
    monkeypatch.setattr(vmimage, "build_static", lambda out, log: built.append(out))
    img = vmimage.ensure(options(fake, static_build=default, probe_from_default=True))
    assert built == [default]
    assert img.source("tierprobe") == str(default / "bin" / "tierprobe")
    assert img.source("tierfs") == str(fake["static"] / "bin" / "tierfs")
    files = read_cpio(img.initramfs.read_bytes())
    assert files["usr/bin/tierprobe"][1] == b"#!/bin/sh\necho default tierprobe\n"
    assert (default / vmimage.STATIC_LOCK).exists()
