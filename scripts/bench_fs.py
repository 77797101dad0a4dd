#!/usr/bin/python3
"""The filesystem benchmark of issue 6: tierfs through FUSE beside a plain FUSE
passthrough (libfuse's passthrough_ll example) over the same disk and ext4 on a loop
device backed by that disk; and (issue 21) tierfs over two members with one data
copy against two. See docs/benchmarks.md ("Filesystem (issue 6)", "Replicas 1 vs 2").

    scripts/bench-fs [--build DIR] [--dir DIR] [--rounds 3] [--runtime 30] [--size 1G]
                     [--fsync-size 256M] [--files 100000] [--per-dir 1000]
                     [--image-size 8G] [--targets tierfs,passthrough,ext4] [--json PATH]
                     [--steps randrw,fsync,create,stat,ls_lR,du_s,unlink]
    scripts/bench-fs --targets tierfs-r1,tierfs-r2 --steps randrw,fsync [...]
    scripts/bench-fs --report FILE.json [--markdown]

Targets (--targets, default tierfs,passthrough,ext4):
  tierfs       tierfs mount -f of one --image-size image file (format defaults)
  passthrough  libfuse's passthrough_ll over a directory of --dir
  ext4         ext4 on a loop device (direct I/O) over one --image-size image file
  tierfs-r1    tierfs over two --image-size image files, members ssd.a and ssd.b,
  tierfs-r2    formatted --replicas 1 and --replicas 2 (with 2, each write puts a
               copy on both members, written in parallel, and its commit waits for
               both)
Ratios are taken of these pairs when both are run: tierfs/passthrough,
tierfs/ext4 and tierfs-r2/tierfs-r1, of the medians and in each round. The goals:
tierfs's randrw IOPS >= 0.8x the passthrough's and fsync p99 <= 1.5x (issue 6);
tierfs-r2's randrw IOPS >= 0.8x tierfs-r1's (issue 21). tierfs fsck checks every
tierfs target's members after the last round.

Steps, each run on every target before the next step starts (the order of the
targets rotates from round to round, so a noisy machine hits them alike; every
target is remounted, with the kernel's caches dropped, before create, ls_lR and du_s):
  randrw  fio: 4 KiB random read/write, libaio, direct=1, iodepth 64, 2 jobs of
          --size each, --runtime seconds, time_based, group_reporting
  fsync   fio: 4 KiB random buffered writes with fsync=1, psync, 1 job, iodepth 1,
          a --fsync-size file, --runtime seconds
  create  --files empty files in directories of --per-dir (open O_CREAT|O_EXCL, close)
  stat    stat of every file (right after create: warm)
  ls_lR   `ls -lR` over the tree after a remount and drop_caches (cold)
  du_s    `du -s` over the tree after a remount and drop_caches (cold)
  unlink  unlink of every file
fio runs with --output-format=json+ and is read by the lab's fio parser
(results/tierlab/fio.py, the one the workload folders use); each measured fio
step is also written, through the lab's results path, as a run-v1 results
document into JSON.runs/ (TARGET-STEP-rROUND.json), so `tierlab report --a
... --b ...` compares targets like any other runs.
fio's files are written once before round 1 (sequential 1 MiB writes, untimed, kept
for every round); fallocate=none everywhere, so every target lays its files out
alike (written, not reserved). Image files (every tierfs member's, ext4's) are
written through with zeros before they are formatted: a real device has no holes,
and a sparse image makes the host filesystem allocate at each first write, which
forces io_uring onto its worker threads. A run whose fio files (times the data
copies) would take more than 40% of a target's image files is refused up front:
tierfs's copy-on-write overwrites hold about twice the files' bytes.

The passthrough is /usr/share/doc/libfuse3-dev/examples/passthrough_ll.c compiled
unchanged into the scratch directory, with one header forced in front of it
(DIRECT_WRITE_SHIM in bench_fs.py): the example opens the backing file with the caller's
O_DIRECT and writes libfuse's unaligned request buffer to it, which fails with
EINVAL, so the shim copies an O_DIRECT write into an aligned buffer first. Its
writes still reach the disk with O_DIRECT, as tierfs's do (tierfs opens its image
with O_DIRECT). passthrough_ll also keeps an O_PATH descriptor open for every inode
the kernel has looked up, so with it --files must stay below the descriptor limit
(ulimit -Hn; a run that would pass it stops before it starts and says how many fit).
The limit is raised to the hard limit for both FUSE daemons.

Needs root (loop device, mounts, drop_caches), /dev/fuse, fio, mkfs.ext4, losetup,
cc and pkg-config with libfuse3-dev, and a built tierfs (--build, default build/).
Mounts, the loop device and the scratch directory are removed on exit, on failure
and on Ctrl-C. Any failure is one line on stderr and exit 1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import mmap
import os
import platform
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "results"))
from tierlab import LabError  # noqa: E402
from tierlab import fio as labfio  # noqa: E402
from tierlab import workload as labwl  # noqa: E402
from tierlab.hist import Histogram  # noqa: E402

# fio sections -> op names, for the lab's fio parser (the same one the workload
# folders use: json+ latency bins re-bucketed into tfs::Histogram buckets).
FIO_OPS = {"read": "read", "write": "write", "sync": "fsync"}
SCHEMA = REPO / "results" / "schema" / "bench-fs-v1.schema.json"
PASSTHROUGH_SRC = Path("/usr/share/doc/libfuse3-dev/examples/passthrough_ll.c")
TARGETS = ("tierfs", "passthrough", "ext4", "tierfs-r1", "tierfs-r2")
DEFAULT_TARGETS = ("tierfs", "passthrough", "ext4")
# The tierfs targets: name -> (member labels, None for one unlabeled image;
# `tierfs format --replicas`, None for format's default). Every member is an
# --image-size image file of its own.
TIERFS_TARGETS: dict[str, tuple[tuple[str, ...] | None, int | None]] = {
    "tierfs": (None, None),
    "tierfs-r1": (("ssd.a", "ssd.b"), 1),
    "tierfs-r2": (("ssd.a", "ssd.b"), 2),
}
# fio's files (the steps' files: 2 x --size for randrw, --fsync-size for fsync,
# times the data copies) must stay under this share of the space their target's
# images hold. tierfs writes every overwrite elsewhere and frees a bucket only once
# every block in it has been overwritten, so a run of random overwrites holds about
# twice its files' bytes (up to about 4700 of 8192 1 MiB buckets for 2.25 GiB of
# files in fs-2026-12-01-s7-final.json), plus the journal, the btree and the reserves.
ROOM_SHARE = 0.4
STEPS = ("randrw", "fsync", "create", "stat", "ls_lR", "du_s", "unlink")
FIO_STEPS = ("randrw", "fsync")
META_STEPS = ("create", "stat", "ls_lR", "du_s", "unlink")
# Each target is unmounted, the kernel's caches dropped and the target mounted again
# before these: the metadata steps start from a fresh mount, ls_lR and du_s are cold.
REMOUNT_BEFORE = ("create", "ls_lR", "du_s")
# (numerator, denominator) of the ratios summarize() takes, when both are run.
RATIO_PAIRS = (("tierfs", "passthrough"), ("tierfs", "ext4"), ("tierfs-r2", "tierfs-r1"))
# The issues' targets: tierfs against the passthrough (issue 6); two data copies
# against one (issue 21). Each is judged on the ratio of the medians of its pair.
GOALS = (
    {"name": "randrw IOPS >= 80% of passthrough", "pair": "tierfs/passthrough", "metric": "randrw.iops",
     "bound": 0.8, "at_least": True},
    {"name": "fsync p99 <= 1.5x passthrough", "pair": "tierfs/passthrough", "metric": "fsync.fsync_p99_us",
     "bound": 1.5, "at_least": False},
    {"name": "replicas=2 randrw IOPS >= 80% of replicas=1", "pair": "tierfs-r2/tierfs-r1",
     "metric": "randrw.iops", "bound": 0.8, "at_least": True},
)

# Forced in front of passthrough_ll.c (cc -include): passthrough_ll opens the backing
# file with the caller's flags, O_DIRECT included, and hands libfuse's request
# buffer (the data sits right after the request header, or in a pipe page at that
# offset) to pwrite, which O_DIRECT refuses with EINVAL. This bounces such a write
# through a page-aligned buffer; everything else goes to libfuse unchanged.
DIRECT_WRITE_SHIM = r"""
#define _GNU_SOURCE
#define FUSE_USE_VERSION 34
#include <fuse_lowlevel.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

static ssize_t bench_fs_buf_copy(struct fuse_bufvec *dst, struct fuse_bufvec *src,
                                 enum fuse_buf_copy_flags flags)
{
	const struct fuse_buf *out = &dst->buf[0];
	int fl = (dst->count == 1 && (out->flags & FUSE_BUF_IS_FD)) ? fcntl(out->fd, F_GETFL) : 0;
	if (fl == -1 || !(fl & O_DIRECT) || !(out->flags & FUSE_BUF_FD_SEEK))
		return fuse_buf_copy(dst, src, flags);
	size_t len = fuse_buf_size(src);
	void *mem;
	if (posix_memalign(&mem, 4096, len ? len : 1) != 0)
		return -ENOMEM;
	struct fuse_bufvec aligned = FUSE_BUFVEC_INIT(len);
	aligned.buf[0].mem = mem;
	ssize_t n = fuse_buf_copy(&aligned, src, flags);
	if (n > 0) {
		n = pwrite(out->fd, mem, (size_t)n, out->pos);
		if (n < 0)
			n = -errno;
	}
	free(mem);
	return n;
}
#define fuse_buf_copy bench_fs_buf_copy
"""


class BenchError(Exception):
    """A failure the user sees as one line: what failed and, where known, why."""


# ---------------------------------------------------------------- small helpers


def log(msg: str) -> None:
    """Progress, on stdout: stderr is kept for the one line of a failure."""
    print(f"== {msg}", flush=True)


def err(msg: str) -> None:
    print(f"bench-fs: {msg}", file=sys.stderr, flush=True)


def now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_size(text: str) -> int:
    """'64M' -> 64 MiB, '1G' -> 1 GiB, '4096' -> 4096 (K/M/G/T are powers of 1024)."""
    m = re.fullmatch(r"(\d+)([KMGT]?)(?:i?B)?", text.strip(), re.IGNORECASE)
    if not m or int(m.group(1)) == 0:
        raise argparse.ArgumentTypeError(f"'{text}' is not a size like 64M or 1G")
    return int(m.group(1)) << (10 * " KMGT".index((m.group(2) or " ").upper()))


def size_text(n: int) -> str:
    for shift, unit in ((40, "T"), (30, "G"), (20, "M"), (10, "K")):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "(no output)"


def run(cmd: list[str], what: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    """Runs cmd; a nonzero exit is a BenchError naming `what` and the last line it printed."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    except FileNotFoundError:
        raise BenchError(f"{what}: {cmd[0]} not found") from None
    if proc.returncode != 0:
        raise BenchError(f"{what} failed (exit {proc.returncode}): {last_line(proc.stderr or proc.stdout)}")
    return proc


def mounted(path: Path) -> bool:
    """Whether `path` is a mount point, from /proc/self/mountinfo (never stats the
    path, which would hang on a dead FUSE daemon)."""
    want = str(path)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4].replace("\\040", " ")
            if mp == want:
                return True
    return False


def drop_caches() -> None:
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError as e:
        raise BenchError(f"cannot drop caches (/proc/sys/vm/drop_caches: {e.strerror})") from None


def cpu_times() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, from /proc/stat."""
    fields = [float(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already inside user
    return (total - idle) / hz, total / hz


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system, all threads) of a running process, 0 if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_ctx_switches(pid: int) -> dict[int, int]:
    """Context switches (voluntary + involuntary) of each thread of a running
    process, by thread id; empty if it is gone."""
    out: dict[int, int] = {}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            status = (task / "status").read_text()
        except OSError:
            continue  # (exited meanwhile)
        out[int(task.name)] = sum(int(line.split()[1]) for line in status.splitlines()
                                  if line.startswith(("voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:")))
    return out


def ctx_switch_delta(before: dict[int, int], after: dict[int, int]) -> int:
    """Switches between two process_ctx_switches() views: a thread new since
    `before` counts whole; one gone by `after` is missing (its last count is
    lost with it)."""
    return sum(max(0, n - before.get(tid, 0)) for tid, n in after.items())


def own_cpu() -> float:
    """CPU seconds of this process and its waited-for children (fio, ls, du)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def raise_fd_limit() -> None:
    """For the FUSE daemons: passthrough_ll keeps an O_PATH descriptor for every
    inode the kernel knows, so 100k files need more than the usual limit."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    most = int(Path("/proc/sys/fs/nr_open").read_text())
    for limit in (most, hard):  # past the hard limit only with CAP_SYS_RESOURCE
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
            return
        except (ValueError, OSError):
            continue


def percentile(hists: dict[str, Histogram], op: str, p: float) -> float:
    """Percentile p (0..100) of an op's latency, in microseconds, from the lab's
    parse of fio's json+ bins (tierlab.fio)."""
    h = hists.get(op)
    if h is None or h.count == 0:
        raise BenchError(f"fio output has no {op} latencies")
    return h.quantile(p / 100) / 1000.0


# ---------------------------------------------------------------- targets


@dataclass
class Target:
    """One filesystem under test, mounted at `mnt`. Subclasses know how to mount and
    unmount it; `pid` is its FUSE daemon (None for the kernel's ext4)."""

    name: str
    mnt: Path
    logs: Path
    description: str = ""
    proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def mount(self) -> None:
        raise NotImplementedError

    def _start_daemon(self, cmd: list[str]) -> None:
        """Starts a FUSE daemon in the foreground as our child (in its own session,
        so a Ctrl-C reaches only us and cleanup unmounts it) and waits for its mount."""
        log_path = self.logs / f"{self.name}.log"
        with open(log_path, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                         start_new_session=True, preexec_fn=raise_fd_limit)
        end = time.monotonic() + 30
        while not mounted(self.mnt):
            if self.proc.poll() is not None:
                raise BenchError(f"mounting {self.name} failed (exit {self.proc.returncode}): "
                                 f"{last_line(log_path.read_text(errors='replace'))}")
            if time.monotonic() > end:
                raise BenchError(f"mounting {self.name}: no mount at {self.mnt} after 30 s")
            time.sleep(0.02)

    def unmount(self, lazy_ok: bool = False) -> None:
        """Unmounts and waits for the daemon to finish (tierfs writes everything out
        first). With lazy_ok (cleanup), a busy mount is detached with umount -l and a
        daemon that does not exit is killed."""
        if mounted(self.mnt):
            proc = subprocess.run(["umount", str(self.mnt)], capture_output=True, text=True)
            if proc.returncode != 0:
                if not lazy_ok:
                    raise BenchError(f"umount {self.mnt} failed: {last_line(proc.stderr)}")
                subprocess.run(["umount", "-l", str(self.mnt)], capture_output=True)
        if self.proc is not None:
            try:
                rc = self.proc.wait(timeout=300 if not lazy_ok else 120)
            except subprocess.TimeoutExpired:
                if not lazy_ok:
                    raise BenchError(f"the {self.name} daemon (pid {self.proc.pid}) did not exit "
                                     "300 s after umount") from None
                self.proc.terminate()
                try:
                    rc = self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    rc = self.proc.wait()
            self.proc = None
            if rc != 0 and not lazy_ok:
                raise BenchError(f"the {self.name} daemon exited {rc} after umount: "
                                 f"{last_line((self.logs / f'{self.name}.log').read_text(errors='replace'))}")

    def died(self) -> str:
        """' (the daemon exited N: its last line)' once the FUSE daemon is gone, else ''."""
        if self.proc is None or self.proc.poll() is None:
            return ""
        text = (self.logs / f"{self.name}.log").read_text(errors="replace")
        return f" (the {self.name} daemon exited {self.proc.returncode}: {last_line(text)})"

    def remount(self) -> None:
        """Unmount, drop the kernel's caches, mount again: cold caches everywhere
        (a FUSE daemon's own caches go with its process)."""
        self.unmount()
        drop_caches()
        self.mount()

    def ctl(self) -> dict[str, Any] | None:
        return None


def write_image(path: Path, size: int) -> None:
    """An image file of `size` bytes, every block written (zeros), as a real device
    is. A sparse image makes the host filesystem allocate blocks at each first
    write into a hole, which io_uring cannot do without blocking, so those writes
    go to its worker threads: a cost of the test setup, not of the filesystem."""
    chunk = 4 << 20
    buf = mmap.mmap(-1, chunk)  # page aligned, for O_DIRECT
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_DIRECT", 0), 0o644)
    try:
        for off in range(0, size - size % chunk, chunk):
            os.pwritev(fd, [buf], off)
        os.ftruncate(fd, size)
    finally:
        os.close(fd)
        buf.close()


@dataclass
class Tierfs(Target):
    """tierfs over one image file per member: `labels` names them (None: one
    unlabeled image); `replicas` is format's --replicas (None: its default)."""

    tierfs: Path = Path()
    images: list[Path] = field(default_factory=list)
    labels: tuple[str, ...] | None = None
    replicas: int | None = None

    @classmethod
    def make(cls, name: str, mnt: Path, logs: Path, tierfs: Path, work: Path) -> Tierfs:
        labels, replicas = TIERFS_TARGETS[name]
        images = ([work / f"{name}.img"] if labels is None
                  else [work / f"{name}-{label.replace('.', '-')}.img" for label in labels])
        return cls(name, mnt, logs, tierfs=tierfs, images=images, labels=labels, replicas=replicas)

    def setup(self, image_bytes: int) -> None:
        members: list[str] = []
        for i, image in enumerate(self.images):
            write_image(image, image_bytes)
            members += ["--label", self.labels[i], str(image)] if self.labels else [str(image)]
        options = ["--replicas", str(self.replicas)] if self.replicas else []
        run([str(self.tierfs), "format", *options, *members], f"tierfs format of {self.name}")
        defaults = "1 MiB buckets, 256 KiB btree nodes"
        if self.labels is None:
            self.description = (f"tierfs mount -f of a fresh {size_text(image_bytes)} image file, written "
                                f"through before format (format defaults: {defaults})")
            return
        how = (f"each write puts a copy on {self.replicas} members, written in parallel, and its commit "
               "waits for them all" if (self.replicas or 1) > 1 else "each write puts one copy on one member")
        self.description = (f"tierfs mount -f of {len(self.images)} fresh {size_text(image_bytes)} image files, "
                            f"members {' and '.join(self.labels)} (one group, no targets), written through "
                            f"before format; tierfs format {' '.join(options)} ({how}; "
                            f"otherwise format defaults: {defaults}, metadata replicas 1)")

    def mount(self) -> None:
        self._start_daemon([str(self.tierfs), "mount", "-f", *map(str, self.images), str(self.mnt)])

    def fsck(self) -> dict[str, Any]:
        """tierfs fsck (read-only) of the unmounted members: exit and last line."""
        proc = subprocess.run([str(self.tierfs), "fsck", *map(str, self.images)], capture_output=True, text=True)
        return {"exit": proc.returncode, "summary": last_line(proc.stdout + proc.stderr)}

    def ctl(self) -> dict[str, Any] | None:
        proc = run([str(self.tierfs), "ctl", str(self.mnt)], "tierfs ctl")
        try:
            return json.loads(proc.stdout)
        except ValueError:
            raise BenchError(f"tierfs ctl printed no JSON: {last_line(proc.stdout)}") from None


@dataclass
class Passthrough(Target):
    binary: Path = Path()
    source: Path = Path()

    def setup(self, work: Path) -> None:
        if not PASSTHROUGH_SRC.exists():
            raise BenchError(f"{PASSTHROUGH_SRC} is missing (Debian package libfuse3-dev)")
        shim = work / "direct_write_shim.h"
        shim.write_text(DIRECT_WRITE_SHIM)
        flags = run(["pkg-config", "--cflags", "--libs", "fuse3"], "pkg-config fuse3").stdout.split()
        # passthrough_ll.c includes "passthrough_helpers.h" from its own directory,
        # which a quoted include finds beside the source.
        run(["cc", "-Wall", "-O2", "-include", str(shim), str(PASSTHROUGH_SRC), *flags,
             "-o", str(self.binary)], "compiling passthrough_ll.c")
        self.source.mkdir()
        self.description = (f"libfuse {fuse_version()} passthrough_ll (example, -O2, default "
                            f"options: cache=auto, 1 s timeouts) over {self.source}; "
                            "O_DIRECT writes bounced through an aligned buffer")

    def mount(self) -> None:
        self._start_daemon([str(self.binary), "-f", "-o", f"source={self.source}", str(self.mnt)])


@dataclass
class Ext4(Target):
    image: Path = Path()
    loop: str = ""

    def setup(self, image_bytes: int) -> None:
        write_image(self.image, image_bytes)
        run(["mkfs.ext4", "-F", "-q", "-E", "lazy_itable_init=0,lazy_journal_init=0", str(self.image)],
            "mkfs.ext4")
        self.loop = run(["losetup", "--find", "--show", "--direct-io=on", str(self.image)],
                        "losetup").stdout.strip()
        self.description = (f"ext4 (mkfs.ext4 defaults) on {self.loop}, a loop device with "
                            f"direct I/O over a {size_text(image_bytes)} image file, written through first")

    def mount(self) -> None:
        run(["mount", "-t", "ext4", self.loop, str(self.mnt)], f"mount {self.loop}")

    def detach(self) -> None:
        if self.loop:
            subprocess.run(["losetup", "-d", self.loop], capture_output=True)
            self.loop = ""


def fuse_version() -> str:
    try:
        return run(["pkg-config", "--modversion", "fuse3"], "pkg-config").stdout.strip()
    except BenchError:
        return "unknown"


# ---------------------------------------------------------------- measurements


@dataclass
class Config:
    rounds: int
    runtime: int
    size: int
    fsync_size: int
    files: int
    per_dir: int
    image_size: int
    targets: list[str]
    steps: list[str]


def fio_common(t: Target, name: str) -> list[str]:
    return ["fio", f"--name={name}", f"--directory={t.mnt}/fio", "--fallocate=none",
            "--output-format=json+", "--eta=never"]


def randrw_args(c: Config) -> list[str]:
    return ["--ioengine=libaio", "--direct=1", "--bs=4k", "--rw=randrw", "--iodepth=64",
            "--numjobs=2", f"--size={c.size}", f"--runtime={c.runtime}", "--time_based",
            "--group_reporting"]


def fsync_args(c: Config) -> list[str]:
    return ["--ioengine=psync", "--direct=0", "--bs=4k", "--rw=randwrite", "--fsync=1",
            "--iodepth=1", "--numjobs=1", f"--size={c.fsync_size}", f"--runtime={c.runtime}",
            "--time_based"]


def prefill_args(size: int, numjobs: int) -> list[str]:
    """Lays out the files a job reads and overwrites, with the job's names."""
    return ["--ioengine=libaio", "--direct=1", "--bs=1M", "--rw=write", "--iodepth=4",
            f"--numjobs={numjobs}", f"--size={size}", "--group_reporting"]


# Where measured fio steps also go as lab results documents (run-v1, the path
# every lab producer writes through: tierlab.fio.to_document, validated), so
# `tierlab report` can compare targets; set by main() from --json.
RUNS_DIR: Path | None = None
_RUN_COUNT: dict[tuple[str, str], int] = {}


def fio(t: Target, name: str, args: list[str], work: Path, record: bool = False) -> dict[str, Any]:
    """Runs one fio job on target t; returns the (group-reported) job of its JSON,
    with the lab parser's histograms under "_hists" (op name -> Histogram)."""
    out = work / f"fio-{t.name}-{name}.json"
    cmd = fio_common(t, name) + args + [f"--output={out}"]
    start = labwl.manifest.iso_now()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    end = labwl.manifest.iso_now()
    errors = [ln for ln in proc.stderr.splitlines() if "error" in ln.lower()]
    if proc.returncode != 0 or errors:
        raise BenchError(f"fio {name} on {t.name} failed (exit {proc.returncode}): "
                         f"{last_line(chr(10).join(errors) or proc.stderr)}{t.died()}")
    try:
        doc = labfio.load_output(out)
        job = doc["jobs"][0]
        parsed = labfio.parse(doc, FIO_OPS)
    except (LabError, KeyError, IndexError, TypeError) as e:
        raise BenchError(f"fio {name} on {t.name}: no usable JSON result in {out} ({e})") from None
    if job.get("error"):
        raise BenchError(f"fio {name} on {t.name}: job error {job['error']}")
    if record and RUNS_DIR is not None:
        n = _RUN_COUNT[(t.name, name)] = _RUN_COUNT.get((t.name, name), 0) + 1
        man_args = argparse.Namespace(arm="other", pair=None, boot=None, fault_profile="none",
                                      device_layout=t.description or None, seed=1,
                                      label=[f"target={t.name}", f"step={name}", f"round={n}"])
        try:
            rd = labfio.to_document(doc, man_args, workload=f"bench-fs-{name}",
                                    directory=str(t.mnt), op_names=FIO_OPS, start=start, end=end,
                                    parameters={"fio_args": args})
            RUNS_DIR.mkdir(parents=True, exist_ok=True)
            labwl.write(rd, RUNS_DIR / f"{t.name}-{name}-r{n}.json")
        except LabError as e:
            raise BenchError(f"fio {name} on {t.name}: results document: {e}") from None
    job["_hists"] = parsed["ops"]
    return job


def step_randrw(t: Target, c: Config, work: Path) -> dict[str, float]:
    job = fio(t, "randrw", randrw_args(c), work, record=True)
    r, w, h = job["read"], job["write"], job["_hists"]
    return {"iops": r["iops"] + w["iops"], "read_iops": r["iops"], "write_iops": w["iops"],
            "read_clat_p50_us": percentile(h, "read", 50), "read_clat_p99_us": percentile(h, "read", 99),
            "write_clat_p50_us": percentile(h, "write", 50), "write_clat_p99_us": percentile(h, "write", 99),
            "ios": float(r["total_ios"] + w["total_ios"])}


def step_fsync(t: Target, c: Config, work: Path) -> dict[str, float]:
    job = fio(t, "fsync", fsync_args(c), work, record=True)
    w, s, h = job["write"], job.get("sync") or {}, job["_hists"]
    if not s.get("total_ios"):
        raise BenchError(f"fio fsync on {t.name}: no fsync latencies in fio's output")
    return {"write_iops": w["iops"], "write_clat_p50_us": percentile(h, "write", 50),
            "write_clat_p99_us": percentile(h, "write", 99),
            "fsync_p50_us": percentile(h, "fsync", 50), "fsync_p99_us": percentile(h, "fsync", 99),
            "fsyncs": float(s["total_ios"])}


def tree_dirs(t: Target, c: Config) -> list[tuple[Path, int]]:
    """The metadata tree: (directory, files in it), --per-dir files each."""
    dirs, left, i = [], c.files, 0
    while left > 0:
        n = min(c.per_dir, left)
        dirs.append((t.mnt / "meta" / f"d{i:04d}", n))
        left, i = left - n, i + 1
    return dirs


def per_file(t: Target, c: Config, op: Callable[[str, int], None], mkdirs: bool = False) -> float:
    """Calls op(name, dir_fd) for every file of the tree; returns files per second."""
    if mkdirs:
        (t.mnt / "meta").mkdir()
    start = time.perf_counter()
    for d, n in tree_dirs(t, c):
        if mkdirs:
            d.mkdir()
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for i in range(n):
                op(f"f{i:06d}", fd)
        finally:
            os.close(fd)
    return c.files / (time.perf_counter() - start)


def os_step(what: str, t: Target, fn: Callable[[], float]) -> float:
    try:
        return fn()
    except OSError as e:
        raise BenchError(f"{what} on {t.name}: {e.filename or ''}: {e.strerror}{t.died()}") from None


def step_create(t: Target, c: Config, work: Path) -> dict[str, float]:
    flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC

    def create(name: str, fd: int) -> None:
        os.close(os.open(name, flags, 0o644, dir_fd=fd))

    return {"files_per_s": os_step("create", t, lambda: per_file(t, c, create, mkdirs=True))}


def step_stat(t: Target, c: Config, work: Path) -> dict[str, float]:
    def stat(name: str, fd: int) -> None:
        os.stat(name, dir_fd=fd, follow_symlinks=False)

    return {"files_per_s": os_step("stat", t, lambda: per_file(t, c, stat))}


def step_unlink(t: Target, c: Config, work: Path) -> dict[str, float]:
    def unlink(name: str, fd: int) -> None:
        os.unlink(name, dir_fd=fd)

    rate = os_step("unlink", t, lambda: per_file(t, c, unlink))
    for d, _ in tree_dirs(t, c):
        d.rmdir()
    (t.mnt / "meta").rmdir()
    return {"files_per_s": rate}


def timed_command(t: Target, cmd: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"})
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise BenchError(f"{' '.join(cmd[:2])} on {t.name} failed: {last_line(proc.stderr)}{t.died()}")
    return seconds, proc.stdout


def step_ls(t: Target, c: Config, work: Path) -> dict[str, float]:
    seconds, out = timed_command(t, ["ls", "-lR", "--color=never", str(t.mnt / "meta")])
    files = sum(1 for ln in out.splitlines() if ln.startswith("-"))
    if files != c.files:
        raise BenchError(f"ls -lR on {t.name} listed {files} files, not {c.files}")
    return {"seconds": seconds}


def step_du(t: Target, c: Config, work: Path) -> dict[str, float]:
    seconds, out = timed_command(t, ["du", "-s", str(t.mnt / "meta")])
    if not out.strip():
        raise BenchError(f"du -s on {t.name} printed nothing")
    return {"seconds": seconds}


STEP_FUNCS: dict[str, Callable[[Target, Config, Path], dict[str, float]]] = {
    "randrw": step_randrw, "fsync": step_fsync, "create": step_create, "stat": step_stat,
    "ls_lR": step_ls, "du_s": step_du, "unlink": step_unlink,
}

# tierfs ctl fields that only grow while a mount lives (the rest are gauges). Arrays
# are flattened by index (journal.preflushes.0: the first member's), devices by
# label (which may hold a dot: devices.ssd.a.io...).
CTL_COUNTER = re.compile(
    r"^(data\.(?!(write_points|blocks_reserved|abandoned_reads|late_writes|repairs_waiting)$)[a-z_]+|journal\.(commits|flush_commits|entries|degraded_entries|ring_write_errors|"
    r"flushes_given_up|rewritten_ordered|flush_entries|unordered_entries|bytes|keys|preflushes\.[0-9]+|"
    r"space_waits|room_waits|reserve_entries|reclaim_calls|caller_entries|flushes_late|"
    r"ring_writes_late|rings_passed_stalling)|"
    r"btree\.(lookups|inserts|deletes|commits|cache_hits|cache_misses|evictions|node_reads|node_writes|"
    r"node_write_bytes|checkpoints|reserved_buckets|returned_buckets|hole_slots|corrupt_reads|merges_given_up)|"
    r"alloc\.(frees|fallbacks|checkpoints)|posix\.(?!(open_inodes|inode_locks_now|buffers_now)$)[a-z_]+|"
    r"devices\.[^.]+(\.(?!fault\.)[^.]+)?\.io\.[^.]+\.(errors|[a-z]+\.(ops|bytes)))$")


def flatten(doc: Any, prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    if isinstance(doc, dict):
        for k, v in doc.items():
            out.update(flatten(v, f"{prefix}{k}."))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            key = v.get("label", str(i)) if isinstance(v, dict) else str(i)
            out.update(flatten(v, f"{prefix}{key}."))
    elif isinstance(doc, (int, float)) and not isinstance(doc, bool):
        out[prefix[:-1]] = doc
    return out


def ctl_delta(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, float] | None:
    """The counters a step moved (tierfs ctl after minus before), zeros left out."""
    if before is None or after is None:
        return None
    b, a = flatten(before), flatten(after)
    return {k: v - b.get(k, 0) for k, v in sorted(a.items())
            if CTL_COUNTER.match(k) and v - b.get(k, 0) != 0}


def measure(step: str, t: Target, c: Config, work: Path, rnd: int) -> dict[str, Any]:
    """One step on one target, with what the machine did meanwhile."""
    if step in REMOUNT_BEFORE:
        t.remount()
    before_ctl = t.ctl()
    busy0, total0 = cpu_times()
    own0, daemon0 = own_cpu(), process_cpu(t.pid) if t.pid else 0.0
    switches0 = process_ctx_switches(t.pid) if t.pid else {}
    start, wall0 = now_iso(), time.monotonic()
    load0 = os.getloadavg()[0]
    metrics = STEP_FUNCS[step](t, c, work)
    wall = time.monotonic() - wall0
    busy1, total1 = cpu_times()
    daemon = (process_cpu(t.pid) - daemon0) if t.pid else 0.0
    switches = ctx_switch_delta(switches0, process_ctx_switches(t.pid)) if t.pid else 0
    ours = own_cpu() - own0 + daemon
    rec: dict[str, Any] = {
        "round": rnd, "step": step, "target": t.name, "start": start, "wall_s": round(wall, 3),
        "metrics": metrics,
        "machine": {"load1_start": load0, "load1_end": os.getloadavg()[0],
                    "cpu_busy_s": round(busy1 - busy0, 2), "cpu_total_s": round(total1 - total0, 2),
                    "cpu_ours_s": round(ours, 2), "cpu_other_s": round(max(0.0, busy1 - busy0 - ours), 2)},
    }
    if t.pid:
        rec["daemon_cpu_s"] = round(daemon, 2)
        rec["daemon_ctx_switches"] = switches
    delta = ctl_delta(before_ctl, t.ctl())
    if delta is not None:
        rec["tierfs_ctl"] = delta
    return rec


# ---------------------------------------------------------------- summary and tables


def summarize(runs: list[dict[str, Any]], targets: list[str]) -> dict[str, Any]:
    """Medians per target and metric over the rounds, the ratios of RATIO_PAIRS
    whose two targets ran (of the medians, and per round), and the issues' goals."""
    values: dict[str, dict[str, list[float]]] = {}
    by_round: dict[tuple[int, str, str], float] = {}
    for r in runs:
        for m, v in r["metrics"].items():
            key = f"{r['step']}.{m}"
            values.setdefault(r["target"], {}).setdefault(key, []).append(v)
            by_round[(r["round"], r["target"], key)] = v
    medians = {t: {k: statistics.median(v) for k, v in sorted(values.get(t, {}).items())} for t in targets}
    ratios: dict[str, dict[str, Any]] = {}
    for num, den in RATIO_PAIRS:
        if num not in targets or den not in targets:
            continue
        per: dict[str, Any] = {}
        for key, mine in medians[num].items():
            theirs = medians[den].get(key)
            if not theirs:
                continue
            rounds = sorted({rnd for (rnd, t, k) in by_round if t == num and k == key})
            per[key] = {"of_medians": mine / theirs,
                        "per_round": [by_round[(n, num, key)] / by_round[(n, den, key)]
                                      for n in rounds if by_round.get((n, den, key))]}
        ratios[f"{num}/{den}"] = per
    goals = []
    for g in GOALS:
        r = ratios.get(g["pair"], {}).get(g["metric"])
        if r is None:
            continue
        ratio = r["of_medians"]
        goals.append({"name": g["name"], "pair": g["pair"], "metric": g["metric"], "bound": g["bound"],
                      "at_least": g["at_least"], "ratio": ratio,
                      "met": ratio >= g["bound"] if g["at_least"] else ratio <= g["bound"]})
    return {"medians": medians, "ratios": ratios, "goals": goals}


# (label, metric, unit) rows of the table; unit decides the formatting.
ROWS = (
    ("randrw IOPS (read+write)", "randrw.iops", "rate"),
    ("randrw read clat p50", "randrw.read_clat_p50_us", "us"),
    ("randrw read clat p99", "randrw.read_clat_p99_us", "us"),
    ("randrw write clat p99", "randrw.write_clat_p99_us", "us"),
    ("fsync job writes/s", "fsync.write_iops", "rate"),
    ("fsync job fsync p50", "fsync.fsync_p50_us", "us"),
    ("fsync job fsync p99", "fsync.fsync_p99_us", "us"),
    ("create files/s", "create.files_per_s", "rate"),
    ("stat files/s", "stat.files_per_s", "rate"),
    ("unlink files/s", "unlink.files_per_s", "rate"),
    ("ls -lR (cold)", "ls_lR.seconds", "s"),
    ("du -s (cold)", "du_s.seconds", "s"),
)


def fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    if unit == "rate":
        return f"{v / 1e6:.2f}M" if v >= 1e6 else f"{v / 1e3:.1f}k" if v >= 1e4 else f"{v:.0f}"
    if unit == "us":
        return f"{v / 1000:.2f} ms" if v >= 1000 else f"{v:.0f} µs"
    return f"{v:.2f} s"


def table(header: list[str], rows: list[list[str]], markdown: bool) -> list[str]:
    if markdown:
        return (["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                + ["| " + " | ".join(r) + " |" for r in rows])
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    return ["  ".join(x.ljust(w) if i == 0 else x.rjust(w) for i, (x, w) in enumerate(zip(r, widths)))
            for r in [header] + rows]


def tables(doc: dict[str, Any], markdown: bool) -> str:
    """The medians with the ratios, the goals, and every round's value."""
    s = doc["summary"]
    targets = list(doc["config"]["targets"])
    pairs = list(s["ratios"])
    rows, per_round = [], []
    for label, key, unit in ROWS:
        if all(key not in s["medians"].get(t, {}) for t in targets):
            continue  # a step this run left out
        row = [label] + [fmt(s["medians"].get(t, {}).get(key), unit) for t in targets]
        for pair in pairs:
            r = s["ratios"][pair].get(key)
            row.append(f"{r['of_medians']:.2f}" if r else "-")
        rows.append(row)
        step, metric = key.split(".")
        cells = [label]
        for t in targets:
            vals = [fmt(r["metrics"][metric], unit)
                    for r in doc["runs"] if r["target"] == t and r["step"] == step and metric in r["metrics"]]
            cells.append(" / ".join(vals) if vals else "-")
        per_round.append(cells)
    rounds = doc["config"]["rounds"]
    out = [f"Medians of {rounds} round{'s' if rounds > 1 else ''}"
           + ("; ratios A/B are A's median over B's:" if pairs else ":"), ""]
    out += table(["metric"] + targets + pairs, rows, markdown)
    if s["goals"]:
        out.append("")
    for g in s["goals"]:
        # Results written before issue 21 name no pair: theirs were all tierfs/passthrough.
        per = s["ratios"][g.get("pair", "tierfs/passthrough")][g["metric"]]["per_round"]
        sign = ">=" if g["at_least"] else "<="
        out.append(f"{'- ' if markdown else ''}{g['name']}: {g['ratio']:.2f} (target {sign} {g['bound']}; "
                   f"per round {', '.join(f'{x:.2f}' for x in per)}): {'met' if g['met'] else 'NOT met'}")
    if rounds > 1:
        out += ["", f"Each round ({' / '.join(str(n) for n in range(1, rounds + 1))}):", ""]
        out += table(["metric"] + targets, per_round, markdown)
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- the run


def check_environment(build: Path, c: Config) -> Path:
    targets = c.targets
    if os.geteuid() != 0:
        raise BenchError("needs root (loop device, mounts, drop_caches)")
    if "passthrough" in targets and any(s in META_STEPS for s in c.steps):
        # passthrough_ll holds an O_PATH descriptor for every inode the kernel has
        # looked up, and the kernel keeps a whole tree's inodes while it has memory.
        raise_fd_limit()
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        need = c.files + -(-c.files // c.per_dir) + 256
        if limit < need:
            raise BenchError(f"passthrough_ll keeps a descriptor open for every inode: --files {c.files} "
                             f"needs a limit of about {need}, and this host allows {limit} (ulimit -Hn); "
                             f"use --files {(limit - 256) * c.per_dir // (c.per_dir + 1) // 1000 * 1000} "
                             "or fewer, or leave passthrough out of --targets")
    need = {"fio": "fio (scripts/install-deps test)", "umount": "mount (util-linux)"}
    if "passthrough" in targets:
        need.update({"cc": "gcc (scripts/install-deps build)", "pkg-config": "pkg-config (scripts/install-deps build)"})
    if "ext4" in targets:
        need.update({"mkfs.ext4": "e2fsprogs (scripts/install-deps bench)", "losetup": "mount (util-linux)",
                     "mount": "mount (util-linux)"})
    for exe, pkg in need.items():
        if shutil.which(exe) is None:
            raise BenchError(f"{exe} not found (Debian package {pkg})")
    if any(t in targets for t in ("passthrough", *TIERFS_TARGETS)) and not os.path.exists("/dev/fuse"):
        raise BenchError("/dev/fuse is missing (modprobe fuse)")
    tierfs = build / "bin" / "tierfs"
    if any(t in TIERFS_TARGETS for t in targets) and not os.access(tierfs, os.X_OK):
        raise BenchError(f"{tierfs} is missing: build tierfs first (make), or pass --build DIR")
    return tierfs


def image_files(target: str) -> int:
    """The --image-size image files a target is made of."""
    if target in TIERFS_TARGETS:
        labels = TIERFS_TARGETS[target][0]
        return 1 if labels is None else len(labels)
    return 1 if target == "ext4" else 0


def data_copies(target: str) -> int:
    return TIERFS_TARGETS.get(target, (None, None))[1] or 1


def fio_bytes(c: Config) -> int:
    """The bytes of fio's files in this run (those of the fio steps it runs)."""
    return (2 * c.size if "randrw" in c.steps else 0) + (c.fsync_size if "fsync" in c.steps else 0)


def check_room(c: Config) -> None:
    """Refuses, up front, a run whose fio files (times their data copies) would fill
    more than ROOM_SHARE of a target's image files."""
    files = fio_bytes(c)
    for t in c.targets:
        room, copies = c.image_size * image_files(t), data_copies(t)
        if room and files * copies > room * ROOM_SHARE:
            least = -(-int(files * copies / ROOM_SHARE / image_files(t)) // (1 << 30))
            raise BenchError(f"--image-size {size_text(c.image_size)} is too small for {t}: fio's files "
                             f"({size_text(files)}{f' x {copies} copies' if copies > 1 else ''}) must stay "
                             f"under {ROOM_SHARE:.0%} of its {size_text(room)} of images; use --image-size "
                             f"{least}G or more, or a smaller --size/--fsync-size")


def machine_info() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = 0
    with contextlib.suppress(OSError, ValueError):
        mem = int(Path("/proc/meminfo").read_text().split()[1]) * 1024
    return {"hostname": socket.gethostname(), "kernel": f"{platform.system()} {platform.release()}",
            "cpus": os.cpu_count() or 0, "cpu_model": model, "memory_bytes": mem,
            "load_start": list(os.getloadavg())}


def tool_versions() -> dict[str, str]:
    def first(cmd: list[str]) -> str:
        try:
            p = subprocess.run(cmd, capture_output=True, text=True)
            return last_line(p.stdout + p.stderr) if p.returncode == 0 else "unknown"
        except FileNotFoundError:
            return "missing"
    return {"fio": first(["fio", "--version"]), "libfuse": fuse_version(),
            "mkfs.ext4": first(["sh", "-c", "mkfs.ext4 -V 2>&1 | head -1"]),
            "cc": first(["sh", "-c", "cc --version | head -1"])}


def git_state() -> tuple[str, bool]:
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                                    capture_output=True, text=True).stdout.strip())
        return head or "unknown", dirty
    except FileNotFoundError:
        return "unknown", False


def validate(doc: dict[str, Any]) -> None:
    try:
        import jsonschema
    except ImportError:
        raise BenchError("python3-jsonschema is missing (scripts/install-deps test)") from None
    errors = sorted(jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text())).iter_errors(doc),
                    key=lambda e: list(e.absolute_path))
    if errors:
        where = "/".join(str(p) for p in errors[0].absolute_path) or "(top)"
        raise BenchError(f"result does not match {SCHEMA.name}: {where}: {errors[0].message}"[:300])


@contextlib.contextmanager
def uninterrupted_exit() -> Iterator[None]:
    """Ignores Ctrl-C and SIGTERM from the moment the block ends (normally or not),
    so the cleanup that follows it runs to the end."""
    try:
        yield
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)


@contextlib.contextmanager
def scratch(parent: Path) -> Iterator[Path]:
    work = Path(tempfile.mkdtemp(prefix="bench-fs.", dir=parent))
    try:
        yield work
    finally:
        still = [ln.split()[4] for ln in Path("/proc/self/mountinfo").read_text().splitlines()
                 if ln.split()[4].startswith(str(work) + "/")]
        if still:
            err(f"left {work} in place: still mounted: {', '.join(still)}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def bench(args: argparse.Namespace) -> dict[str, Any]:
    c = Config(rounds=args.rounds, runtime=args.runtime, size=args.size, fsync_size=args.fsync_size,
               files=args.files, per_dir=args.per_dir, image_size=args.image_size, targets=args.targets,
               steps=args.steps)
    build = Path(args.build).resolve()
    tierfs_bin = check_environment(build, c)
    check_room(c)
    free = shutil.disk_usage(args.dir).free
    need = (c.image_size * sum(image_files(t) for t in c.targets)
            + (fio_bytes(c) if "passthrough" in c.targets else 0))
    if free < need * 1.1:
        raise BenchError(f"{args.dir} has {size_text(free)} free; this run needs about {size_text(need)} "
                         "(every image file is written through)")
    machine = machine_info()
    started = now_iso()
    commit, dirty = git_state()
    runs: list[dict[str, Any]] = []
    prefill: list[dict[str, Any]] = []
    fsck: dict[str, Any] = {}
    with scratch(Path(args.dir)) as work, contextlib.ExitStack() as stack, uninterrupted_exit():
        logs = work / "logs"
        logs.mkdir()
        made: dict[str, Target] = {}
        for name in c.targets:
            mnt = work / "mnt" / name
            mnt.mkdir(parents=True)
            t: Target
            if name in TIERFS_TARGETS:
                t = Tierfs.make(name, mnt, logs, tierfs_bin, work)
                t.setup(c.image_size)
            elif name == "passthrough":
                t = Passthrough(name, mnt, logs, binary=work / "passthrough_ll", source=work / "passthrough-src")
                t.setup(work)
            else:
                e = Ext4(name, mnt, logs, image=work / "ext4.img")
                stack.callback(e.detach)
                e.setup(c.image_size)
                t = e
            stack.callback(t.unmount, True)
            t.mount()
            (mnt / "fio").mkdir()
            made[name] = t
            log(f"{name}: {t.description}")
        for name, t in made.items():
            for job, size, jobs in (("randrw", c.size, 2), ("fsync", c.fsync_size, 1)):
                if job not in c.steps:
                    continue
                w0 = time.monotonic()
                res = fio(t, job, prefill_args(size, jobs), work)
                secs = time.monotonic() - w0
                prefill.append({"target": name, "job": job, "bytes": size * jobs, "wall_s": round(secs, 2),
                                "mb_per_s": round(res["write"]["bw_bytes"] / 1e6, 1)})
                log(f"prefill {job} on {name}: {size_text(size * jobs)} in {secs:.1f} s")
        for rnd in range(1, c.rounds + 1):
            order = c.targets[(rnd - 1) % len(c.targets):] + c.targets[:(rnd - 1) % len(c.targets)]
            for step in c.steps:
                for name in order:
                    rec = measure(step, made[name], c, work, rnd)
                    runs.append(rec)
                    shown = ", ".join(f"{k} {v:.4g}" for k, v in list(rec["metrics"].items())[:3])
                    log(f"round {rnd}/{c.rounds} {step} on {name}: {shown} "
                        f"(load {rec['machine']['load1_end']:.2f})")
        for name, t in made.items():
            if isinstance(t, Tierfs):
                t.unmount()
                fsck[name] = t.fsck()
                if fsck[name]["exit"] != 0:
                    err(f"tierfs fsck of {name} after the run: exit {fsck[name]['exit']}: "
                        f"{fsck[name]['summary']}")
    machine["load_end"] = list(os.getloadavg())
    doc: dict[str, Any] = {
        "benchmark": "fs", "version": 1, "started": started, "finished": now_iso(),
        "git_commit": commit, "git_dirty": dirty, "command": sys.argv,
        "config": {"rounds": c.rounds, "runtime_s": c.runtime, "size_bytes": c.size,
                   "fsync_size_bytes": c.fsync_size, "files": c.files, "per_dir": c.per_dir,
                   "image_bytes": c.image_size, "dir": str(Path(args.dir).resolve()),
                   "build": str(build), "targets": c.targets, "steps": c.steps,
                   "fio": {"randrw": randrw_args(c), "fsync": fsync_args(c),
                           "prefill_randrw": prefill_args(c.size, 2),
                           "prefill_fsync": prefill_args(c.fsync_size, 1),
                           "common": ["--fallocate=none", "--output-format=json+"]},
                   "results_documents": str(RUNS_DIR) if RUNS_DIR else None},
        "machine": machine, "tools": tool_versions(),
        "targets": {n: {"description": t.description} for n, t in made.items()},
        "prefill": prefill, "runs": runs, "summary": summarize(runs, c.targets),
    }
    if fsck:
        doc["tierfs_fsck"] = fsck
    return doc


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="bench-fs", usage="%(prog)s [options]  (or: %(prog)s --report FILE [--markdown])",
                                 description=__doc__.split("\n\n", 2)[2],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=str(REPO / "build"), help="tierfs build directory (default build/)")
    ap.add_argument("--dir", default="/var/tmp", help="backing directory for every target (default /var/tmp)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds (default 3); the table shows medians")
    ap.add_argument("--runtime", type=int, default=30, help="seconds per fio job (default 30)")
    ap.add_argument("--size", type=parse_size, default=parse_size("1G"), help="randrw file per job (default 1G)")
    ap.add_argument("--fsync-size", type=parse_size, default=parse_size("256M"),
                    help="the fsync job's file (default 256M)")
    ap.add_argument("--files", type=int, default=100_000, help="files of the metadata steps (default 100000)")
    ap.add_argument("--per-dir", type=int, default=1000, help="files per directory (default 1000)")
    ap.add_argument("--image-size", type=parse_size, default=parse_size("8G"),
                    help="each image file: tierfs's, each member of tierfs-r1's and tierfs-r2's, ext4's "
                         "(default 8G)")
    ap.add_argument("--targets", default=",".join(DEFAULT_TARGETS),
                    help=f"some of {','.join(TARGETS)} (default {','.join(DEFAULT_TARGETS)})")
    ap.add_argument("--steps", default=",".join(STEPS),
                    help="subset of the steps (default all; the metadata steps need create and unlink)")
    ap.add_argument("--json", help="result file (default /tmp/bench-fs-DATE.json)")
    ap.add_argument("--report", metavar="FILE", help="print the tables of an earlier result and exit")
    ap.add_argument("--markdown", action="store_true", help="with --report: Markdown (docs/benchmarks.md)")
    args = ap.parse_args(argv)
    if args.report is None:
        targets = [t for t in args.targets.split(",") if t]
        bad = [t for t in targets if t not in TARGETS]
        if bad or not targets or len(set(targets)) != len(targets):
            ap.error(f"--targets: choose from {','.join(TARGETS)} (got '{args.targets}')")
        args.targets = targets
        steps = [s for s in args.steps.split(",") if s]
        if not steps or any(s not in STEPS for s in steps) or len(set(steps)) != len(steps):
            ap.error(f"--steps: choose from {','.join(STEPS)} (got '{args.steps}')")
        if any(s in META_STEPS for s in steps) and not {"create", "unlink"} <= set(steps):
            ap.error("--steps: the metadata steps need create (it makes the tree) and unlink (it removes it)")
        args.steps = [s for s in STEPS if s in steps]
        for opt in ("rounds", "runtime", "files", "per_dir"):
            if getattr(args, opt) < 1:
                ap.error(f"--{opt.replace('_', '-')} must be at least 1")
        if not os.path.isdir(args.dir):
            ap.error(f"--dir {args.dir} is not a directory")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.report:
        try:
            doc = json.loads(Path(args.report).read_text())
            print(tables(doc, args.markdown), end="")
        except (OSError, ValueError, KeyError, TypeError) as e:
            err(f"{args.report}: not a bench-fs result ({type(e).__name__}: {e})"[:300])
            return 1
        return 0
    out = Path(args.json or f"/tmp/bench-fs-{datetime.now().strftime('%Y%m%d-%H%M%S')}.json")
    global RUNS_DIR
    RUNS_DIR = out.with_suffix(".runs")

    def stop(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)
    try:
        doc = bench(args)
        validate(doc)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=1) + "\n")
    except BenchError as e:
        err(str(e))
        return 1
    except KeyboardInterrupt:
        err("interrupted; mounts, loop device and scratch files removed")
        return 130
    print(tables(doc, markdown=False), end="")
    print(f"JSON: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
