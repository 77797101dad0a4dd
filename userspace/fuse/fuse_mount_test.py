"""tierfs mounted through FUSE, end to end: POSIX namespace semantics as a table of
operations and their errnos, renameat2 flags, persistence across unmount and
remount (daemon and foreground), unlinked-but-open files, multi-user ownership
with allow_other, and clear errors for bad mounts. fsck runs clean after every
unmount. File data: random writes and reads against a model, persistence, a
sparse 5 GiB file, fsync, and space given back on delete."""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import Callable

import pytest

from fusetest import (Mount, expect, fsck_clean, getxattr_sized, image, needs_fuse, renameat2, two_members, umount,
                      unlocked, wait_for)
from fusetest import mounted  # noqa: F401 - a fixture
from tierlab.testing import run, tool

pytestmark = needs_fuse


def test_namespace_semantics_table(mounted: Path) -> None:
    m = mounted
    (m / "dir").mkdir()
    (m / "dir" / "inner").mkdir()
    (m / "full").mkdir()
    (m / "full" / "x").touch()
    (m / "file").touch()
    rows: list[tuple[str, int | None, Callable[[], object]]] = [
        ("mkdir existing", errno.EEXIST, lambda: os.mkdir(m / "dir")),
        ("create existing O_EXCL", errno.EEXIST, lambda: os.open(m / "file", os.O_CREAT | os.O_EXCL | os.O_WRONLY)),
        ("create in a file", errno.ENOTDIR, lambda: (m / "file" / "x").touch()),
        ("name of 255", None, lambda: (m / ("n" * 255)).touch()),
        ("name of 256", errno.ENAMETOOLONG, lambda: (m / ("n" * 256)).touch()),
        ("stat missing", errno.ENOENT, lambda: os.stat(m / "nope")),
        ("unlink a directory", errno.EISDIR, lambda: os.unlink(m / "dir")),
        ("rmdir a file", errno.ENOTDIR, lambda: os.rmdir(m / "file")),
        ("rmdir not empty", errno.ENOTEMPTY, lambda: os.rmdir(m / "full")),
        ("hard link a directory", errno.EPERM, lambda: os.link(m / "dir", m / "dl")),
        ("link onto existing", errno.EEXIST, lambda: os.link(m / "file", m / "dir")),
        ("rename into itself", errno.EINVAL, lambda: os.rename(m / "dir", m / "dir" / "inner" / "d")),
        ("rename file over dir", errno.EISDIR, lambda: os.rename(m / "file", m / "dir")),
        ("rename dir over file", errno.ENOTDIR, lambda: os.rename(m / "dir", m / "file")),
        ("rename over non-empty", errno.ENOTEMPTY, lambda: os.rename(m / "dir", m / "full")),
        ("readlink a file", errno.EINVAL, lambda: os.readlink(m / "file")),
        ("truncate a directory", errno.EISDIR, lambda: os.truncate(m / "dir", 0)),
        ("mkfifo", None, lambda: os.mkfifo(m / "fifo", 0o600)),
        ("mknod char device", None, lambda: os.mknod(m / "null", 0o600 | stat.S_IFCHR, os.makedev(1, 3))),
        ("symlink", None, lambda: os.symlink("a" * 4095, m / "long")),
    ]
    for what, want, fn in rows:
        expect(want, fn, what)
    assert sorted(os.listdir(m)) == sorted(["dir", "full", "file", "n" * 255, "fifo", "null", "long"])
    assert stat.S_ISFIFO(os.lstat(m / "fifo").st_mode)
    st = os.lstat(m / "null")
    assert stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) == 1 and os.minor(st.st_rdev) == 3
    assert os.readlink(m / "long") == "a" * 4095
    assert os.stat(m / "dir").st_nlink == 3 and os.stat(m).st_nlink == 4


def test_rename_flags_and_links(mounted: Path) -> None:
    m = mounted
    (m / "a").mkdir()
    (m / "b").mkdir()
    (m / "a" / "f").touch()
    (m / "b" / "g").touch()
    expect(errno.EEXIST, lambda: renameat2(m / "a" / "f", m / "b" / "g", 1), "RENAME_NOREPLACE")
    renameat2(m / "a", m / "b" / "g", 2)  # RENAME_EXCHANGE: a directory and a file
    assert (m / "a").is_file() and (m / "b" / "g").is_dir() and (m / "b" / "g" / "f").is_file()
    assert os.stat(m / "b").st_nlink == 3
    os.link(m / "b" / "g" / "f", m / "h")
    assert os.stat(m / "h").st_nlink == 2
    os.rename(m / "h", m / "b" / "g" / "f")  # two names of one inode: nothing happens
    assert os.stat(m / "h").st_nlink == 2
    os.unlink(m / "h")
    assert os.stat(m / "b" / "g" / "f").st_nlink == 1


def test_attributes(mounted: Path) -> None:
    f = mounted / "f"
    f.touch()
    os.chown(f, 1234, 5678)  # (chown clears setuid: Linux does, for root too)
    os.chmod(f, 0o4751)
    os.truncate(f, 5 << 30)  # sets mtime
    os.utime(f, ns=(1_000_000_123, 2_000_000_456))
    st = os.stat(f)
    assert stat.S_IMODE(st.st_mode) == 0o4751 and st.st_uid == 1234 and st.st_gid == 5678
    assert st.st_atime_ns == 1_000_000_123 and st.st_mtime_ns == 2_000_000_456
    assert st.st_size == 5 << 30
    with open(f, "rb") as r:  # never written: the file is one hole
        r.seek((5 << 30) - 10)
        assert r.read(100) == b"\0" * 10
    vfs = os.statvfs(mounted)
    assert vfs.f_blocks > 0 and 0 < vfs.f_bavail <= vfs.f_bfree <= vfs.f_blocks
    assert vfs.f_namemax == 255


def test_xattrs(mounted: Path) -> None:
    f = mounted / "f"
    f.touch()
    os.setxattr(f, "user.color", b"blue")
    os.setxattr(f, "trusted.x", b"")
    assert os.getxattr(f, "user.color") == b"blue"
    assert sorted(os.listxattr(f)) == ["trusted.x", "user.color"]
    expect(errno.EEXIST, lambda: os.setxattr(f, "user.color", b"red", os.XATTR_CREATE), "XATTR_CREATE")
    expect(errno.ENODATA, lambda: os.setxattr(f, "user.new", b"red", os.XATTR_REPLACE), "XATTR_REPLACE")
    expect(errno.ENODATA, lambda: os.getxattr(f, "user.none"), "get missing")
    expect(errno.E2BIG, lambda: os.setxattr(f, "user.big", b"v" * 65537), "too big (the kernel's limit)")
    expect(errno.EOPNOTSUPP, lambda: os.setxattr(f, "system.tierfs_none", b"x"), "system.*")
    os.removexattr(f, "user.color")
    expect(errno.ENODATA, lambda: os.removexattr(f, "user.color"), "remove missing")
    d = mounted / "d"
    d.mkdir()
    os.setxattr(d, "user.on_a_dir", b"1" * 1500)
    assert os.getxattr(d, "user.on_a_dir") == b"1" * 1500
    assert os.listxattr(f) == ["trusted.x"]


def test_xattrs_up_to_64_kib(tmp_path: Path) -> None:
    """Values up to the VFS's 64 KiB pass through FUSE both ways (tierfs keeps
    those longer than fits beside their name, ~2 KiB, in chunk keys): a
    buffer a byte short is ERANGE, a size query the full length, more than
    64 KiB the kernel's E2BIG; replacements across the inline/chunked
    boundary keep no stale chunk (fsck after each unmount), and every value
    survives a remount."""
    dev = image(tmp_path / "fs.img")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    f = mnt / "f"
    values = {"user.max": os.urandom(65536), "user.mid": os.urandom(30000), "user.small": b"s" * 10,
              "trusted.edge": os.urandom(2048 - 16 - len("trusted.edge") + 1)}  # one byte past inline
    m = Mount(dev, mnt)
    try:
        f.touch()
        for n, v in values.items():
            os.setxattr(f, n, v)
        for n, v in values.items():
            assert os.getxattr(f, n) == v, n
        assert len(getxattr_sized(f, "user.max", 0)) == 65536
        assert getxattr_sized(f, "user.max", 65536) == values["user.max"]
        expect(errno.ERANGE, lambda: getxattr_sized(f, "user.max", 65535), "a buffer a byte short")
        expect(errno.E2BIG, lambda: os.setxattr(f, "user.max", b"v" * 65537), "past 64 KiB")
        assert os.getxattr(f, "user.max") == values["user.max"]
        values["user.mid"] = b"inline now"
        values["user.small"] = os.urandom(40000)
        for n in ("user.mid", "user.small"):
            os.setxattr(f, n, values[n], os.XATTR_REPLACE)
    except BaseException:
        m.abandon()
        raise
    m.close()
    m = Mount(dev, mnt)
    try:
        for n, v in values.items():
            assert os.getxattr(f, n) == v, n
        assert sorted(os.listxattr(f)) == sorted(values)
        os.removexattr(f, "user.max")
        assert sorted(os.listxattr(f)) == sorted(set(values) - {"user.max"})
    except BaseException:
        m.abandon()
        raise
    m.close()


def test_ctl_reads_live_counters(mounted: Path, tmp_path: Path) -> None:
    import json

    def ctl() -> dict:
        proc = run([tool("tierfs"), "ctl", mounted])
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    before = ctl()
    for i in range(25):
        (mounted / f"f{i}").touch()
    os.rename(mounted / "f0", mounted / "g0")
    os.unlink(mounted / "f1")
    fd = os.open(mounted, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)  # the journal's durable commit
    finally:
        os.close(fd)
    after = ctl()
    assert after["posix"]["creates"] - before["posix"]["creates"] == 25
    assert after["posix"]["renames"] - before["posix"]["renames"] == 1
    assert after["posix"]["unlinks"] - before["posix"]["unlinks"] == 1
    assert after["journal"]["durable_seq"] == after["journal"]["next_seq"] - 1 > before["journal"]["durable_seq"]
    assert after["btree"]["commits"] - before["btree"]["commits"] >= 27
    dev = after["devices"][0]
    assert dev["label"] == "dev0" and dev["stalled"] is False
    assert "journal" in dev["io"] and dev["io"]["journal"]["write"]["ops"] > 0
    tiers = after["alloc"]["tiers"]
    assert tiers["dev0"]["buckets"] == after["alloc"]["devices"][0]["buckets"] > tiers["dev0"]["free"] > 0
    for where in (tmp_path, mounted / "g0"):
        bad = run([tool("tierfs"), "ctl", where])
        assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "tierfs ctl:" in bad.stderr, bad.stderr


def test_file_data_against_a_model(tmp_path: Path) -> None:
    import random
    dev = image(tmp_path / "fs.img", 128)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    rng = random.Random(7)
    model: dict[str, bytearray] = {}
    m = Mount(dev, mnt)
    try:
        for name in ("a", "b"):
            model[name] = bytearray()
            (mnt / name).touch()
        for op in range(300):
            name = rng.choice(["a", "b"])
            p, want = mnt / name, model[name]
            kind = rng.random()
            if kind < 0.6:
                off = rng.randrange(0, 2 << 20)
                data = rng.randbytes(rng.randrange(1, 200_000))
                with open(p, "r+b") as f:
                    f.seek(off)
                    f.write(data)
                if len(want) < off + len(data):
                    want.extend(b"\0" * (off + len(data) - len(want)))
                want[off:off + len(data)] = data
            elif kind < 0.75:
                size = rng.randrange(0, 3 << 20)
                os.truncate(p, size)
                del want[size:]
                want.extend(b"\0" * (size - len(want)))
            else:
                assert p.read_bytes() == bytes(want), f"op {op}: {name} differs"
        fd = os.open(mnt / "a", os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    finally:
        m.close()
    m = Mount(dev, mnt)  # after unmount and fsck: the same bytes
    try:
        for name, want in model.items():
            assert (mnt / name).read_bytes() == bytes(want), name
        # A sparse 5 GiB file: one block written, the rest holes.
        with open(mnt / "sparse", "wb") as f:
            f.seek(5 << 30)
            f.write(b"end")
        st = os.stat(mnt / "sparse")
        assert st.st_size == (5 << 30) + 3 and st.st_blocks == 8
        with open(mnt / "sparse", "rb") as f:
            f.seek((5 << 30) - 5)
            assert f.read() == b"\0" * 5 + b"end"
        # Deleting everything gives the space back (at most the open write point stays).
        for name in (*model, "sparse"):
            os.unlink(mnt / name)
        stats = __import__("json").loads(run([tool("tierfs"), "ctl", mnt]).stdout)
        usage = stats["alloc"]["devices"][0]
        assert usage["user"] <= 1, usage
        assert stats["data"]["bytes_read"] > 0 and stats["data"]["csum_errors"] == 0
    finally:
        m.close()


def test_full_filesystem_is_enospc_and_recovers(mounted: Path) -> None:
    """Filling the 64 MiB image: ENOSPC, nothing corrupted (metadata still
    works, fsck clean at unmount), and the space comes back after a delete."""
    chunk = os.urandom(1 << 20)
    written = 0
    with pytest.raises(OSError) as e:
        with open(mounted / "fill", "wb") as f:
            for _ in range(200):
                f.write(chunk)
                f.flush()
                written += len(chunk)
    assert e.value.errno == errno.ENOSPC
    assert written >= 32 << 20  # most of the image was usable
    (mounted / "small-metadata-op").mkdir()
    size = os.stat(mounted / "fill").st_size
    with open(mounted / "fill", "rb") as f:  # what was written reads back
        assert f.read(1 << 20) == chunk
    os.unlink(mounted / "fill")
    # The kernel sends the file's RELEASE after close(2) returns, so the unlink
    # may find it still open (an orphan, freed at that RELEASE): wait for it.
    def space_back() -> bool:
        v = os.statvfs(mounted)
        return v.f_bavail * v.f_frsize >= size // 2
    wait_for(space_back, "the space of the deleted file")
    with open(mounted / "again", "wb") as f:
        for _ in range(max(1, (size >> 20) // 2)):
            f.write(chunk)
    assert (mounted / "again").stat().st_size >= 1 << 20


def test_large_directory_through_the_kernel(mounted: Path) -> None:
    d = mounted / "d"
    d.mkdir()
    names = {f"file-{i:05d}" for i in range(20000)}
    for n in names:
        os.close(os.open(d / n, os.O_CREAT | os.O_WRONLY, 0o644))
    assert set(os.listdir(d)) == names  # many readdir pages, resumed by cookie
    assert os.stat(d / "file-12345").st_size == 0


def test_unlinked_while_open(mounted: Path) -> None:
    p = mounted / "f"
    fd = os.open(p, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        os.unlink(p)
        assert os.fstat(fd).st_nlink == 0
        assert not p.exists()
        assert os.pwrite(fd, b"still here", 5000) == 10  # data of an orphan
        assert os.pread(fd, 20, 4995) == b"\0" * 5 + b"still here"
    finally:
        os.close(fd)
    assert os.listdir(mounted) == []


def test_persistence_daemon_mode_and_bad_mounts(tmp_path: Path) -> None:
    dev = image(tmp_path / "fs.img")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = run([tool("tierfs"), "mount", dev, mnt])  # returns once live
    assert proc.returncode == 0, proc.stderr
    assert os.path.ismount(mnt)
    # The same device again: refused while the daemon holds it.
    other = tmp_path / "mnt2"
    other.mkdir()
    again = run([tool("tierfs"), "mount", dev, other])
    assert again.returncode == 1 and f"already mounted on {mnt}" in again.stderr, again.stderr
    names = [f"f{i:04d}" for i in range(1500)]
    (mnt / "d").mkdir()
    for n in names:
        (mnt / "d" / n).touch()
    for n in names[::3]:
        os.unlink(mnt / "d" / n)
    os.symlink("target", mnt / "d" / "link")
    umount(mnt)
    fsck_clean(dev)  # at once: fsck waits for the daemon to let go
    m = Mount(dev, mnt)
    want = sorted(set(names) - set(names[::3]) | {"link"})
    assert sorted(os.listdir(mnt / "d")) == want
    assert os.readlink(mnt / "d" / "link") == "target"
    m.close()
    # Bad input: one line, nonzero, nothing mounted.
    junk = tmp_path / "junk.img"
    junk.write_bytes(b"\0" * (8 << 20))
    bad = run([tool("tierfs"), "mount", junk, mnt])
    assert bad.returncode == 1 and "tierfs mount:" in bad.stderr and not os.path.ismount(mnt)
    bad = run([tool("tierfs"), "mount", dev, tmp_path / "nodir"])
    assert bad.returncode == 1 and "not a directory" in bad.stderr
    bad = run([tool("tierfs"), "mount", dev, mnt, "-o", "no_such_option"])
    assert bad.returncode == 1 and not os.path.ismount(mnt)
    wait_for(lambda: unlocked(dev), "the failed mount to let go")
    fsck_clean(dev)


def test_mount_helper_for_mount_t_and_fstab(tmp_path: Path) -> None:
    """mount.fuse.tierfs as mount(8) calls it: devices joined by ':', fstab's own
    options dropped, -f a no-op."""
    a, b = two_members(tmp_path)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    helper = tool("mount.fuse.tierfs")
    proc = run([helper, f"{a}:{b}", mnt, "-f", "-o", "rw"])
    assert proc.returncode == 0 and not os.path.ismount(mnt)
    proc = run([helper, f"{b}:{a}", mnt, "-n", "-o", "rw,defaults,noauto,nofail,_netdev,x-systemd.automount"])
    assert proc.returncode == 0, proc.stderr
    try:
        (mnt / "d").mkdir()
        assert os.listdir(mnt) == ["d"]
    finally:
        umount(mnt)
    proc = run([tool("tierfs"), "fsck", a, b])
    assert proc.returncode == 0 and "1 entries" in proc.stdout, proc.stdout
    bad = run([helper, str(a), "-o", "rw"])
    assert bad.returncode == 1 and "usage: mount.fuse.tierfs" in bad.stderr


def test_bad_device_sets_are_refused_with_one_line(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a.img", tmp_path / "b.img", tmp_path / "c.img"
    for p in (a, b, c):
        with open(p, "wb") as f:
            f.truncate(64 << 20)
    assert run([tool("tierfs"), "format", "--label", "ssd.a", a, "--label", "hdd.b", b,
                "--bucket-size", "256K"]).returncode == 0
    assert run([tool("tierfs"), "format", c, "--bucket-size", "256K"]).returncode == 0
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    cases = [
        ([a], "missing: hdd.b"),  # a member left out
        ([a, c], "devices from different filesystems"),
    ]
    for devs, needle in cases:
        proc = run([tool("tierfs"), "mount", *devs, mnt])
        assert proc.returncode == 1, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("tierfs mount:") and needle in lines[0], proc.stderr
        assert not os.path.ismount(mnt)
    # A damaged primary superblock: the backup copy mounts it.
    with open(b, "r+b") as f:
        f.seek(4096 + 100)
        f.write(b"\xff" * 64)
    m = Mount([a, b], mnt)
    (mnt / "still").mkdir()
    m.close()  # (fsck clean: the mount rewrote nothing it should not have)


def test_a_read_only_mount_writes_nothing(tmp_path: Path) -> None:
    """-o ro opens the filesystem read-only, not only the kernel's mount:
    files read, a write fails with EROFS, and the image is byte for byte
    what it was (a writable open writes its superblock and journal). A
    filesystem never mounted writable has no root yet: refused in a line."""
    import hashlib
    a = image(tmp_path / "a.img")
    assert run([tool("tierfs"), "format", "--force", a]).returncode == 0
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    # Never mounted writable: no root directory to show, refused in one line.
    proc = run([tool("tierfs"), "mount", a, mnt, "-o", "ro"])
    assert proc.returncode == 1 and not os.path.ismount(mnt), proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "a read-only mount makes none: mount it writable once" in lines[0], proc.stderr
    m = Mount([a], mnt)
    (mnt / "f").write_bytes(b"kept" * 1000)
    m.close()
    before = hashlib.sha256(Path(a).read_bytes()).hexdigest()
    proc = subprocess.Popen([str(tool("tierfs")), "mount", "-f", str(a), str(mnt), "-o", "ro"],
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: os.path.ismount(mnt) or proc.poll() is not None, "the read-only mount")
        assert os.path.ismount(mnt), proc.stderr.read() if proc.stderr else ""
        assert (mnt / "f").read_bytes() == b"kept" * 1000
        expect(errno.EROFS, lambda: (mnt / "new").write_bytes(b"x"), "a write to a read-only mount")
    finally:
        umount(mnt)
        assert proc.wait(timeout=60) == 0
    assert hashlib.sha256(Path(a).read_bytes()).hexdigest() == before


def test_a_degraded_mount_reads_every_file_from_the_member_given(tmp_path: Path) -> None:
    """Two SSDs, two copies of everything: either image alone mounts with
    -o degraded,ro and reads every file; without the option the mount is
    refused with one line naming why. Then writable: one image alone takes
    a new file, and with both back a normal mount reads it."""
    a, b = image(tmp_path / "a.img"), image(tmp_path / "b.img")
    assert run([tool("tierfs"), "format", "--force", "--label", "ssd.a", a, "--label", "ssd.b", b, "--bucket-size",
                "256K", "--replicas", "2", "--metadata-replicas", "2"]).returncode == 0
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    files = {f"f{i}": os.urandom(50_000 * (i + 1)) for i in range(4)}
    m = Mount([a, b], mnt)
    for name, data in files.items():
        (mnt / name).write_bytes(data)
    m.close()
    for given, left in ((a, "ssd.b"), (b, "ssd.a")):
        proc = run([tool("tierfs"), "mount", given, mnt])
        assert proc.returncode == 1, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and f"missing: {left} (a degraded mount, tierfs mount -o degraded," in lines[0], \
            proc.stderr
        assert not os.path.ismount(mnt)
        proc = subprocess.Popen([str(tool("tierfs")), "mount", "-f", str(given), str(mnt), "-o", "degraded,ro"],
                                stderr=subprocess.PIPE, text=True)
        try:
            wait_for(lambda: os.path.ismount(mnt) or proc.poll() is not None, "the degraded mount")
            assert os.path.ismount(mnt), proc.stderr.read() if proc.stderr else ""
            for name, data in files.items():
                assert (mnt / name).read_bytes() == data, name
            expect(errno.EROFS, lambda: (mnt / "new").write_bytes(b"x"), "a write to a read-only mount")
        finally:
            umount(mnt)
            assert proc.wait(timeout=60) == 0
    fsck_clean([a, b])  # (nothing was written while degraded)
    proc = subprocess.Popen([str(tool("tierfs")), "mount", "-f", str(a), str(mnt), "-o", "degraded"],
                            stderr=subprocess.PIPE, text=True)
    new = os.urandom(70_000)
    try:
        wait_for(lambda: os.path.ismount(mnt) or proc.poll() is not None, "the writable degraded mount")
        assert os.path.ismount(mnt), proc.stderr.read() if proc.stderr else ""
        (mnt / "new").write_bytes(new)
        doc = ctl(mnt)
        devs = doc["devices"]
        assert [(d["label"], d["state"], d["path"]) for d in devs] == [("ssd.a", "ok", str(a)),
                                                                       ("ssd.b", "missing", "")], devs
        # Every older file has its other copy on the missing member
        # (degraded), the new one a copy on ssd.a alone (a degraded write).
        acct = doc["accounting"]
        assert (acct["copies_sectors"], acct["degraded_sectors"], acct["unavailable_sectors"]) == \
            ([sectors(new), sectors(*files.values()), 0, 0], sectors(*files.values()), 0), acct
        assert doc["data"]["degraded_writes"] == 1, doc["data"]
    finally:
        umount(mnt)
        assert proc.wait(timeout=60) == 0
    m = Mount([b, a], mnt)  # (in the other order: ctl names each member's own path)
    assert (mnt / "new").read_bytes() == new
    for name, data in files.items():
        assert (mnt / name).read_bytes() == data, name
    doc = ctl(mnt)
    devs = doc["devices"]
    assert [(d["label"], d["state"], d["path"]) for d in devs] == [("ssd.a", "ok", str(a)), ("ssd.b", "ok", str(b))], \
        devs
    assert doc["accounting"]["degraded_sectors"] == 0, doc["accounting"]  # (both members back)
    m.close()
    # tierfs show says the same from the images: per member the data it
    # holds copies of, and the data by its number of copies.
    proc = run([tool("tierfs"), "show", "--json", a, b])
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(proc.stdout)
    assert shown["data"]["copies_sectors"] == [sectors(new), sectors(*files.values()), 0, 0], shown["data"]
    assert [(m["label"], m["live_sectors"], m["cached_sectors"]) for m in shown["members"]] == \
        [("ssd.a", sectors(new, *files.values()), 0), ("ssd.b", sectors(*files.values()), 0)], shown["members"]
    text = run([tool("tierfs"), "show", a, b]).stdout
    assert f"MiB with 1 copy, {sectors(*files.values()) / 2048:.1f} MiB with 2 copies" in text, text


def sectors(*datas: bytes) -> int:
    """The 512-byte sectors of these files' data in whole 4 KiB blocks (as
    the accounting counts them: no compression here)."""
    return sum((len(d) + 4095) // 4096 * 8 for d in datas)


def test_replicated_writes_go_on_the_writers_own_rings(tmp_path: Path) -> None:
    """At --replicas 2 a write's two copies are a flight: each goes on the
    writing thread's own io_uring (docs/design/copies.md, "Step 7b"), and
    tierfs ctl shows it per member ("uring": waited_ios, and the daemon's
    thread rings); the data reads back after a remount."""
    a, b = image(tmp_path / "a.img"), image(tmp_path / "b.img")
    assert run([tool("tierfs"), "format", "--force", "--label", "ssd.a", a, "--label", "ssd.b", b,
                "--replicas", "2"]).returncode == 0
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    data = os.urandom(1 << 20)
    m = Mount([a, b], mnt)
    try:
        with open(mnt / "f", "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        devs = ctl(mnt)["devices"]
        for d in devs:
            assert "io" in d and "queued" in d, d  # (the core's keys, beside the front end's)
            io = d["uring"]
            # (One writer, queues far from full: every copy is dispatched
            # in the writing thread, onto its ring.)
            assert io["waited_ios"] > 0, d
        rings = devs[0]["uring"]["thread_rings"]
        assert rings["rings"] >= 1 and rings["rings_refused"] == 0, rings
        assert rings["submitted"] >= sum(d["uring"]["waited_ios"] for d in devs), rings
        assert rings["reaped_by_owner"] + rings["reaped_by_janitor"] > 0, rings
    finally:
        m.close()
    m = Mount([a, b], mnt)
    try:
        assert (mnt / "f").read_bytes() == data
    finally:
        m.close()
    fsck_clean([a, b])


def ctl(mnt: Path) -> dict:
    """tierfs ctl's document of the mount at MNT (a key twice in one object
    -- the core's and the front end's -- fails the test)."""
    proc = run([tool("tierfs"), "ctl", mnt])
    assert proc.returncode == 0, proc.stderr

    def unique(pairs: list) -> dict:
        keys = [k for k, _ in pairs]
        assert len(keys) == len(set(keys)), f"a key twice in one ctl object: {keys}"
        return dict(pairs)

    return json.loads(proc.stdout, object_pairs_hook=unique)


def daemon_pids(mnt_arg: str, image: Path) -> list[int]:
    """The tierfs daemons mounted with MNT_ARG that hold IMAGE open: the
    arguments alone also match another test run's daemon on the machine."""
    want = os.path.realpath(image)
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
            if not (b"mount" in argv and os.fsencode(mnt_arg) in argv and os.path.basename(argv[0]) == b"tierfs"):
                continue
            fds = [os.readlink(f) for f in (d / "fd").iterdir()]
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if want in fds:
            pids.append(int(d.name))
    return pids


def test_sigterm_unmounts_a_daemon_mounted_by_a_relative_path(tmp_path: Path) -> None:
    dev = image(tmp_path / "fs.img")
    (tmp_path / "mnt").mkdir()
    proc = run([tool("tierfs"), "mount", "fs.img", "mnt"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (tmp_path / "mnt" / "kept").mkdir()
    pids = daemon_pids("mnt", dev)
    assert len(pids) == 1, pids
    os.kill(pids[0], 15)
    wait_for(lambda: not os.path.ismount(tmp_path / "mnt") and unlocked(dev), "SIGTERM to unmount")
    fsck_clean(dev)
    m = Mount(dev, tmp_path / "mnt")
    assert os.listdir(tmp_path / "mnt") == ["kept"]
    m.close()


def task_flags(stat_path: Path) -> int:
    """A task's PF_* flags: field 9 of /proc/.../stat (after the
    parenthesised command name, which may hold spaces)."""
    text = stat_path.read_text()
    return int(text[text.rindex(")") + 2:].split()[6])


IO_FLUSHER_PROBE = """
import ctypes, sys
def flags():
    t = open('/proc/thread-self/stat').read()
    return int(t[t.rindex(')') + 2:].split()[6])
before = flags()
if ctypes.CDLL(None, use_errno=True).prctl(57, 1, 0, 0, 0) != 0:
    sys.exit('prctl(PR_SET_IO_FLUSHER) failed: errno %d' % ctypes.get_errno())
# Less PF_SUPERPRIV (0x100): the capability check sets it on the calling
# thread only, and new threads do not inherit it.
print(flags() & ~before & ~0x100)
"""


def test_the_daemon_and_every_thread_of_it_are_io_flushers(tmp_path: Path) -> None:
    """The daemon sets PR_SET_IO_FLUSHER before its threads start, so
    reclaim on behalf of any of them (btree writer, FUSE workers, fault
    devices) never waits for swap or filesystem writes. The bits the prctl
    sets are learnt from a process that sets it (so no PF_* value is
    assumed), then found on every thread of the daemon. Where the prctl is
    refused (no CAP_SYS_RESOURCE: a container's root) the daemon says so in
    its log and serves anyway."""
    probe = subprocess.run(["/usr/bin/python3", "-c", IO_FLUSHER_PROBE], capture_output=True, text=True)
    refused = probe.returncode != 0
    assert not refused or "errno 1\n" in probe.stderr, probe.stderr  # EPERM, or it must work
    dev = image(tmp_path / "fs.img")
    (tmp_path / "mnt").mkdir()
    log = tmp_path / "daemon.log"
    proc = run([tool("tierfs"), "mount", "fs.img", "mnt", "-o", f"log={log}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    try:
        (tmp_path / "mnt" / "f").write_bytes(b"x" * 65536)  # (the workers and the writer have run)
        if refused:
            assert "prctl(PR_SET_IO_FLUSHER): Operation not permitted" in log.read_text(), log.read_text()
            return
        bits = int(probe.stdout)
        assert bits != 0, "PR_SET_IO_FLUSHER set no task flag"
        pids = daemon_pids("mnt", dev)
        assert len(pids) == 1, pids
        tasks = sorted((Path("/proc") / str(pids[0]) / "task").iterdir())
        checked = 0
        for t in tasks:
            try:
                flags = task_flags(t / "stat")
            except OSError:  # a worker that exited meanwhile (io_uring's idle ones do)
                continue
            assert flags & bits == bits, f"thread {t.name} is not an I/O flusher"
            checked += 1
        assert checked > 1
        assert "PR_SET_IO_FLUSHER" not in log.read_text()
    finally:
        umount(tmp_path / "mnt")
        wait_for(lambda: unlocked(dev), "the daemon to exit")


def test_allow_other_owns_new_files_by_the_caller(tmp_path: Path) -> None:
    dev = image(tmp_path / "fs.img")
    # Other users must reach the mount point: pytest's own directories are 0700.
    mnt = Path(tempfile.mkdtemp(prefix="tierfs-mnt-", dir="/tmp"))
    os.chmod(mnt, 0o755)
    m = Mount(dev, mnt, "allow_other")
    try:
        (mnt / "open").mkdir(mode=0o777)
        os.chmod(mnt / "open", 0o777)
        (mnt / "closed").mkdir(mode=0o755)

        def as_user(*cmd: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(list(cmd), capture_output=True, text=True,
                                  preexec_fn=lambda: (os.setgid(4321), os.setuid(1234)))

        ok = as_user("touch", str(mnt / "open" / "mine"))
        assert ok.returncode == 0, ok.stderr
        st = os.stat(mnt / "open" / "mine")
        assert (st.st_uid, st.st_gid) == (1234, 4321)
        denied = as_user("touch", str(mnt / "closed" / "nope"))
        assert denied.returncode != 0 and "Permission denied" in denied.stderr
    finally:
        m.close()
        mnt.rmdir()


def test_memory_limit_makes_the_caches_give_memory_back(tmp_path: Path) -> None:
    import json
    dev = image(tmp_path / "fs.img")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    # Bad values: one line, exit 2, nothing mounted.
    for opt, what in (("memory_limit=lots", "not a size"), ("memory_limit=0", "not a size"),
                      ("memory_psi=101", "not a percentage"), ("memory_psi=x", "not a percentage")):
        bad = run([tool("tierfs"), "mount", dev, mnt, "-o", opt])
        assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and what in bad.stderr, (opt, bad.stderr)
        assert not os.path.ismount(mnt)
    m = Mount(dev, mnt)
    (mnt / "d").mkdir()
    for i in range(300):
        (mnt / "d" / f"file-{i:04d}").write_bytes(bytes([i % 251]) * (1000 + i))
    m.close()
    # A limit the daemon is always over: its pressure thread keeps the caches
    # small, and every byte stays. (A tree this small is a few dirty nodes,
    # which cannot go: the node cache's shrinking is fs/mount/pressure_test.cc's.)
    m = Mount(dev, mnt, "memory_limit=1M", "memory_psi=0")
    try:
        assert len(os.listdir(mnt / "d")) == 300
        with open(mnt / "held", "wb", buffering=0) as f:
            f.write(b"x" * 3000)  # buffered in the daemon while the file stays open

            def ctl() -> dict:
                proc = run([tool("tierfs"), "ctl", mnt])
                assert proc.returncode == 0, proc.stderr
                return json.loads(proc.stdout)

            wait_for(lambda: ctl()["posix"]["write_buffer"]["buffers_shrunk"] > 0, "a buffer freed by the pressure")
            f.write(b"y" * 100)
        assert (mnt / "held").read_bytes() == b"x" * 3000 + b"y" * 100
        for i in range(300):
            assert (mnt / "d" / f"file-{i:04d}").read_bytes() == bytes([i % 251]) * (1000 + i)
        # (Whether the run was still there to write out when the buffer went
        # depends on the kernel's flushes: fs/mount/pressure_test.cc checks
        # that write-out.)
        assert ctl()["posix"]["write_buffer"]["buffers_dropped"] == 0
    except BaseException:
        m.abandon()
        raise
    m.close()
