"""File data features through a real FUSE mount: the write buffer and close,
O_DIRECT, fallocate, chattr +c compression, and the daemon's log=FILE option.

Each test unmounts and runs `tierfs fsck` (Mount.close does). Needs /dev/fuse
and root; the helpers are fusetest.py's."""

from __future__ import annotations

import ctypes
import errno
import json
import mmap
import os
import threading
from pathlib import Path

import pytest

from fusetest import Mount, fsck_clean, image, needs_fuse, unlocked, wait_for
from tierlab.testing import run, tool

pytestmark = needs_fuse


def ctl(mnt: Path) -> dict:
    proc = run([tool("tierfs"), "ctl", mnt])
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture
def fs(tmp_path: Path):
    dev = image(tmp_path / "fs.img", mib=128)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    m = Mount(dev, mnt)
    try:
        yield m
    finally:
        if os.path.ismount(mnt):
            m.close()


def test_small_writes_coalesce_and_close_writes_them_out(fs: Mount) -> None:
    before = ctl(fs.mnt)
    lines = [f"line {i}: some words to make a log line\n".encode() for i in range(3000)]
    with open(fs.mnt / "log", "wb", buffering=0) as f:
        for line in lines:
            assert f.write(line) == len(line)
        # Buffered but visible: size and bytes, through the kernel.
        assert os.stat(fs.mnt / "log").st_size == sum(map(len, lines))
    after = ctl(fs.mnt)
    wb = after["posix"]["write_buffer"]
    assert wb["writes_buffered"] - before["posix"]["write_buffer"]["writes_buffered"] >= 3000  # (the kernel may split some)
    assert wb["flushes_close"] >= 1 and wb["buffers_now"] == 0
    # ~120 KiB in 3,000 writes: a handful of extents, not 3,000.
    assert after["data"]["extents_written"] - before["data"]["extents_written"] <= 4
    fs.close()
    m = Mount(fs.dev, fs.mnt)
    assert (fs.mnt / "log").read_bytes() == b"".join(lines)
    m.close()


def test_o_direct_writes_skip_the_buffer(fs: Mount) -> None:
    before = ctl(fs.mnt)["posix"]["write_buffer"]
    buf = mmap.mmap(-1, 1 << 16)  # page aligned, as O_DIRECT wants
    buf.write(os.urandom(1 << 16))
    fd = os.open(fs.mnt / "direct", os.O_CREAT | os.O_WRONLY | os.O_DIRECT, 0o644)
    try:
        for i in range(16):
            assert os.pwritev(fd, [buf], i << 16) == 1 << 16
    finally:
        os.close(fd)
    after = ctl(fs.mnt)["posix"]["write_buffer"]
    assert after["writes_direct"] - before["writes_direct"] == 16
    assert after["writes_buffered"] == before["writes_buffered"]
    assert (fs.mnt / "direct").read_bytes() == bytes(buf) * 16


def test_o_direct_writes_invalidate_cached_pages(fs: Mount) -> None:
    """An O_DIRECT write passes the kernel's page cache by (direct_io), yet a
    mapping of the file through a cached handle sees it as soon as the write
    returns, as on a local filesystem -- also while another thread keeps
    faulting the page back in during the writes (nothing revalidates a mapped
    page: the kernel drops it around the write, and a fault must then find the
    new bytes in tierfs, not the old ones)."""
    path = fs.mnt / "mixed"
    path.write_bytes(b"a" * 8192)
    cached = os.open(path, os.O_RDWR)
    direct = os.open(path, os.O_RDWR | os.O_DIRECT)
    buf = mmap.mmap(-1, 4096)
    stop = threading.Event()
    try:
        with mmap.mmap(cached, 8192, prot=mmap.PROT_READ) as view:
            assert view[4096:4100] == b"aaaa"  # the page is cached now

            def toucher() -> None:
                # Faults the page back in whenever it is dropped -- also while a
                # write is on its way, with the bytes from before it.
                while not stop.is_set():
                    _ = view[4096]

            t = threading.Thread(target=toucher)
            t.start()
            try:
                for i in range(300):
                    fill = b"%c" % (ord("b") + i % 20)
                    buf[:] = fill * 4096
                    assert os.pwritev(direct, [buf], 4096) == 4096
                    assert view[4096:8192] == fill * 4096, f"write {i}: the mapping kept the old page"
            finally:
                stop.set()
                t.join()
            assert view[0:4] == b"aaaa"
    finally:
        buf.close()
        os.close(direct)
        os.close(cached)


def test_fallocate_through_the_kernel(fs: Mount) -> None:
    path = fs.mnt / "pre"
    free0 = os.statvfs(fs.mnt).f_bfree
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        os.posix_fallocate(fd, 0, 16 << 20)
        st = os.fstat(fd)
        assert st.st_size == 16 << 20 and st.st_blocks == (16 << 20) // 512
        assert free0 - os.statvfs(fs.mnt).f_bfree >= (16 << 20) // os.statvfs(fs.mnt).f_bsize
        assert os.pread(fd, 4096, 5 << 20) == bytes(4096)
        os.pwrite(fd, b"x" * 8192, 1 << 20)
        os.fsync(fd)
    finally:
        os.close(fd)
    # Punch, keep size, collapse (not supported): the util-linux tool's errors.
    assert run(["fallocate", "--punch-hole", "-o", str(1 << 20), "-l", "4096", path]).returncode == 0
    assert run(["fallocate", "--keep-size", "-o", str(32 << 20), "-l", str(1 << 20), path]).returncode == 0
    bad = run(["fallocate", "--collapse-range", "-o", "0", "-l", "4096", path])
    assert bad.returncode != 0 and "not supported" in bad.stderr, bad.stderr
    data = path.read_bytes()
    assert len(data) == 16 << 20
    assert data[1 << 20:(1 << 20) + 4096] == bytes(4096) and data[(1 << 20) + 4096:(1 << 20) + 8192] == b"x" * 4096
    assert ctl(fs.mnt)["data"]["blocks_reserved"] > 0
    # Space past a full filesystem is refused up front, and nothing changes.
    big = run(["fallocate", "-l", "1G", fs.mnt / "huge"])
    assert big.returncode != 0 and "No space left" in big.stderr, big.stderr
    path.unlink()
    (fs.mnt / "huge").unlink(missing_ok=True)
    assert ctl(fs.mnt)["data"]["blocks_reserved"] == 0


def test_chattr_c_compresses_and_other_flags_are_refused(fs: Mount) -> None:
    path = fs.mnt / "text"
    path.touch()
    assert run(["chattr", "+c", path]).returncode == 0
    lsattr = run(["lsattr", path])
    assert lsattr.returncode == 0 and "c" in lsattr.stdout.split()[0], lsattr.stdout
    text = "".join(f"{i}: the quick brown fox jumps over the lazy dog\n" for i in range(40000)).encode()
    path.write_bytes(text)
    d = ctl(fs.mnt)["data"]
    assert d["compressed_in"] >= len(text) // 2 and d["compressed_in"] > 4 * d["compressed_out"]
    immutable = run(["chattr", "+i", path])
    assert immutable.returncode != 0 and "not supported" in immutable.stderr, immutable.stderr
    fs.close()
    m = Mount(fs.dev, fs.mnt)
    assert path.read_bytes() == text
    assert "c" in run(["lsattr", path]).stdout.split()[0]
    m.close()


STATX_ATTR_COMPRESSED = 0x4  # linux/stat.h


def statx_attributes(path: Path) -> tuple[int, int]:
    """statx(2)'s stx_attributes and stx_attributes_mask."""
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(256)
    if libc.statx(-100, os.fsencode(path), 0, 0xFFF, buf) != 0:  # AT_FDCWD, STATX_BASIC_STATS | STATX_BTIME
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()), str(path))
    # struct statx (linux/stat.h): stx_attributes at 8, stx_attributes_mask at 56.
    return int.from_bytes(buf.raw[8:16], "little"), int.from_bytes(buf.raw[56:64], "little")


def test_what_fuse_cannot_pass_on(fs: Mount) -> None:
    """Two answers posix has that FUSE (libfuse 3.14) cannot give
    (docs/usage.md, docs/design/posix.md): statx's STATX_ATTR_COMPRESSED of a
    chattr +c file (posix's GetFlags says FS_COMPR_FL, which lsattr shows;
    libfuse 3.14 has no statx operation, so the kernel's statx has no
    attributes), and a shared mapping of a file opened with O_DIRECT (ENODEV:
    the kernel refuses MAP_SHARED of a direct_io file unless the daemon
    negotiates FUSE_DIRECT_IO_ALLOW_MMAP, which libfuse 3.14 lacks; a
    private mapping works). If either starts working (a newer libfuse or
    kernel), this test says so and the docs must change."""
    path = fs.mnt / "c"
    path.write_bytes(b"")
    assert run(["chattr", "+c", path]).returncode == 0
    assert "c" in run(["lsattr", path]).stdout.split()[0]
    attrs, mask = statx_attributes(path)
    assert attrs & STATX_ATTR_COMPRESSED == 0 and mask & STATX_ATTR_COMPRESSED == 0, (attrs, mask)
    data = b"m" * 8192
    (fs.mnt / "d").write_bytes(data)
    fd = os.open(fs.mnt / "d", os.O_RDWR | os.O_DIRECT)
    try:
        with pytest.raises(OSError) as e:
            mmap.mmap(fd, len(data), mmap.MAP_SHARED, mmap.PROT_READ)
        assert e.value.errno == errno.ENODEV
        with mmap.mmap(fd, len(data), mmap.MAP_PRIVATE, mmap.PROT_READ) as mm:
            assert mm[:] == data
    finally:
        os.close(fd)


def test_daemon_log_option(tmp_path: Path) -> None:
    dev = image(tmp_path / "fs.img")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    log = tmp_path / "daemon.log"
    proc = run([tool("tierfs"), "mount", dev, mnt, "-o", f"log={log},allow_other"])
    assert proc.returncode == 0, proc.stderr
    (mnt / "f").write_text("x")
    assert run(["fusermount3", "-u", mnt]).returncode == 0
    wait_for(lambda: unlocked(dev), "the daemon to finish")
    text = log.read_text()
    assert f"mounted on {mnt}" in text and f"{mnt} unmounted, clean" in text, text
    bad = run([tool("tierfs"), "mount", dev, mnt, "-o", "log=/nonexistent/dir/log"])
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "log=/nonexistent/dir/log" in bad.stderr
    assert not os.path.ismount(mnt)
    fsck_clean(dev)


def test_listing_returns_attributes_without_a_lookup_each(tmp_path: Path) -> None:
    """readdirplus: `ls -l` of a cold directory gets every entry's attributes
    with the listing, not from one LOOKUP request per entry."""
    dev = image(tmp_path / "fs.img")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    m = Mount(dev, mnt)
    d = mnt / "dir"
    d.mkdir()
    for i in range(2000):
        p = d / f"f{i}"
        p.write_bytes(b"x" * (i % 97))
        os.chmod(p, 0o600 | (i % 8) << 3)
    m.close()
    m = Mount(dev, mnt)
    try:
        before = ctl(mnt)["posix"]["lookups"]
        seen = {e.name: e.stat(follow_symlinks=False) for e in os.scandir(d)}
        lookups = ctl(mnt)["posix"]["lookups"] - before
        assert len(seen) == 2000
        for i in range(2000):
            st = seen[f"f{i}"]
            assert st.st_size == i % 97 and st.st_mode & 0o777 == 0o600 | (i % 8) << 3, i
        assert lookups < 100, f"{lookups} lookups for 2,000 listed entries"
    finally:
        m.close()


def test_damaged_file_data_reads_as_eio(tmp_path: Path) -> None:
    """A block whose checksum does not match is EIO for the read that meets it
    (what usage.md promises, and what applications treat as a media error),
    counted in data.csum_errors; the file's other blocks still read."""
    dev = image(tmp_path / "fs.img")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    block = bytes(range(256)) * 16  # 4 KiB, found again on the image below
    m = Mount(dev, mnt)
    (mnt / "f").write_bytes(b"\0" * 4096 + block + b"\1" * 4096)
    m.close()
    img = bytearray(dev.read_bytes())
    at = img.find(block)
    assert at > 0 and img.find(block, at + 1) < 0
    img[at + 100] ^= 0xFF
    dev.write_bytes(bytes(img))
    m = Mount(dev, mnt)
    try:
        fd = os.open(mnt / "f", os.O_RDONLY | os.O_DIRECT)
        try:
            buf = mmap.mmap(-1, 4096)
            assert os.preadv(fd, [buf], 0) == 4096 and buf[:] == b"\0" * 4096
            with pytest.raises(OSError) as err:
                os.preadv(fd, [buf], 4096)
            assert err.value.errno == errno.EIO, err.value
            assert os.preadv(fd, [buf], 8192) == 4096 and buf[:] == b"\1" * 4096
        finally:
            os.close(fd)
        assert ctl(mnt)["data"]["csum_errors"] >= 1
    finally:
        m.close()


def _alloc_root(dev: Path) -> int:
    """Byte offset of the alloc btree's root node on a one-member image: the
    newest roots block (two 4 KiB slots at 64 KiB, gen at 32) names it
    (docs/format/btree.md: 72-byte pointers from byte 64, one per btree id; the
    alloc btree is id 4, its copy count at byte 6 of the pointer, the first
    copy's offset at byte 8)."""
    with open(dev, "rb") as f:
        best_gen, best = -1, b""
        for slot in range(2):
            f.seek((64 << 10) + slot * 4096)
            blk = f.read(4096)
            gen = int.from_bytes(blk[32:40], "little")
            if blk[:8] == (0x53544F4F52534654).to_bytes(8, "little") and gen > best_gen:
                best_gen, best = gen, blk
    ptr = best[64 + 4 * 72:64 + 5 * 72]
    assert ptr[6] != 0, "the alloc btree is empty"
    return int.from_bytes(ptr[8:16], "little")


def test_a_damaged_alloc_node_refuses_the_mount_and_fsck_rebuilds_it(tmp_path: Path) -> None:
    """Issue 18: one damaged byte in the current allocation-table slot made mount
    fall back to the older slot silently, and new writes overwrote live files.
    Since format version 3 the allocation state is the alloc btree's
    (docs/format/alloc.md): a damaged alloc node makes the mount refuse in one
    line, fsck -n exits 4, and fsck -y drops the node and rebuilds the
    allocation state from the trees with every file intact."""
    dev = image(tmp_path / "fs.img")
    mnt = tmp_path / "mnt"
    mnt.mkdir()

    def content(i: int) -> bytes:
        return bytes([i % 251]) * (30000 + 1000 * i)

    for rnd in range(3):
        m = Mount(dev, mnt)
        for i in range(rnd * 10, rnd * 10 + 10):
            (mnt / f"f{i}").write_bytes(content(i))
        m.close()
    at = _alloc_root(dev) + 100  # the first set's header: its checksum fails
    with open(dev, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x5A]))
    proc = run([tool("tierfs"), "mount", dev, mnt], timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and not os.path.ismount(mnt), proc.stderr
    assert "btree 4 root" in lines[-1], lines
    wait_for(lambda: unlocked(dev), "the refused daemon to let go")
    proc = run([tool("tierfs"), "fsck", "-n", dev])
    assert proc.returncode == 4 and "would drop the damaged level-0 node" in proc.stdout, proc.stdout
    proc = run([tool("tierfs"), "fsck", "-y", dev])
    assert proc.returncode == 1 and "rebuilt every member's allocation state" in proc.stdout \
        and "data lost" not in proc.stdout, proc.stdout
    fsck_clean(dev)
    m = Mount(dev, mnt)
    try:
        for i in range(30):
            assert (mnt / f"f{i}").read_bytes() == content(i), i
        for i in range(30, 40):  # new data lands in free buckets only
            (mnt / f"f{i}").write_bytes(content(i))
    finally:
        m.close()
    m = Mount(dev, mnt)
    try:
        for i in range(40):
            assert (mnt / f"f{i}").read_bytes() == content(i), i
    finally:
        m.close()


def _journal_entries(dev: Path) -> list[tuple[int, int]]:
    """(seq, offset) of every block on the image that starts a journal entry of
    this filesystem at or above the superblock's floor, oldest first."""
    proc = run([tool("tierfs"), "show", "--json", dev])
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    word = int.from_bytes(bytes.fromhex(info["uuid"].replace("-", ""))[:8], "little")
    magic = (0x4C4E524A53465454 ^ word).to_bytes(8, "little")
    found = []
    with open(dev, "rb") as f:
        data = f.read()
    for off in range(0, len(data), 4096):
        if data[off:off + 8] == magic:
            seq = int.from_bytes(data[off + 16:off + 24], "little")
            if seq >= info["journal_seq"]:
                found.append((seq, off))
    return sorted(found)


def test_a_damaged_journal_entry_refuses_the_mount_and_fsck_replays_past_it(tmp_path: Path) -> None:
    """Issue 18: damage to one journal entry with durable entries after it made
    replay stop there and drop every later fsync, with a warning on the mount
    command's stderr only. Now the mount refuses (stderr and log=FILE), fsck -n
    exits 4, and fsck -y replays what survives: files fsynced after the damage
    are there."""
    dev = image(tmp_path / "fs.img")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    m = Mount(dev, mnt)
    try:
        for i in range(12):
            fd = os.open(mnt / f"f{i}", os.O_WRONLY | os.O_CREAT, 0o644)
            os.write(fd, bytes([65 + i]) * (20000 + 1000 * i))
            os.fsync(fd)
            os.close(fd)
    finally:
        m.proc.kill()  # a crash: the journal is all there is
        m.proc.wait()
        run(["umount", "-l", mnt])
    wait_for(lambda: unlocked(dev), "the killed daemon to let go")
    entries = _journal_entries(dev)
    assert len(entries) >= 12, entries
    seq, off = entries[len(entries) // 3]
    with open(dev, "r+b") as f:
        f.seek(off + 60)  # reserved header bytes: the entry's crc fails
        b = f.read(1)
        f.seek(off + 60)
        f.write(bytes([b[0] ^ 0x5A]))
    log = tmp_path / "daemon.log"
    proc = run([tool("tierfs"), "mount", dev, mnt, "-o", f"log={log}"], timeout=120)
    assert proc.returncode == 1 and not os.path.ismount(mnt), proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert f"journal: entry {seq} is damaged" in last and "fsck -y" in last, proc.stderr
    assert last.split(": ", 1)[1] in log.read_text(), log.read_text()
    wait_for(lambda: unlocked(dev), "the refused daemon to let go")
    proc = run([tool("tierfs"), "fsck", "-n", dev])
    assert proc.returncode == 4 and "is damaged" in proc.stdout, proc.stdout
    proc = run([tool("tierfs"), "fsck", "-y", dev])
    assert proc.returncode == 1 and "replayed every surviving entry" in proc.stdout, proc.stdout
    fsck_clean(dev)
    m = Mount(dev, mnt)
    try:
        for i in range(9, 12):  # fsynced well after the damaged entry
            assert (mnt / f"f{i}").read_bytes() == bytes([65 + i]) * (20000 + 1000 * i), i
    finally:
        m.close()
