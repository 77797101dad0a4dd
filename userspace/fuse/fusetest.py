"""Helpers shared by the FUSE test modules (fuse_mount_test.py, fuse_model_test.py):
images, foreground mounts that run fsck after every unmount, the `mounted`
fixture, errno expectations, the libc calls Python's os module lacks (renameat2,
fallocate, utimensat with UTIME_OMIT, xattr calls with a caller-sized buffer,
statx of the mode alone, dropping an effective capability), running a function
as another user (or without a capability) in a forked child, and a snapshot of a tree
for comparing it across a remount. Not a test module itself."""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import pickle
import stat
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from tierlab.testing import run, tool

needs_fuse = pytest.mark.skipif(not os.path.exists("/dev/fuse") or os.geteuid() != 0,
                                reason="needs /dev/fuse and root")


def image(path: Path, mib: int = 64) -> Path:
    with open(path, "wb") as f:
        f.truncate(mib << 20)
    proc = run([tool("tierfs"), "format", path, "--bucket-size", "256K"])
    assert proc.returncode == 0, proc.stderr
    return path


def two_members(tmp_path: Path) -> tuple[Path, Path]:
    """Two 64 MiB images formatted as one filesystem (ssd.a, hdd.b)."""
    a, b = tmp_path / "a.img", tmp_path / "b.img"
    for p in (a, b):
        with open(p, "wb") as f:
            f.truncate(64 << 20)
    proc = run([tool("tierfs"), "format", "--label", "ssd.a", a, "--label", "hdd.b", b, "--bucket-size", "256K"])
    assert proc.returncode == 0, proc.stderr
    return a, b


def wait_for(cond: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.05)


def unlocked(dev: Path) -> bool:
    """True once no tierfs mount holds the device (the daemon has finished)."""
    with open(dev, "rb") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(f, fcntl.LOCK_UN)
        return True


def holders(mnt: Path, pids: list[int] | None = None) -> list[str]:
    """What keeps the mount busy, per process: open files, working or root
    directory, mappings under `mnt` ("pid 12 (python3) fd 5: /mnt/x/a")."""
    top = os.path.realpath(mnt)

    def under(p: str) -> bool:
        return p == top or p.startswith(top + "/")

    def link(path: str) -> str:
        try:
            return os.readlink(path)
        except OSError:  # closed meanwhile (the listing's own fd), or gone
            return ""

    out = []
    for pid in pids if pids is not None else [int(d) for d in os.listdir("/proc") if d.isdigit()]:
        base = f"/proc/{pid}"
        try:
            comm = Path(base, "comm").read_text().strip()
            links = [(f"fd {fd}", link(f"{base}/fd/{fd}")) for fd in os.listdir(f"{base}/fd")]
            links += [(w, link(f"{base}/{w}")) for w in ("cwd", "root")]
            links += [("mmap", line.split(None, 5)[5]) for line in Path(base, "maps").read_text().splitlines()
                      if len(line.split(None, 5)) == 6]
        except OSError:  # gone, or a kernel thread
            continue
        out += [f"pid {pid} ({comm}) {what}: {target}" for what, target in links if under(target)]
    return sorted(set(out))


def umount(mnt: Path) -> None:
    """Unmounts; the test's own process must hold nothing in the mount (a test
    that does is named here, instead of an EBUSY), and a busy mount names who
    holds it."""
    mine = holders(mnt, [os.getpid()])
    assert not mine, f"the test still holds {mnt}: {mine}"
    proc = run(["fusermount3", "-u", mnt])
    assert proc.returncode == 0, f"{proc.stderr.strip()}; holders: {holders(mnt) or 'none seen after the fact'}"


def fsck_clean(dev: Path | list[Path]) -> None:
    proc = run([tool("tierfs"), "fsck", *(dev if isinstance(dev, list) else [dev])])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "clean" in proc.stdout


class Mount:
    """A foreground `tierfs mount -f` in a child process; close() unmounts, waits
    for the daemon and requires `tierfs fsck` clean."""

    def __init__(self, dev: Path | list[Path], mnt: Path, *opts: str) -> None:
        self.dev, self.mnt = dev, mnt
        args = [tool("tierfs"), "mount", "-f", *(dev if isinstance(dev, list) else [dev]), mnt]
        for o in opts:
            args += ["-o", o]
        self.proc = subprocess.Popen([str(a) for a in args], stderr=subprocess.PIPE, text=True)
        wait_for(lambda: os.path.ismount(mnt) or self.proc.poll() is not None, "the mount")
        assert os.path.ismount(mnt), self.proc.stderr.read() if self.proc.stderr else ""

    def close(self) -> None:
        umount(self.mnt)
        rc = self.proc.wait(timeout=60)
        err = self.proc.stderr.read() if self.proc.stderr else ""
        assert rc == 0, err
        fsck_clean(self.dev)

    def abandon(self) -> None:
        """After a failure: unmount lazily and stop the daemon, checking nothing."""
        if os.path.ismount(self.mnt):
            subprocess.run(["umount", "-l", str(self.mnt)], capture_output=True)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        # What the daemon said (a crash, a sanitizer report) goes into the
        # failed test's captured output.
        err = self.proc.stderr.read() if self.proc.stderr else ""
        print(f"tierfs mount -f exited {self.proc.returncode}; its stderr (last 8 KiB):\n{err[-8192:]}")


@pytest.fixture
def mounted(tmp_path: Path) -> Iterator[Path]:
    dev = image(tmp_path / "fs.img")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    m = Mount(dev, mnt)
    try:
        yield mnt
    finally:
        m.close()


def expect(errno_value: int | None, fn: Callable[[], object], what: str) -> None:
    if errno_value is None:
        fn()
        return
    with pytest.raises(OSError) as e:
        fn()
    assert e.value.errno == errno_value, f"{what}: {os.strerror(e.value.errno or 0)}"


# --- libc calls the os module lacks ----------------------------------------------

libc = ctypes.CDLL("libc.so.6", use_errno=True)
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
libc.utimensat.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int]
libc.renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
libc.getxattr.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t]
libc.getxattr.restype = ctypes.c_ssize_t
libc.listxattr.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t]
libc.listxattr.restype = ctypes.c_ssize_t
libc.statx.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p]

AT_FDCWD = -100
RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2
FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, FALLOC_FL_ZERO_RANGE = 0x01, 0x02, 0x10
UTIME_NOW, UTIME_OMIT = (1 << 30) - 1, (1 << 30) - 2


def _check(rc: int) -> int:
    if rc < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return rc


def renameat2(src: Path, dst: Path, flags: int) -> None:
    _check(libc.renameat2(AT_FDCWD, os.fsencode(src), AT_FDCWD, os.fsencode(dst), flags))


def fallocate(fd: int, mode: int, off: int, length: int) -> None:
    """fallocate(2) with any mode (os.posix_fallocate knows only mode 0, and
    glibc's posix_fallocate emulates it by writing when the filesystem refuses)."""
    _check(libc.fallocate(fd, mode, off, length))


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def utimensat(path: Path, atime: tuple[int, int], mtime: tuple[int, int], flags: int = 0) -> None:
    """(seconds, nanoseconds) per time; nanoseconds may be UTIME_NOW or UTIME_OMIT."""
    times = (_Timespec * 2)(_Timespec(*atime), _Timespec(*mtime))
    _check(libc.utimensat(AT_FDCWD, os.fsencode(path), times, flags))


def getxattr_sized(path: Path, name: str, size: int) -> bytes:
    """getxattr(2) with a buffer of exactly `size` bytes (0 asks for the length,
    returned as that many NULs)."""
    buf = ctypes.create_string_buffer(max(size, 1))
    n = _check(libc.getxattr(os.fsencode(path), name.encode(), buf if size else None, size))
    return buf.raw[:n] if size else b"\0" * n


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


CAP_FSETID = 4


def drop_effective_caps(*caps: int) -> None:
    """Takes capabilities out of this thread's effective set (capset(2))."""
    hdr = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = (_CapData * 2)()
    _check(libc.capget(ctypes.byref(hdr), data))
    for c in caps:
        data[c // 32].effective &= ~(1 << (c % 32))
    _check(libc.capset(ctypes.byref(hdr), data))


STATX_MODE = 0x2


def statx_mode(path: Path) -> int:
    """st_mode by statx(2) asking for the mode alone: FUSE answers it from the
    kernel's cached attributes while they are valid (stat(2) asks for times
    too, which a write invalidates), so this shows a stale cached mode."""
    buf = ctypes.create_string_buffer(256)
    _check(libc.statx(AT_FDCWD, os.fsencode(path), 0, STATX_MODE, buf))
    return int.from_bytes(buf.raw[28:30], "little")  # struct statx: stx_mode at 28


def listxattr_sized(path: Path, size: int) -> bytes:
    buf = ctypes.create_string_buffer(max(size, 1))
    n = _check(libc.listxattr(os.fsencode(path), buf if size else None, size))
    return buf.raw[:n] if size else b"\0" * n


# --- another user ------------------------------------------------------------------

def as_user(uid: int, gid: int, fn: Callable[[], Any], groups: tuple[int, ...] = (),
            drop_caps: tuple[int, ...] = ()) -> Any:
    """Runs fn in a forked child with the given real and effective ids (and
    without the capabilities `drop_caps` in its effective set) and returns
    its result; an OSError in the child comes back as the errno, as an int
    wrapped in Errno (so a result can still be an int)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            os.close(r)
            os.setgroups(list(groups))
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
            if drop_caps:
                drop_effective_caps(*drop_caps)
            try:
                out: Any = ("ok", fn())
            except OSError as e:
                out = ("errno", e.errno)
            with os.fdopen(w, "wb") as f:
                pickle.dump(out, f)
        except BaseException:  # noqa: BLE001 - reported as the child's exit code
            code = 1
        os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and data, "the child failed"
    kind, value = pickle.loads(data)
    return Errno(value) if kind == "errno" else value


class Errno(int):
    def __repr__(self) -> str:
        import errno
        return f"Errno({errno.errorcode.get(int(self), int(self))})"


# --- a tree's state, to compare across a remount ---------------------------------

def snapshot(root: Path) -> dict[str, tuple]:
    """Everything a remount must keep, per path under root: type, mode, owner,
    link count, size, rdev, mtime and ctime in ns, xattrs, the symlink target
    and a hash of regular files' content (of their first and last MiB past
    64 MiB). atime is left out: reading the files
    here may move it."""
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            p = Path(dirpath) / name
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                extra: Any = os.readlink(p)
            elif stat.S_ISREG(st.st_mode):
                h = hashlib.sha256()
                with open(p, "rb") as f:
                    if st.st_size <= 64 << 20:
                        while chunk := f.read(1 << 20):
                            h.update(chunk)
                    else:  # a large sparse file: its first and last MiB
                        h.update(f.read(1 << 20))
                        f.seek(st.st_size - (1 << 20))
                        h.update(f.read())
                extra = h.hexdigest()
            else:
                extra = None
            xattrs = tuple(sorted((n, os.getxattr(p, n, follow_symlinks=False))
                                  for n in os.listxattr(p, follow_symlinks=False)))
            out[str(p.relative_to(root))] = (st.st_mode, st.st_uid, st.st_gid, st.st_nlink, st.st_size,
                                             st.st_rdev, st.st_mtime_ns, st.st_ctime_ns, xattrs, extra)
    return out
