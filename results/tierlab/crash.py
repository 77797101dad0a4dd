"""`tierlab crash`: the crash-consistency harness -- seeded power cuts of a mounted
tierfs, each followed by recovery and a check of everything that was durable.

    tierlab crash [--cuts N] [--seed S] [--jobs J] [--cuts-per-image C] [--ops K]
                  [--metadata-replicas R] [--out FILE.json] [--keep DIR] [--build BUILD_DIR]

Each job formats a two-member filesystem (ssd.a: metadata and new data, hdd.b:
background target) -- with --metadata-replicas 2, a three-member one whose
second SSD ssd.c holds a copy of every journal entry and btree node -- and mounts it (`tierfs mount -f`, a child we own) over fault
devices with 64 MiB volatile write caches on one power supply
(`--fault-shared-power`): a cut of one is a cut of both, and each unflushed write
is kept, dropped or torn (sector by sector) from the cut's seed. A cycle:

  1. mount the image the last cut left (replaying its journal), armed with this
     cycle's cut (below);
  2. verify: the tree must be exactly one of the states the model allows -- the
     state at the last acknowledged fsync or any later one (every file's bytes,
     every name, every directory) -- with no read error;
  3. run K seeded operations (create+write, overwrite, extend, fsync, fdatasync,
     directory fsync, rename over a file, rename, unlink, truncate, fallocate,
     punch hole, mkdir, rmdir), one at a time, recording the state after each
     atomic step, until the cut makes one fail;
  4. if the cut has not come, cut by command after a random pause (the journal's
     1 s write-out may or may not have run); kill -9 the daemon;
  5. `tierfs fsck -n` of the cut image must exit 0.

Cuts, by the cache trigger armed on ssd.a (or, with two copies, ssd.c; or hdd.b): after the Nth write (any,
btree nodes only -- in the middle of a checkpoint, the alloc btree's leaves
among them --, or hdd.b's writes), at the Nth flush (mid-flush), or idle (the
command).
A cut while the mount replays fails the mount (mount_failed_by_cut), one while
it verifies is cut_during_recovery; the next mount verifies again. After the image's last cycle the filesystem
is unmounted cleanly, verified and checked once more, and the next image is
formatted. A failed check keeps both images (and the daemon's log) under --keep.

Every check failure is named with the file, the block and what the block holds
(blocks carry their file, number and version). The summary (stdout, and --out)
counts cuts by kind and outcome, fsynced bytes verified and lost; the exit status
is 0 when no check failed, 1 otherwise, 2 for bad arguments. docs/lab/crash.md."""

from __future__ import annotations

import argparse
import errno
import fcntl
import functools
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tierlab import LabError

BLOCK = 4096
MAX_BLOCKS = 128          # files stay within 512 KiB: one write-buffer run, one extent
MAX_FILES = 28
DIRS = ("d0", "d1", "d2")
FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE = 0x01, 0x02
SSD_MIB, HDD_MIB = 64, 128
MOUNT_TIMEOUT = 30.0
OP_TIMEOUT = 60.0          # one operation; past it the cycle is a hang (a failure)


# --- the model --------------------------------------------------------------------

def block_bytes(ident: int, blk: int, version: int) -> bytes:
    """A self-describing block: (file, block, version) repeated, so a wrong block
    found on recovery names what it is."""
    unit = struct.pack("<4sIII", b"TFSC", ident, blk, version)
    return (unit * (BLOCK // len(unit)))[:BLOCK]


def describe_block(data: bytes) -> str:
    if len(data) >= 16 and data[:4] == b"TFSC":
        ident, blk, version = struct.unpack("<III", data[4:16])
        return f"file {ident} block {blk} version {version}"
    if data.count(0) == len(data):
        return "zeros"
    return "bytes that no write wrote: " + data[:16].hex()


@functools.lru_cache(maxsize=65536)
def block_content(ident: int, blk: int, version: int, valid: int) -> bytes:
    """The block as the model has it: `valid` bytes of the version, then zeros (a
    shrinking truncate that ended inside the block)."""
    data = block_bytes(ident, blk, version)
    return data if valid == BLOCK else data[:valid] + bytes(BLOCK - valid)


@dataclass
class File:
    ident: int
    size: int = 0
    blocks: dict[int, tuple[int, int]] = field(default_factory=dict)   # block -> (version, valid bytes)

    def copy(self) -> "File":
        return File(self.ident, self.size, dict(self.blocks))

    def block(self, blk: int) -> bytes:
        """Block `blk` of the file's content, cut at its size."""
        end = min(self.size - blk * BLOCK, BLOCK)
        v = self.blocks.get(blk)
        data = block_content(self.ident, blk, *v) if v else bytes(BLOCK)
        return data[:end]

    def holds(self, data: bytes) -> bool:
        """Whether `data` is exactly this file's content."""
        return len(data) == self.size and all(data[off:off + BLOCK] == self.block(off // BLOCK)
                                              for off in range(0, self.size, BLOCK))

    def truncate(self, size: int) -> None:
        if size < self.size:
            # Bytes past the new end are gone: a later extension reads zeros.
            for b in [b for b in self.blocks if b * BLOCK >= size]:
                del self.blocks[b]
            last = size // BLOCK
            if size % BLOCK and last in self.blocks:
                ver, valid = self.blocks[last]
                self.blocks[last] = (ver, min(valid, size % BLOCK))
        self.size = size


@dataclass
class State:
    files: dict[str, File]
    dirs: set[str]

    def copy(self) -> "State":
        return State({k: f.copy() for k, f in self.files.items()}, set(self.dirs))

    def matches(self, found: dict[str, tuple[str, bytes]]) -> bool:
        if len(found) != len(self.files) + len(self.dirs):
            return False
        for name, (kind, data) in found.items():
            if kind == "dir":
                if name not in self.dirs:
                    return False
                continue
            f = self.files.get(name)
            if f is None or not f.holds(data):
                return False
        return True

    def bytes(self) -> int:
        return sum(f.size for f in self.files.values())


# --- one job ----------------------------------------------------------------------

@dataclass
class Cut:
    kind: str
    member: str
    sets: list[str]
    seed: int

    def label(self) -> str:
        return self.kind


def plan_cut(rng: random.Random, data_on_hdd: bool, ssds: tuple[str, ...] = ("ssd.a",)) -> Cut:
    """This cycle's cut. The ranges fit what a cycle of 120 operations does here:
    ~150-200 writes and 20-30 flushes to ssd.a, 4-8 btree node writes; the
    counts start at the mount (its replay's writes count). (Until format
    version 3 a kind "alloc" cut allocation-table writes; allocation state is
    the alloc btree's now, its writes btree writes.) With two metadata copies
    the SSD kinds arm either SSD: every journal entry and node goes to both."""
    kinds = ["writes", "flush", "checkpoint", "hdd", "idle"]
    weights = [30, 20, 28, 10 if data_on_hdd else 0, 12]
    kind = rng.choices(kinds, weights=weights)[0]
    seed = rng.randrange(1 << 40)
    ssd = ssds[0] if len(ssds) == 1 else rng.choice(ssds)
    if kind == "writes":
        return Cut(kind, ssd, [f"cache.powercut_after_writes={rng.randint(1, 180)}"], seed)
    if kind == "flush":
        return Cut(kind, ssd, [f"cache.powercut_at_flush={rng.randint(1, 25)}"], seed)
    if kind == "checkpoint":
        return Cut(kind, ssd, ["cache.powercut_origin=\"btree\"",
                                   f"cache.powercut_after_writes={rng.randint(1, 6)}"], seed)
    if kind == "hdd":
        return Cut(kind, "hdd.b", [f"cache.powercut_after_writes={rng.randint(1, 120)}"], seed)
    return Cut(kind, "", [], seed)


class CheckFailed(Exception):
    pass


class Job:
    def __init__(self, build: Path, work: Path, seed: int, cuts: int, per_image: int, ops: int,
                 keep: Path | None, log: Callable[[str], None], lying_disk: bool = False,
                 metadata_replicas: int = 1) -> None:
        self.lying_disk = lying_disk
        self.metadata_replicas = metadata_replicas
        self.tierfs = build / "bin" / "tierfs"
        self.work, self.seed, self.cuts, self.per_image, self.ops = work, seed, cuts, per_image, ops
        self.keep, self.log = keep, log
        self.rng = random.Random(seed)
        self.a, self.b, self.mnt = work / "ssd.img", work / "hdd.img", work / "mnt"
        # The members in mount order: label, image, size. ssd.c (two metadata
        # copies) is named for its place after hdd.b in the command line.
        self.members: list[tuple[str, Path, int]] = [("ssd.a", self.a, SSD_MIB), ("hdd.b", self.b, HDD_MIB)]
        if metadata_replicas == 2:
            self.members.append(("ssd.c", work / "ssd2.img", SSD_MIB))
        self.ssds = tuple(label for label, _, _ in self.members if label.startswith("ssd."))
        self.mnt.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen[str] | None = None
        self.mount_error = ""
        self.desc = ""
        self.oplog: list[str] = []  # operations since the last verified state ("STATE: what")
        self.sync_at: int | None = None
        self.sync_state: State | None = None
        self.stats: dict[str, Any] = {
            "cuts": 0, "by_kind": {}, "cut_during_recovery": 0, "mount_failed_by_cut": 0,
            "triggered": 0, "commanded": 0, "ops": 0, "syncs": 0, "images": 0,
            "fsynced_bytes_verified": 0, "lost_fsynced_bytes": 0, "failures": [],
            "kept": 0, "dropped": 0, "torn": 0, "states_after_sync_survived": 0, "daemon_exited": 0,
        }
        self.next_ident = 1

    # --- processes ---

    def run(self, *args: str | Path, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([str(self.tierfs), *map(str, args)], capture_output=True, text=True, timeout=300)
        if check and proc.returncode != 0:
            raise CheckFailed(f"tierfs {args[0]} exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()}")
        return proc

    def format(self, data_on_hdd: bool) -> None:
        for p in (self.work / "daemon.log", self.work / "daemon.err"):
            p.unlink(missing_ok=True)
        labelled: list[str | Path] = []
        for label, p, mib in self.members:
            with open(p, "wb") as f:
                f.truncate(mib << 20)
            labelled += ["--label", label, p]
        self.run("format", "--force", *labelled,
                 "--foreground-target", "hdd" if data_on_hdd else "ssd", "--metadata-target", "ssd",
                 "--background-target", "hdd", "--metadata-replicas", str(self.metadata_replicas),
                 "--bucket-size", "256K", "--journal-buckets", "4")

    def mount(self, cut: Cut | None) -> bool:
        """True once mounted; False if the daemon exited (after printing why)."""
        args = [str(self.tierfs), "mount", "-f", *(str(p) for _, p, _ in self.members), str(self.mnt),
                "-o", f"log={self.work / 'daemon.log'}"]
        if cut is not None:
            args.append("--fault-shared-power")
            for i, (label, _, _) in enumerate(self.members):
                args += ["--fault", f"{label}=powercut", "--fault-set", f"{label}:seed={cut.seed + i}"]
                if self.lying_disk:
                    args += ["--fault-set", f"{label}:cache.ignore_flushes=true"]
            for s in cut.sets:
                args += ["--fault-set", f"{cut.member}:{s}"]
        # stderr to a file: a pipe nobody reads would stop a chatty daemon.
        with open(self.work / "daemon.err", "w") as err:
            self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=err, text=True)
        end = time.monotonic() + MOUNT_TIMEOUT
        while not os.path.ismount(self.mnt):
            if self.proc.poll() is not None:
                self.mount_error = self.daemon_err()
                self.proc = None
                return False
            if time.monotonic() > end:
                self.kill()
                raise CheckFailed(f"mount did not come up in {MOUNT_TIMEOUT:.0f} s")
            time.sleep(0.01)
        return True

    def ctl(self, *words: str) -> subprocess.CompletedProcess[str]:
        return self.run("ctl", self.mnt, *words, check=False)

    def fault_stats(self) -> dict[str, Any] | None:
        proc = self.ctl()
        if proc.returncode != 0:
            return None
        try:
            doc = json.loads(proc.stdout)
        except ValueError:
            return None
        return {d["label"]: d.get("fault") for d in doc.get("devices", []) if isinstance(d, dict)}

    def powered(self) -> dict[str, bool]:
        s = self.fault_stats() or {}
        return {k: bool(v and v.get("powered")) for k, v in s.items()}

    def wait_unpowered(self) -> dict[str, Any]:
        end = time.monotonic() + 20
        while True:
            s = self.fault_stats()
            if s is not None and all(v is not None and not v.get("powered") for v in s.values()):
                return s
            if time.monotonic() > end:
                raise CheckFailed(f"the cut did not reach every member: {s}")
            time.sleep(0.02)

    def kill(self) -> None:
        """kill -9 the daemon (if any), detach the mount, wait for the locks."""
        if self.proc is not None:
            died = self.proc.poll()
            if died is not None and died < 0 and died != -signal.SIGKILL:
                self.proc = None
                raise CheckFailed(f"the daemon died of signal {-died}: {self.daemon_err()[-400:]}")
            if died is not None:
                self.stats["daemon_exited"] += 1
            self.proc.kill()
            self.proc.wait(timeout=30)
            self.proc = None
        if os.path.ismount(self.mnt) or self._stale_mount():
            subprocess.run(["umount", "-l", str(self.mnt)], capture_output=True)
        end = time.monotonic() + 30
        for _, dev, _ in self.members:
            with open(dev, "rb") as f:
                while True:
                    try:
                        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        fcntl.flock(f, fcntl.LOCK_UN)
                        break
                    except BlockingIOError:
                        if time.monotonic() > end:
                            raise CheckFailed(f"{dev} is still locked 30 s after kill -9")
                        time.sleep(0.02)

    def _stale_mount(self) -> bool:
        try:
            os.stat(self.mnt)
            return False
        except OSError as e:
            return e.errno == errno.ENOTCONN

    def unmount(self) -> None:
        proc = subprocess.run(["fusermount3", "-u", str(self.mnt)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise CheckFailed(f"unmount: {proc.stderr.strip()}")
        assert self.proc is not None
        rc = self.proc.wait(timeout=120)
        self.proc = None
        if rc != 0:
            raise CheckFailed(f"the daemon exited {rc} at unmount: {self.daemon_err()[-400:]}")

    def daemon_err(self) -> str:
        try:
            return (self.work / "daemon.err").read_text(errors="replace").strip()
        except OSError:
            return ""

    def fsck(self, when: str) -> None:
        proc = self.run("fsck", "-n", *(p for _, p, _ in self.members), check=False)
        if proc.returncode == 0:
            return
        out = (proc.stdout + proc.stderr).strip()
        raise CheckFailed(f"fsck -n {when} exited {proc.returncode}: {out[-1500:]}")

    # --- verification ---

    def read_tree(self) -> dict[str, tuple[str, bytes]]:
        """Every directory and file under the mount; OSError propagates."""
        out: dict[str, tuple[str, bytes]] = {}
        for root, dirs, files in os.walk(self.mnt, onerror=_raise):
            rel = os.path.relpath(root, self.mnt)
            for d in dirs:
                out[os.path.normpath(os.path.join(rel, d))] = ("dir", b"")
            for f in files:
                name = os.path.normpath(os.path.join(rel, f))
                with open(os.path.join(root, f), "rb") as fh:
                    out[name] = ("file", fh.read())
        out.pop("lost+found", None)
        return out

    def match(self, window: list[State], found: dict[str, tuple[str, bytes]]) -> int | None:
        """The newest state of the window that recovery shows, or None."""
        for i in range(len(window) - 1, -1, -1):
            if window[i].matches(found):
                return i
        return None

    def explain(self, state: State, found: dict[str, tuple[str, bytes]]) -> tuple[str, int]:
        """What differs between the durable state and what recovery shows, and the
        fsynced bytes missing or wrong."""
        lost = 0
        lines = []
        for d in sorted(state.dirs - {n for n, (k, _) in found.items() if k == "dir"}):
            lines.append(f"{d}/: directory missing")
        for name, (kind, data) in sorted(found.items()):
            if kind == "dir" and name not in state.dirs:
                lines.append(f"{name}/: a directory not in the fsynced state")
            elif kind == "file" and name not in state.files:
                lines.append(f"{name}: a file not in the fsynced state ({len(data)} bytes)")
        for name, f in sorted(state.files.items()):
            if name not in found or found[name][0] != "file":
                lost += f.size
                lines.append(f"{name}: missing (file {f.ident}, {f.size} bytes fsynced)")
                continue
            data = found[name][1]
            bad = [off for off in range(0, max(f.size, len(data)), BLOCK)
                   if off >= f.size or data[off:off + BLOCK] != f.block(off // BLOCK)]
            if not bad and len(data) == f.size:
                continue
            lost += sum(min(BLOCK, f.size - off) for off in bad if off < f.size)
            first = bad[0] if bad else f.size
            lines.append(f"{name}: size {len(data)} (fsynced {f.size}), {len(bad)} blocks differ; block "
                         f"{first // BLOCK} holds {describe_block(data[first:first + BLOCK])}, fsynced "
                         f"{describe_block(f.block(first // BLOCK)) if first < f.size else 'nothing'}")
        more = f"; ... {len(lines) - 6} more" if len(lines) > 6 else ""
        return "; ".join(lines[:6]) + more, lost

    def mismatch(self, when: str, window: list[State], fsynced: State,
                 found: dict[str, tuple[str, bytes]]) -> CheckFailed:
        """The failure: against the allowed state closest to what recovery shows
        (and the fsynced bytes lost, against the fsynced state)."""
        scored = []
        for i, st in enumerate(window):
            why, diff = self.explain(st, found)
            scored.append((diff, why.count(";"), i, why))
        diff, _, i, why = min(scored)
        # Lost: what even the closest allowed state has and recovery does not.
        lost = diff
        self.stats["lost_fsynced_bytes"] += lost
        # Files whose recovered content no allowed state has at all.
        alien = sorted(name for name, (kind, data) in found.items() if kind == "file"
                       and not any(name in st.files and st.files[name].holds(data) for st in window))
        if self.keep is not None and alien:
            mentions = [line for line in self.oplog if any(a in line for a in alien[:2])]
            (self.work / "oplog.txt").write_text("\n".join(self.oplog) + "\n")
            self.log(f"operations on {', '.join(alien[:2])} since the last verified state: {mentions[-20:]}")
        return CheckFailed(f"{when}, recovery shows none of the {len(window)} states the model allows "
                           f"(state 0: the last fsync); closest, state {i}: {why}; files in no allowed state: "
                           f"{', '.join(alien[:8]) or 'none'}; bytes lost against it: {lost}")

    # --- the workload ---

    def new_ident(self) -> int:
        self.next_ident += 1
        return self.next_ident

    def ops_for(self, rng: random.Random, model: State, record: Callable[[State], None],
                is_sync: Callable[[], None]) -> Callable[[], None]:
        """One seeded operation: applies itself to the mount and, step by atomic
        step, to `model` (calling record() after each step)."""
        m = self.mnt
        names = sorted(model.files)
        dirs = sorted(model.dirs)
        ops = ["create", "write", "extend", "fsync", "fdatasync", "dirsync", "replace", "rename", "unlink",
               "truncate", "fallocate", "punch", "mkdir", "rmdir"]
        weights = [14, 30, 8, 4, 2, 2, 5, 4, 6, 5, 4, 3, 2, 1]
        if len(names) >= MAX_FILES:
            weights[0] = 0
        if not names:
            weights = [1 if o in ("create", "mkdir") else 0 for o in ops]
        op = rng.choices(ops, weights=weights)[0]
        self.desc = op
        pick = (lambda: rng.choice(names)) if names else (lambda: "")
        parent = lambda: rng.choice(dirs + [""])  # noqa: E731

        def newname() -> str:
            while True:
                n = os.path.join(parent(), f"f{rng.randrange(1000)}")
                if n not in model.files and n not in model.dirs:
                    return n

        def write(f: File, name: str, blk: int, n: int) -> Callable[[], None]:
            vers = {b: rng.randrange(1, 1 << 30) for b in range(blk, blk + n)}
            data = b"".join(block_bytes(f.ident, b, vers[b]) for b in range(blk, blk + n))

            def go() -> None:
                fd = os.open(m / name, os.O_WRONLY)
                try:
                    os.pwrite(fd, data, blk * BLOCK)
                finally:
                    os.close(fd)  # the write-out: its error is close's
                f.blocks.update({b: (v, BLOCK) for b, v in vers.items()})
                f.size = max(f.size, (blk + n) * BLOCK)
                record(model)
            return go

        def created(name: str, f: File, w: Callable[[], None]) -> None:
            """Two atomic steps: the empty file, then its first data."""
            os.close(os.open(m / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            model.files[name] = f
            record(model)
            w()

        if op == "create":
            name = newname()
            f = File(self.new_ident())
            n = rng.randint(1, 32) if rng.random() < 0.8 else rng.randint(33, MAX_BLOCKS)
            w = write(f, name, 0, n)
            self.desc = f"create {name} (file {f.ident}) blocks 0+{n}"

            return lambda: created(name, f, w)
        if op in ("write", "extend"):
            name = pick()
            f = model.files[name]
            cur = (f.size + BLOCK - 1) // BLOCK
            if op == "extend" or cur == 0:
                blk = min(cur, MAX_BLOCKS - 1)
            else:
                blk = rng.randrange(0, min(cur, MAX_BLOCKS))
            n = rng.randint(1, min(32, MAX_BLOCKS - blk))
            self.desc = f"{op} {name} (file {f.ident}) blocks {blk}+{n}"
            return write(f, name, blk, n)
        if op in ("fsync", "fdatasync"):
            name = pick()
            self.desc = f"{op} {name}"

            def sync() -> None:
                fd = os.open(m / name, os.O_RDONLY)
                try:
                    (os.fsync if op == "fsync" else os.fdatasync)(fd)
                finally:
                    os.close(fd)
                is_sync()
            return sync
        if op == "dirsync":
            d = parent()

            def dsync() -> None:
                fd = os.open(m / d if d else m, os.O_RDONLY | os.O_DIRECTORY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
                is_sync()
            return dsync
        if op == "replace":
            # The atomic-replace idiom: write a temporary, fsync it, rename it over.
            target = pick() if rng.random() < 0.8 else newname()
            tmp = newname()
            f = File(self.new_ident())
            n = rng.randint(1, 24)
            w = write(f, tmp, 0, n)
            self.desc = f"replace {target} by {tmp} (file {f.ident}) blocks 0+{n}, fsynced"

            def replace() -> None:
                created(tmp, f, w)
                fd = os.open(m / tmp, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
                is_sync()
                os.rename(m / tmp, m / target)
                model.files[target] = model.files.pop(tmp)
                record(model)
            return replace
        if op == "rename":
            src, dst = pick(), newname()
            self.desc = f"rename {src} {dst}"

            def rename() -> None:
                os.rename(m / src, m / dst)
                model.files[dst] = model.files.pop(src)
                record(model)
            return rename
        if op == "unlink":
            name = pick()
            self.desc = f"unlink {name}"

            def unlink() -> None:
                os.unlink(m / name)
                del model.files[name]
                record(model)
            return unlink
        if op == "truncate":
            name = pick()
            f = model.files[name]
            size = rng.randrange(0, MAX_BLOCKS * BLOCK)
            self.desc = f"truncate {name} (file {f.ident}) to {size}"

            def trunc() -> None:
                os.truncate(m / name, size)
                f.truncate(size)
                record(model)
            return trunc
        if op in ("fallocate", "punch"):
            name = pick()
            f = model.files[name]
            blk = rng.randrange(0, MAX_BLOCKS - 8)
            n = rng.randint(1, 8)
            keep = op == "punch" or rng.random() < 0.5
            mode = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE if op == "punch" else (FALLOC_FL_KEEP_SIZE if keep else 0)
            self.desc = f"{op} {name} (file {f.ident}) blocks {blk}+{n} mode {mode:#x}"

            def falloc() -> None:
                fd = os.open(m / name, os.O_WRONLY)
                try:
                    _fallocate(fd, mode, blk * BLOCK, n * BLOCK)
                finally:
                    os.close(fd)
                if op == "punch":
                    for b in range(blk, blk + n):
                        f.blocks.pop(b, None)
                elif not keep:
                    f.size = max(f.size, (blk + n) * BLOCK)
                record(model)
            return falloc
        if op == "mkdir":
            d = rng.choice(DIRS)
            if d in model.dirs or d in model.files:
                return lambda: None

            def mkdir() -> None:
                os.mkdir(m / d)
                model.dirs.add(d)
                record(model)
            return mkdir
        # rmdir: only an empty directory
        empty = [d for d in dirs if not any(n.startswith(d + "/") for n in names)]
        if not empty:
            return lambda: None
        d = rng.choice(empty)

        def rmdir() -> None:
            os.rmdir(m / d)
            model.dirs.discard(d)
            record(model)
        return rmdir

    # --- cycles ---

    def keep_failure(self, what: str) -> None:
        self.stats["failures"].append(what)
        self.log(f"FAIL: {what}")
        if self.keep is not None:
            dst = self.keep / f"seed{self.seed}-cut{self.stats['cuts']}"
            dst.mkdir(parents=True, exist_ok=True)
            images = [p for _, p, _ in self.members]
            for p in (*images, self.work / "daemon.log", self.work / "daemon.err", self.work / "oplog.txt",
                      *(self.work / f"cut-{p.name}" for p in images)):
                if p.exists():
                    shutil.copy(p, dst / p.name)
            self.log(f"kept the images in {dst}")

    def run_all(self) -> dict[str, Any]:
        done = 0
        try:
            while done < self.cuts:
                n = min(self.per_image, self.cuts - done)
                try:
                    self.image(n)
                except CheckFailed as e:
                    self.keep_failure(str(e))
                    try:
                        self.kill()
                    except CheckFailed:
                        pass
                done += n
        finally:
            if self.proc is not None:
                try:
                    self.kill()
                except CheckFailed:
                    pass
        return self.stats

    def image(self, cuts: int) -> None:
        # Every other image writes file data to hdd.b (the journal and btree stay
        # on ssd.a): a commit there needs the other member's data flushed first.
        data_on_hdd = self.stats["images"] % 2 == 1
        self.format(data_on_hdd)
        self.stats["images"] += 1
        state = State({}, set())
        window = [state]          # states recovery may show: the last durable one and those after it
        fsynced = state
        for _ in range(cuts):
            cut = plan_cut(self.rng, data_on_hdd, self.ssds)
            ops_seed = self.rng.randrange(1 << 40)
            self.stats["cuts"] += 1
            self.stats["by_kind"][cut.kind] = self.stats["by_kind"].get(cut.kind, 0) + 1
            if self.keep is not None:  # the image as the cut left it, before the mount replays it
                for _, p, _ in self.members:
                    shutil.copy(p, self.work / f"cut-{p.name}")
            if not self.mount(cut):
                # The cut came while the mount replayed: it must say so, and the
                # next mount recovers (the window stays).
                if "input/output error" not in self.mount_error.lower() and "i/o error" not in self.mount_error.lower():
                    raise CheckFailed(f"the mount failed, not by the cut: {self.mount_error[-400:]}")
                self.stats["mount_failed_by_cut"] += 1
                self.kill()
                self.fsck(f"after a cut during mount ({cut.kind})")
                continue
            try:
                found = self.read_tree()
            except OSError as e:
                if all(self.powered().values()):
                    raise CheckFailed(f"reading the recovered tree: {e} (no cut yet)")
                found = None
            if found is None:
                self.stats["cut_during_recovery"] += 1
                self.finish_cut(cut, triggered=True)
                continue
            i = self.match(window, found)
            if i is None:
                raise self.mismatch(f"after a {cut.kind} cut", window, fsynced, found)
            self.stats["fsynced_bytes_verified"] += fsynced.bytes()
            if i > 0:
                self.stats["states_after_sync_survived"] += 1
            state = window[i].copy()
            window, fsynced = [state.copy()], state.copy()
            self.oplog = []
            failed = self.workload(ops_seed, state, window)
            if failed is None:
                self.stats["commanded"] += 1
                # Half at once, half after a pause the journal's 1 s write-out may end.
                time.sleep(0 if self.rng.random() < 0.5 else self.rng.random() * 1.5)
                self.ctl("fault", "ssd.a", "powercut", str(cut.seed))
            else:
                self.stats["triggered"] += 1
            self.finish_cut(cut, triggered=failed is not None)
            if self.sync_at is not None:
                fsynced = self.sync_state
                window = window[self.sync_at:]
        # The image's end: a clean mount, verify, unmount, fsck.
        if not self.mount(None):
            raise CheckFailed(f"the final mount failed: {self.mount_error[-400:]}")
        found = self.read_tree()
        if self.match(window, found) is None:
            raise self.mismatch("at the image's end", window, fsynced, found)
        self.unmount()
        self.fsck("after a clean unmount")

    def finish_cut(self, cut: Cut, triggered: bool) -> None:
        s = self.wait_unpowered() if self.proc is not None and self.proc.poll() is None else {}
        if os.environ.get("TIERLAB_CRASH_DEBUG"):
            self.log(f"cut {cut.kind} {cut.sets} triggered={triggered}: " + json.dumps({k: (v or {}).get("io") for k, v in s.items()}))
        for v in s.values():
            if v:
                inj = v.get("injected", {})
                for k in ("kept", "dropped", "torn"):
                    self.stats[k] += int(inj.get(f"cut_{k}", 0))
        self.kill()
        self.fsck(f"after a {cut.kind} cut")

    def workload(self, seed: int, state: State, window: list[State]) -> str | None:
        """Runs up to self.ops operations; returns the first error (the cut's, or a
        failure) or None. Sets sync_at/sync_state: the window index of the last
        acknowledged sync."""
        rng = random.Random(seed)
        self.sync_at, self.sync_state = None, None

        def record(s: State) -> None:
            window.append(s.copy())

        def synced() -> None:
            self.oplog.append(f"{len(window) - 1}: (synced)")
            self.sync_at, self.sync_state = len(window) - 1, window[-1].copy()
            self.stats["syncs"] += 1

        result: list[str | None] = [None]

        def body() -> None:
            for _ in range(self.ops):
                op = self.ops_for(rng, state, record, synced)
                self.oplog.append(f"{len(window) - 1}: {self.desc}")
                try:
                    op()
                except OSError as e:
                    result[0] = f"{os.strerror(e.errno or 0)} ({e})"
                    return
                self.stats["ops"] += 1

        t = threading.Thread(target=body, daemon=True)
        t.start()
        t.join(OP_TIMEOUT * 4)
        if t.is_alive():
            raise CheckFailed("an operation hung (over 240 s for the workload)")
        err = result[0]
        if err is not None:
            powered = self.powered()
            if powered and all(powered.values()):
                raise CheckFailed(f"an operation failed with every member powered: {err}")
        return err


def _raise(e: OSError) -> None:
    raise e


def _fallocate(fd: int, mode: int, off: int, length: int) -> None:
    import ctypes
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    if libc.fallocate(fd, mode, off, length) < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


# --- the command --------------------------------------------------------------------

def register(sub: Any) -> None:
    p = sub.add_parser("crash", help="seeded power cuts of a mounted tierfs, each checked after recovery",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cuts", type=int, default=100, help="power cuts in all (default 100)")
    p.add_argument("--seed", type=int, default=1, help="base seed (job j uses S+j; default 1)")
    p.add_argument("--jobs", type=int, default=1, help="filesystems cut in parallel (default 1)")
    p.add_argument("--cuts-per-image", type=int, default=25, help="cuts before a fresh format (default 25)")
    p.add_argument("--ops", type=int, default=120, help="operations per cycle at most (default 120)")
    p.add_argument("--out", metavar="FILE.json", help="write the summary here too")
    p.add_argument("--keep", metavar="DIR", help="copy the images of a failed check here")
    p.add_argument("--build", metavar="BUILD_DIR", help="the build to test (default: this tierlab's)")
    p.add_argument("--metadata-replicas", type=int, default=1, choices=(1, 2),
                   help="1: ssd.a and hdd.b; 2: a second SSD, ssd.c, holds a copy of every journal entry "
                        "and btree node (default 1)")
    p.add_argument("--dir", default="/dev/shm", help="directory for the member images (default /dev/shm)")
    p.add_argument("--lying-disk", action="store_true",
                   help="the harness's own test: members acknowledge flushes without making anything durable "
                        "(faultdev cache.ignore_flushes); the checks must fail")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    for k in ("cuts", "jobs", "cuts_per_image", "ops"):
        if getattr(args, k) < 1:
            raise LabError(f"--{k.replace('_', '-')} must be at least 1")
    from tierlab.pair import default_build
    build = Path(args.build) if args.build else default_build()
    if not (build / "bin" / "tierfs").exists():
        raise LabError(f"{build}/bin/tierfs is missing: build first, or give --build")
    if not os.path.exists("/dev/fuse") or os.geteuid() != 0:
        raise LabError("needs root and /dev/fuse")
    summary = crash_run(build, args.cuts, args.seed, args.jobs, args.cuts_per_image, args.ops,
                        Path(args.keep) if args.keep else None, Path(args.dir), lying_disk=args.lying_disk,
                        metadata_replicas=args.metadata_replicas)
    text = json.dumps(summary, indent=2, sort_keys=True)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0 if not summary["failures"] else 1


def crash_run(build: Path, cuts: int, seed: int, jobs: int, per_image: int, ops: int,
              keep: Path | None, where: Path, log: Callable[[str], None] | None = None,
              lying_disk: bool = False, metadata_replicas: int = 1) -> dict[str, Any]:
    """Runs `cuts` cuts over `jobs` parallel jobs; the merged summary."""
    lock = threading.Lock()

    def say(msg: str) -> None:
        with lock:
            (log or (lambda s: print(s, flush=True, file=__import__("sys").stderr)))(msg)

    start = time.monotonic()
    results: list[dict[str, Any]] = []
    threads = []
    tmps = []
    for j in range(jobs):
        share = cuts // jobs + (1 if j < cuts % jobs else 0)
        if share == 0:
            continue
        tmp = Path(tempfile.mkdtemp(prefix="tierlab-crash-", dir=where))
        tmps.append(tmp)
        job = Job(build, tmp, seed + j, share, per_image, ops, keep,
                  lambda s, j=j: say(f"tierlab crash: job {j}: {s}"), lying_disk, metadata_replicas)

        def go(job: Job = job, j: int = j) -> None:
            # A job the harness itself broke (a tierfs binary replaced under
            # it, a bug here) is a failure of the run, never a silent gap.
            try:
                st = job.run_all()
            except Exception as e:  # noqa: BLE001 -- reported, with the cuts it still made
                st = dict(job.stats)
                st["failures"] = list(st.get("failures", [])) + [f"job {j}: the harness failed: "
                                                                 f"{type(e).__name__}: {e}"]
                say(f"tierlab crash: job {j}: the harness failed: {type(e).__name__}: {e}")
            with lock:
                results.append(st)
        t = threading.Thread(target=go)
        t.start()
        threads.append(t)
    try:
        for t in threads:
            t.join()
    finally:
        for tmp in tmps:
            shutil.rmtree(tmp, ignore_errors=True)
    total: dict[str, Any] = {"seed": seed, "jobs": jobs, "metadata_replicas": metadata_replicas,
                             "wall_s": round(time.monotonic() - start, 1)}
    for st in results:
        for k, v in st.items():
            if isinstance(v, dict):
                d = total.setdefault(k, {})
                for kk, vv in v.items():
                    d[kk] = d.get(kk, 0) + vv
            elif isinstance(v, list):
                total.setdefault(k, []).extend(v)
            else:
                total[k] = total.get(k, 0) + v
    total.setdefault("failures", [])
    if total.get("cuts", 0) != cuts and not total["failures"]:
        total["failures"].append(f"{total.get('cuts', 0)} cuts made of {cuts}")
    return total
