"""`tierlab pair`: paired runs of a lab profile, two arms at the same time.

    tierlab pair --profile NAME --pairs N --out DIR [--seed S] [--arms active,control]
                 [--baseline BUILD_DIR --candidate BUILD_DIR] [--set SECTION.KEY=VALUE]...

Two slots run at once, each its own filesystem on member images in RAM
(/dev/shm, fully written before the first format); the arm in each slot swaps
every pair (pair i: arm 0 in slot i%2). Every run formats afresh, mounts under
the profile's fault devices (`tierfs mount -f --fault ...`, a child we own),
runs tierprobe and the background workload, fires the profile's fault events,
snapshots `tierfs ctl` at every phase edge, measures quiescence, unmounts, waits
for the daemon and runs fsck. Both runs of a pair use the same seeds.

Every child has a hard timeout; a run that hangs or fails is recorded as failed
(run.json status) and the lab goes on. Mounts, children and the images are
removed on the way out, also on errors and Ctrl-C. At the end `tierlab gate`'s
analysis writes DIR/report/ and the exit status is the gate's (0 pass, 1 fail,
2 bad input). Layout and criteria: docs/lab/pair.md."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tierlab import REPO_ROOT, LabError, manifest
from tierlab import profile as profile_mod
from tierlab import schema

CTL_TIMEOUT = 20.0
FORMAT_TIMEOUT = 120.0
MOUNT_TIMEOUT = 30.0
UMOUNT_TIMEOUT = 120.0
# TIERFS_LOCK_WAIT for the mount child: below MOUNT_TIMEOUT, so a mount that
# waits for the lock fails with its own message before we give up on it.
LOCK_WAIT_S = int(MOUNT_TIMEOUT) - 10
FSCK_TIMEOUT = 300.0
READY_TIMEOUT = 120.0
# Past its schedule the probe still works off what a stall delayed; after this
# much more it is hung.
PROBE_SLACK_S = 120.0
BG_SLACK_S = 60.0
TEARDOWN_REAP_S = 10.0    # teardown: how long the daemon gets to exit before SIGKILL
WATCHDOG_GRACE_S = 60.0   # after the watchdog's kill, before the lab gives up
CLEANUP_JOIN_S = 30.0     # Ctrl-C: how long the run threads get to tear down


def register(sub: Any) -> None:
    p = sub.add_parser("pair", help="paired lab runs of a profile (two arms at once)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", default="fixed-delay", help="lab profile name or path "
                   "(workloads/profiles/; default fixed-delay)")
    p.add_argument("--pairs", type=int, default=5, help="pairs of runs (default 5)")
    p.add_argument("--out", required=True, metavar="DIR", help="results directory (new or empty)")
    p.add_argument("--seed", type=int, help="base seed (default: the profile's); pair i uses S+i")
    p.add_argument("--arms", default="active,control",
                   help="active,control (same build; control pauses background work)")
    p.add_argument("--baseline", metavar="BUILD_DIR", help="gate a candidate build against this")
    p.add_argument("--candidate", metavar="BUILD_DIR", help="the build under test")
    p.add_argument("--build", metavar="BUILD_DIR",
                   help="build for tierprobe and the active,control arms (default: this tierlab's)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a profile key (repeatable)")
    p.add_argument("--shm", default="/dev/shm", help="RAM directory for member images")
    p.add_argument("--no-report", action="store_true", help="skip the report at the end")
    p.set_defaults(run=run)


def default_build() -> Path:
    b = os.environ.get("TIERFS_BIN")
    if b:
        return Path(b).parent
    return Path(os.environ.get("TIERFS_BUILD", REPO_ROOT / "build"))


@dataclass
class Arm:
    name: str           # results arm: active, control, baseline, candidate
    build: Path
    pause: bool         # pause background engines (control)

    @property
    def tierfs(self) -> str:
        return str(self.build / "bin" / "tierfs")


# ------------------------------------------------------------------ children

class Children:
    """Every process the lab starts, so that Ctrl-C and errors end exactly them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.procs: set[subprocess.Popen[Any]] = set()
        self.mounts: set[str] = set()
        self.stopping = threading.Event()

    def popen(self, cmd: list[str], **kw: Any) -> subprocess.Popen[Any]:
        # Check, start and register under the lock: kill_all sets `stopping`
        # under it too, so a child is either refused or seen by kill_all.
        with self.lock:
            if self.stopping.is_set():
                raise RunFailed("stopping")
            p = subprocess.Popen(cmd, start_new_session=True, **kw)
            self.procs.add(p)
        return p

    def done(self, p: subprocess.Popen[Any]) -> None:
        with self.lock:
            self.procs.discard(p)

    def run(self, cmd: list[str], timeout: float, what: str) -> subprocess.CompletedProcess[str]:
        p = self.popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill(p)
            try:
                out, err = p.communicate(timeout=10)
            except subprocess.TimeoutExpired:  # a grandchild holds the pipes
                pass
            raise RunFailed(f"{what}: no answer within {timeout:g} s (killed)") from None
        finally:
            self.done(p)
        return subprocess.CompletedProcess(cmd, p.returncode, out, err)

    def kill_all(self) -> None:
        with self.lock:
            self.stopping.set()
            procs = list(self.procs)
            mounts = list(self.mounts)
        for m in mounts:
            lazy_unmount(m)
        for p in procs:
            kill(p)

    def kill_running(self, mounts: list[str]) -> None:
        """The per-pair watchdog: lazily unmount `mounts` and kill every child
        running now (only one pair runs at a time), without stopping the lab."""
        with self.lock:
            procs = list(self.procs)
        for m in mounts:
            lazy_unmount(m)
        for p in procs:
            kill(p)


def kill(p: subprocess.Popen[Any]) -> None:
    """SIGKILL the child's process group (it was started in its own session).
    Always, also when the leader has exited: its group may live on. The group
    id stays reserved while the unreaped leader is a zombie, and after a reap
    nothing of ours runs under it any more (ProcessLookupError)."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def lazy_unmount(mnt: str) -> None:
    """`fusermount3 -u -z`, bounded, never raising (the last resort of teardown)."""
    try:
        subprocess.run(["fusermount3", "-u", "-z", mnt], capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        pass


class RunFailed(Exception):
    pass


def last_line(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "(no output)"


def first_line(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[0][:300] if lines else "(no output)"


def unescape_mountinfo(field_text: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as \\ooo octal."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field_text)


def is_mounted(path: str, mountinfo: str = "/proc/self/mountinfo") -> bool:
    """Whether `path` (resolved, as tierfs mount resolves it) is a mount point.
    Reads mountinfo rather than stat()ing the path: a hung FUSE daemon would
    hang a stat."""
    want = os.path.realpath(path)
    with open(mountinfo) as f:
        for line in f:
            parts = line.split()
            if len(parts) > 4 and unescape_mountinfo(parts[4]) == want:
                return True
    return False


# ------------------------------------------------------------------ one run

@dataclass
class Status:
    arm: str = ""
    phase: str = "idle"
    phase_start: float = 0.0
    phase_len: float = 0.0


@dataclass
class Slot:
    index: int
    root: Path                       # /dev/shm/tierlab-PID/slotN
    images: dict[str, str] = field(default_factory=dict)
    status: Status = field(default_factory=Status)

    @property
    def mnt(self) -> str:
        return str(self.root / "mnt")


def write_images(slot: Slot, prof: profile_mod.Profile) -> None:
    """Member images in RAM, every byte written (reads of holes never reach a
    device; tmpfs allocates pages at the first write)."""
    slot.root.mkdir(parents=True, exist_ok=True)
    Path(slot.mnt).mkdir(exist_ok=True)
    chunk = b"\0" * (8 << 20)
    for m in prof.members:
        path = slot.root / f"{m.label}.img"
        with open(path, "wb") as f:
            left = m.size
            while left > 0:
                n = min(left, len(chunk))
                f.write(chunk[:n])
                left -= n
        slot.images[m.label] = str(path)


class Run:
    """One run of one arm in one slot; everything lands in `self.dir`."""

    def __init__(self, lab: "Lab", slot: Slot, arm: Arm, pair: int, seed: int) -> None:
        self.lab, self.slot, self.arm, self.pair, self.seed = lab, slot, arm, pair, seed
        self.prof = lab.prof
        self.dir = lab.out / "runs" / f"p{pair:02d}-{arm.name}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.info: dict[str, Any] = {
            "pair": pair, "arm": arm.name, "slot": slot.index, "seed": seed,
            "build": str(arm.build), "status": "running", "error": None, "edges": {},
            "events": [], "pause": None, "quiescence_s": None, "quiesce": [],
            "fsck": None, "background": None, "probe": None}
        self.mount_proc: subprocess.Popen[Any] | None = None
        self.mount_started = False
        self.end_doc: dict[str, Any] = {}

    # -- helpers
    def phase(self, name: str, length: float = 0.0) -> None:
        self.slot.status = Status(self.arm.name, name, time.monotonic(), length)
        self.lab.phase_changed(self, name)

    def tierfs(self, args: list[str], timeout: float, what: str) -> subprocess.CompletedProcess[str]:
        return self.lab.children.run([self.arm.tierfs, *args], timeout, what)

    def ctl(self) -> dict[str, Any]:
        proc = self.tierfs(["ctl", self.slot.mnt], CTL_TIMEOUT, "tierfs ctl")
        if proc.returncode != 0:
            raise RunFailed(f"tierfs ctl: {last_line(proc.stderr)}")
        try:
            return json.loads(proc.stdout)
        except json.JSONDecodeError as e:
            raise RunFailed(f"tierfs ctl: not JSON ({e.msg})") from None

    def snapshot(self, edge: str) -> dict[str, Any]:
        doc = self.ctl()
        self.info["edges"][edge] = time.time()
        (self.dir / f"ctl-{edge}.json").write_text(json.dumps(doc, indent=1) + "\n")
        return doc

    def sleep_until(self, unix: float) -> None:
        while True:
            left = unix - time.time()
            if left <= 0:
                return
            if self.lab.children.stopping.wait(min(left, 0.5)):
                raise RunFailed("stopping")

    # -- the run
    def execute(self, barrier: threading.Barrier) -> None:
        t_start = time.time()
        try:
            try:
                self._setup()
            finally:
                try:  # the other slot must never wait for us forever
                    barrier.wait(timeout=FORMAT_TIMEOUT + MOUNT_TIMEOUT + 60)
                except threading.BrokenBarrierError:
                    pass
            self._workload()
            self._quiesce()
            self._finish()
            self.info["status"] = "ok"
        except RunFailed as e:
            self.info["status"], self.info["error"] = "failed", str(e)
        except Exception as e:  # a bug must not take the other slot's cleanup with it
            self.info["status"], self.info["error"] = "failed", f"{type(e).__name__}: {e}"
        finally:
            self._teardown()
            self.info["wall_s"] = round(time.time() - t_start, 1)
            (self.dir / "run.json").write_text(json.dumps(self.info, indent=1) + "\n")
            self.phase("done")

    def _setup(self) -> None:
        self.phase("format")
        imgs = self.slot.images
        proc = self.tierfs(["format", "--force", *profile_mod.format_args(self.prof, imgs)],
                           FORMAT_TIMEOUT, "tierfs format")
        (self.dir / "format.txt").write_text(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            raise RunFailed(f"tierfs format: {last_line(proc.stderr)}")
        self.phase("mount")
        cmd = [self.arm.tierfs, "mount", *[imgs[m.label] for m in self.prof.members],
               self.slot.mnt, "-f", *profile_mod.fault_args(self.prof, self.seed)]
        (self.dir / "mount-command.txt").write_text(" ".join(cmd) + "\n")
        log = open(self.dir / "mount.log", "w")
        # A finishing daemon of the previous pair may still hold the members'
        # lock: wait for it no longer than we wait for the mount.
        env = dict(os.environ, TIERFS_LOCK_WAIT=str(LOCK_WAIT_S))
        with self.lab.children.lock:  # registered before kill_all can miss it
            self.lab.children.mounts.add(self.slot.mnt)
        self.mount_started = True
        try:
            self.mount_proc = self.lab.children.popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                                      env=env)
        finally:
            log.close()
        deadline = time.monotonic() + MOUNT_TIMEOUT
        while not is_mounted(self.slot.mnt):
            if self.mount_proc.poll() is not None:
                raise RunFailed("tierfs mount: exited "
                                f"{self.mount_proc.returncode}: "
                                f"{last_line((self.dir / 'mount.log').read_text())}")
            if time.monotonic() > deadline:
                raise RunFailed(f"tierfs mount: not mounted within {MOUNT_TIMEOUT:g} s")
            time.sleep(0.05)
        if self.arm.pause:
            proc = self.tierfs(["ctl", self.slot.mnt, "pause", "all"], CTL_TIMEOUT, "tierfs ctl pause")
            self.info["pause"] = {"rc": proc.returncode,
                                  "reply": first_line(proc.stdout + proc.stderr)}
        self.snapshot("start")
        self.phase("ready")

    def _workload(self) -> None:
        prof, mnt = self.prof, self.slot.mnt
        ph = prof.phases
        ready = self.dir / "probe.ready"
        ready.unlink(missing_ok=True)
        probe_cmd = [str(self.lab.build / "bin" / "tierprobe"), "--dir", mnt,
                     "--json", str(self.dir / "probe.raw.json"), "--ready-file", str(ready),
                     *probe_args(prof, self.seed, self.pair, self.slot.index, self.arm.name)]
        self.phase("probe setup")
        perr = open(self.dir / "probe.stderr", "w")
        probe = self.lab.children.popen(probe_cmd, stdout=perr, stderr=subprocess.STDOUT)
        perr.close()
        bg = None
        try:
            deadline = time.monotonic() + READY_TIMEOUT
            while not ready.exists() or not ready.read_text().strip():
                if probe.poll() is not None:
                    raise RunFailed(f"tierprobe exited {probe.returncode} before its schedule: "
                                    f"{last_line((self.dir / 'probe.stderr').read_text())}")
                if time.monotonic() > deadline:
                    raise RunFailed(f"tierprobe: no schedule within {READY_TIMEOUT:g} s")
                if self.lab.children.stopping.wait(0.05):
                    raise RunFailed("stopping")
            t0 = int(ready.read_text().split()[0]) / 1e9
            self.info["t0_unix"] = t0
            self.info["edges"]["workload"] = t0
            measure_at = t0 + ph["warmup_s"]
            end_at = measure_at + ph["measure_s"]
            b = prof.background
            if b["workload"] == "bg-writer":
                self.sleep_until(t0 + b["start_s"])
                # Through a child with a timeout: a deadlocked daemon must hang
                # a child we can kill, not the lab's own thread.
                mk = self.lab.children.run(["mkdir", "-p", "--", str(Path(mnt) / b["dir"])],
                                           CTL_TIMEOUT, "mkdir background dir")
                if mk.returncode != 0:
                    raise RunFailed(f"mkdir {b['dir']}: {last_line(mk.stderr)}")
                runtime = max(1, int(end_at - time.time()))
                bg_cmd = [str(REPO_ROOT / "workloads" / "bg-writer" / "run"),
                          "--dir", str(Path(mnt) / b["dir"]), "--out", str(self.dir / "bg.json"),
                          "--size", str(b["size"]), "--files", str(b["files"]),
                          "--rate", b["rate"], "--runtime", str(runtime),
                          "--pair", str(self.pair), "--seed", str(self.seed),
                          "--fault-profile", prof.name, "--label", f"slot={self.slot.index}"]
                if b["keep"]:
                    bg_cmd.append("--keep")
                berr = open(self.dir / "bg.stderr", "w")
                bg = self.lab.children.popen(bg_cmd, stdout=berr, stderr=subprocess.STDOUT)
                berr.close()
            self.phase("warmup", ph["warmup_s"])
            self.sleep_until(measure_at)
            self.snapshot("measure")
            self.phase("measure", ph["measure_s"])
            for ev in prof.events:
                self.sleep_until(measure_at + ev.at_s)
                self._fire(ev, t0)
            self.sleep_until(end_at)
            self.phase("drain")
            self._wait(probe, end_at + PROBE_SLACK_S, "tierprobe")
            if probe.returncode != 0:
                raise RunFailed(f"tierprobe exited {probe.returncode}: "
                                f"{last_line((self.dir / 'probe.stderr').read_text())}")
            if bg is not None:
                self._wait(bg, time.time() + BG_SLACK_S, "bg-writer")
                self.info["background"] = {"rc": bg.returncode,
                                           "error": None if bg.returncode == 0 else
                                           last_line((self.dir / "bg.stderr").read_text())}
            self.info["workload_end_unix"] = time.time()
        finally:
            for p in (probe, bg):
                if p is not None:
                    kill(p)
                    self.lab.children.done(p)
        self.end_doc = self.snapshot("end")
        self._probe_document()

    def _fire(self, ev: profile_mod.Event, t0: float) -> None:
        """One fault event, recorded; a command that fails fails the run (the
        run would otherwise measure a fault that never happened)."""
        at = time.time()
        proc = self.tierfs(["ctl", self.slot.mnt, "fault", ev.member, *ev.command.split()],
                           CTL_TIMEOUT, f"fault {ev.member} {ev.command}")
        reply = first_line(proc.stdout + proc.stderr)
        self.info["events"].append({
            "at_s": ev.at_s, "unix": at, "probe_t": at - t0, "member": ev.member,
            "command": ev.command, "duration_s": ev.duration_s, "rc": proc.returncode,
            "reply": reply})
        if proc.returncode != 0:
            raise RunFailed(f"fault {ev.member} {ev.command}: exited {proc.returncode}: {reply}")

    def _wait(self, p: subprocess.Popen[Any], deadline_unix: float, what: str) -> None:
        while p.poll() is None:
            if time.time() > deadline_unix:
                kill(p)
                raise RunFailed(f"{what}: still running {PROBE_SLACK_S:g} s past its end "
                                "(hung; killed)")
            if self.lab.children.stopping.wait(0.2):
                raise RunFailed("stopping")

    def _probe_document(self) -> None:
        probe_document(self.dir, self.prof, self.arm, self.slot.index)
        self.info["probe"] = "probe.json"

    def _quiesce(self) -> None:
        """Writes, flushes and discards summed over every member (device_writes),
    polled each second, from the end of the
        workload until the first window_s with none (or max_s)."""
        q = self.prof.quiesce
        end = self.info["workload_end_unix"]
        self.phase("quiesce", q["max_s"])
        # The first point is the `end` snapshot, taken right after the workload.
        series = [(round(self.info["edges"]["end"] - end, 3), device_writes(self.end_doc))]
        found = None
        while True:
            doc = self.ctl()
            t = time.time()
            series.append((round(t - end, 3), device_writes(doc)))
            found = quiet_since(series, q["window_s"])
            if found is not None or t - end >= q["max_s"]:
                break
            self.sleep_until(t + 1.0)
        (self.dir / "ctl-idle.json").write_text(json.dumps(doc, indent=1) + "\n")
        self.info["edges"]["idle"] = time.time()
        self.info["quiesce"] = series
        self.info["quiescence_s"] = None if found is None else max(0.0, found)

    def _finish(self) -> None:
        for m in self.prof.members:
            if m.fault is None:
                continue
            proc = self.tierfs(["ctl", self.slot.mnt, "fault", m.label, "stats"], CTL_TIMEOUT,
                               f"fault {m.label} stats")
            (self.dir / f"fault-{m.label}.json").write_text(proc.stdout or proc.stderr)
        self.phase("unmount")
        self._unmount(strict=True)
        self.phase("fsck")
        imgs = [self.slot.images[m.label] for m in self.prof.members]
        proc = self.tierfs(["fsck", "-n", *imgs], FSCK_TIMEOUT, "tierfs fsck")
        (self.dir / "fsck.txt").write_text(proc.stdout + proc.stderr)
        self.info["fsck"] = {"rc": proc.returncode, "clean": proc.returncode == 0,
                             "last": last_line(proc.stdout + proc.stderr)}

    def _unmount(self, strict: bool) -> None:
        p = self.mount_proc
        if p is None:
            return
        mnt = self.slot.mnt
        if is_mounted(mnt):
            try:
                r = subprocess.run(["fusermount3", "-u", mnt], capture_output=True, text=True,
                                   timeout=UMOUNT_TIMEOUT)
                err = None if r.returncode == 0 else last_line(r.stderr)
            except subprocess.TimeoutExpired:
                err = f"no answer within {UMOUNT_TIMEOUT:g} s"
            if err is not None:
                lazy_unmount(mnt)
                if strict:
                    self._reap(p, 10)
                    raise RunFailed(f"fusermount3 -u: {err} (lazy unmount)")
        # The daemon releases the members' lock only when it exits: wait for it.
        ok = self._reap(p, UMOUNT_TIMEOUT if strict else TEARDOWN_REAP_S)
        with self.lab.children.lock:
            self.lab.children.mounts.discard(mnt)
        if strict and not ok:
            raise RunFailed(f"tierfs mount daemon did not exit within {UMOUNT_TIMEOUT:g} s "
                            "after unmount (killed)")
        if strict and p.returncode != 0:
            raise RunFailed(f"tierfs mount exited {p.returncode}: "
                            f"{last_line((self.dir / 'mount.log').read_text())}")

    def _reap(self, p: subprocess.Popen[Any], timeout: float) -> bool:
        try:
            p.wait(timeout=timeout)
            ok = True
        except subprocess.TimeoutExpired:
            kill(p)
            ok = False
        self.lab.children.done(p)
        self.mount_proc = None
        return ok

    def _teardown(self) -> None:
        try:
            self._unmount(strict=False)
        except Exception:
            pass
        finally:
            # Whatever happened above: once a mount was started, lazily unmount
            # (a no-op when already gone) and never leave the daemon running
            # over the next pair's freshly formatted images.
            if self.mount_started:
                lazy_unmount(self.slot.mnt)
            if self.mount_proc is not None:
                kill(self.mount_proc)
                self.lab.children.done(self.mount_proc)
                self.mount_proc = None
            with self.lab.children.lock:
                self.lab.children.mounts.discard(self.slot.mnt)


def probe_args(prof: profile_mod.Profile, seed: int, pair: int, slot: int, arm: str) -> list[str]:
    """tierprobe's options for a run of the profile, besides --dir, --json and
    --ready-file."""
    pr, ph = prof.probe, prof.phases
    args = ["--rate", f"{pr['rate']:g}",
            "--duration", f"{ph['measure_s']:g}s", "--warmup", f"{ph['warmup_s']:g}s",
            "--mix", pr["mix"], "--threads", str(pr["threads"]),
            "--schedule", pr["schedule"], "--working-set", str(pr["working_set"]),
            "--files", str(pr["files"]), "--seed", str(seed),
            "--pair", str(pair), "--fault-profile", prof.name,
            "--label", f"slot={slot}", "--label", f"lab_arm={arm}", "--quiet"]
    if pr["direct"]:
        args.append("--direct")
    if pr["lane_per_op"]:
        args.append("--lane-per-op")
    if pr["keep_going"]:
        args.append("--keep-going")
    if pr["spin"]:
        args += ["--spin", pr["spin"]]
    return args


def probe_document(run_dir: Path, prof: profile_mod.Profile, arm: Arm, slot: int,
                   boot: int | None = None) -> None:
    """RUN_DIR/probe.raw.json (tierprobe's document) -> RUN_DIR/probe.json with
    the lab's coordinates: arm, slot, (boot,) the profile's device layout, build."""
    raw = run_dir / "probe.raw.json"
    doc = schema.load(raw)
    m = doc["manifest"]
    m["arm"] = arm.name
    m["slot"] = slot
    if boot is not None:
        m["boot"] = boot
    m["device_layout"] = {"members": [
        {"label": x.label, "size": x.size, "fault": x.fault, "fault_set": x.fault_set}
        for x in prof.members], "format": profile_mod.format_args(
            prof, {x.label: f"{x.label}.img" for x in prof.members})}
    m.setdefault("labels", {})["build"] = str(arm.build)
    schema.write(doc, run_dir / "probe.json")
    raw.unlink()


QUIESCE_OPS = ("write", "flush", "discard")


def device_writes(ctl: dict[str, Any]) -> int:
    """Write, flush and discard ops of every member and origin in one `tierfs
    ctl` document, in both views: tierfs's own counters (`devices[].io`) and,
    when present, the fault device's (`devices[].fault.io`), which also sees I/O
    that goes around tierfs's queue."""
    n = 0
    for d in ctl.get("devices", []):
        fault = d.get("fault")
        views = [d.get("io")] + [fault.get("io") if isinstance(fault, dict) else None]
        for io in views:
            if not isinstance(io, dict):
                continue
            for origin in io.values():
                if not isinstance(origin, dict):
                    continue
                for op in QUIESCE_OPS:
                    c = origin.get(op)
                    if isinstance(c, dict):
                        n += int(c.get("ops", 0))
    return n


def quiet_since(series: list[tuple[float, int]], window: float) -> float | None:
    """The time (seconds after the workload) of the first sample that starts a
    window of `window` seconds without a write, or None."""
    for i, (t, w) in enumerate(series):
        for t2, w2 in series[i + 1:]:
            if w2 != w:
                break
            if t2 - t >= window:
                return t
    return None


# ------------------------------------------------------------------ the lab

class Lab:
    def __init__(self, args: argparse.Namespace) -> None:
        self.prof = profile_mod.load(args.profile, args.set)
        if self.prof.needs_guest:
            raise LabError(f"profile {self.prof.name} sets {self.prof.needs_guest}, which only "
                           "a QEMU guest has: run it with tierlab vm pair")
        if args.pairs < 1 or args.pairs > 1000:
            raise LabError(f"--pairs: want 1..1000, got {args.pairs}")
        self.pairs = args.pairs
        self.seed = args.seed if args.seed is not None else self.prof.seed
        if self.seed < 0:
            raise LabError(f"--seed: must be >= 0, got {self.seed}")
        self.build = Path(args.build) if args.build else default_build()
        self.arms, self.mode = parse_arms(args, self.build)
        for a in self.arms:
            if not Path(a.tierfs).is_file():
                raise LabError(f"{a.tierfs}: no tierfs there (build it, or give the build dir)")
        if not (self.build / "bin" / "tierprobe").is_file():
            raise LabError(f"{self.build}/bin/tierprobe: missing (make build)")
        if shutil.which("fusermount3") is None:
            raise LabError("fusermount3 is missing (Debian package fuse3)")
        if self.prof.background["workload"] == "bg-writer" and shutil.which("fio") is None:
            raise LabError("fio is missing (scripts/install-deps test)")
        self.out = Path(args.out)
        if self.out.exists() and any(self.out.iterdir()):
            raise LabError(f"--out {self.out}: not empty (each pair run gets its own directory)")
        shm = Path(args.shm).resolve()  # tierfs mount resolves the mount point too
        if not shm.is_dir():
            raise LabError(f"--shm {shm}: no such directory")
        need = 2 * self.prof.slot_bytes()
        st = os.statvfs(shm)
        avail = min(st.f_bavail * st.f_frsize, _mem_available())
        if need > 0.7 * avail:
            raise LabError(f"two slots need {need >> 20} MiB of RAM for images, "
                           f"{avail >> 20} MiB available: shrink the members")
        self.root = shm / f"tierlab-{os.getpid()}"
        self.children = Children()
        self.slots = [Slot(i, self.root / f"slot{i}") for i in range(2)]
        self.tty = sys.stdout.isatty()
        self.t_start = time.monotonic()
        self.current_pair = 0
        self.print_lock = threading.Lock()
        self.run_estimate = (self.prof.workload_s + self.prof.quiesce["window_s"] + 15)
        self.threads: list[threading.Thread] = []
        self.pair_deadline_s = pair_deadline_s(self.prof)

    def phase_changed(self, r: Run, name: str) -> None:
        if not self.tty:
            with self.print_lock:
                print(f"tierlab pair: pair {r.pair + 1}/{self.pairs} slot {r.slot.index} "
                      f"{r.arm.name}: {name}", flush=True)

    def progress(self) -> None:
        el = time.monotonic() - self.t_start
        done = self.current_pair
        per = el / done if done else self.run_estimate
        remaining = max(0.0, per * self.pairs - el)
        parts = []
        for s in self.slots:
            st = s.status
            t = time.monotonic() - st.phase_start
            parts.append(f"slot{s.index} {st.arm} {st.phase}" +
                         (f" {t:.0f}/{st.phase_len:.0f}s" if st.phase_len else ""))
        line = (f"pair {self.current_pair + 1}/{self.pairs}  " + "  ".join(parts) +
                f"  elapsed {el // 60:.0f}:{el % 60:02.0f} remaining ~{remaining // 60:.0f}:"
                f"{remaining % 60:02.0f}")
        with self.print_lock:
            sys.stdout.write("\r\033[K" + line[:200])
            sys.stdout.flush()

    def run_pairs(self) -> list[dict[str, Any]]:
        results = []
        for s in self.slots:
            write_images(s, self.prof)
        for i in range(self.pairs):
            self.current_pair = i
            seed = self.seed + i
            # pair i: arm 0 in slot i % 2, so each arm takes each slot in turn
            order = [self.arms[0], self.arms[1]] if i % 2 == 0 else [self.arms[1], self.arms[0]]
            barrier = threading.Barrier(2)
            runs = [Run(self, self.slots[s], order[s], i, seed) for s in range(2)]
            threads = [threading.Thread(target=r.execute, args=(barrier,), daemon=True)
                       for r in runs]
            self.threads = threads
            for t in threads:
                t.start()
            deadline = time.monotonic() + self.pair_deadline_s
            fired = False
            while any(t.is_alive() for t in threads):
                if self.tty:
                    self.progress()
                for t in threads:
                    t.join(timeout=1.0 / len(threads))
                if time.monotonic() > deadline and not fired:
                    # Every step has its own timeout; past their sum something
                    # hangs that none caught: end this pair's processes.
                    fired = True
                    self.children.kill_running([s.mnt for s in self.slots])
                    deadline = time.monotonic() + WATCHDOG_GRACE_S
                elif time.monotonic() > deadline and fired:
                    raise LabError(f"pair {i + 1}: still running {WATCHDOG_GRACE_S:g} s after "
                                   f"the watchdog ({self.pair_deadline_s:g} s) killed its "
                                   "processes; stopping")
            if fired:
                for r in runs:
                    if r.info["status"] != "ok":
                        r.info["error"] = (f"watchdog: pair past {self.pair_deadline_s:g} s, "
                                           f"processes killed: {r.info['error']}")
                        (r.dir / "run.json").write_text(json.dumps(r.info, indent=1) + "\n")
            for r in runs:
                results.append(r.info)
                if r.info["status"] != "ok":
                    with self.print_lock:
                        print(f"\ntierlab pair: pair {i + 1} {r.arm.name} (slot {r.slot.index}) "
                              f"failed: {r.info['error']}", file=sys.stderr, flush=True)
        if self.tty:
            print()
        return results

    def cleanup(self) -> None:
        self.children.kill_all()
        # The run threads tear down on "stopping"; give them a bounded time,
        # then end whatever a thread started between the two looks.
        end = time.monotonic() + CLEANUP_JOIN_S
        for t in self.threads:
            t.join(timeout=max(0.0, end - time.monotonic()))
        self.children.kill_all()
        shutil.rmtree(self.root, ignore_errors=True)


def parse_arms(args: argparse.Namespace, build: Path) -> tuple[list[Arm], str]:
    """--arms, or --baseline with --candidate: the two arms and the mode."""
    if (args.baseline is None) != (args.candidate is None):
        raise LabError("--baseline and --candidate go together")
    if args.baseline:
        return [Arm("baseline", Path(args.baseline), False),
                Arm("candidate", Path(args.candidate), False)], "builds"
    names = [a.strip() for a in args.arms.split(",")]
    if sorted(names) != ["active", "control"]:
        raise LabError(f"--arms: want active,control, got {args.arms!r}")
    return [Arm(n, build, n == "control") for n in names], "arms"


def lab_meta(args: argparse.Namespace, prof: profile_mod.Profile, pairs: int, seed: int,
             mode: str, arms: list[Arm], build: Path) -> dict[str, Any]:
    """lab.json's content at the start of a run (what `gate` and `report` read)."""
    return {
        "format": "tierlab-pair", "version": 1, "profile": prof.name,
        "profile_path": prof.path, "sets": args.set, "pairs": pairs, "seed": seed,
        "mode": mode, "arms": [{"name": a.name, "build": str(a.build), "pause": a.pause}
                               for a in arms],
        "tierprobe_build": str(build), "concurrent": True, "start": manifest.iso_now(),
        "git_commit": manifest.git_commit()[0], "command": sys.argv}


def pair_deadline_s(prof: profile_mod.Profile) -> float:
    """The watchdog bound of one pair: the sum of every step's own timeout."""
    n_ctl = 6 + len(prof.events) + len(prof.members) + int(prof.quiesce["max_s"]) + 2
    return (FORMAT_TIMEOUT + MOUNT_TIMEOUT + 60 + READY_TIMEOUT + prof.workload_s
            + PROBE_SLACK_S + BG_SLACK_S + n_ctl * CTL_TIMEOUT + prof.quiesce["max_s"]
            + 2 * UMOUNT_TIMEOUT + 60 + FSCK_TIMEOUT + 60)


def _mem_available() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62


def run(args: argparse.Namespace) -> int:
    lab = Lab(args)
    lab.out.mkdir(parents=True, exist_ok=True)
    (lab.out / "profile.toml").write_text(Path(lab.prof.path).read_text())
    meta = lab_meta(args, lab.prof, lab.pairs, lab.seed, lab.mode, lab.arms, lab.build)
    (lab.out / "lab.json").write_text(json.dumps(meta, indent=1) + "\n")
    old = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    t0 = time.time()
    try:
        runs = lab.run_pairs()
    except KeyboardInterrupt:
        lab.cleanup()
        raise
    finally:
        lab.cleanup()
        signal.signal(signal.SIGTERM, old)
    return finish_lab("tierlab pair", lab.out, meta, runs, t0, args.no_report)


def finish_lab(prog: str, out: Path, meta: dict[str, Any], runs: list[dict[str, Any]], t0: float,
               no_report: bool) -> int:
    """The end of a paired lab (tierlab pair, tierlab vm pair): lab.json's end,
    wall time and runs, one summary line, then the report and gate (its exit
    status), or with `no_report` 1 if a run failed."""
    meta["end"] = manifest.iso_now()
    meta["wall_s"] = round(time.time() - t0, 1)
    meta["runs"] = [f"runs/p{r['pair']:02d}-{r['arm']}" for r in runs]
    (out / "lab.json").write_text(json.dumps(meta, indent=1) + "\n")
    failed = [r for r in runs if r["status"] != "ok"]
    print(f"{prog}: {len(runs) - len(failed)} of {len(runs)} runs completed in "
          f"{meta['wall_s']:.0f} s -> {out}", flush=True)
    if no_report:
        return 1 if failed else 0
    from tierlab import labgate
    return labgate.report_dir(out, out / "report", [])
