"""Lab profiles run in QEMU guests: `tierlab vm run` (one arm, one boot) and
`tierlab vm pair` (pairs of boots, gated like `tierlab pair`; docs/lab/vmlab.md).

Each run is one boot (vmboot.boot): the profile's members are images in
/dev/shm (fully written once per slot, formatted afresh by every boot) served
by `faultdev serve` with the profile's fault models; the guest runs
vmlab/guest/profile-run behind a header of variables made here from the
profile (format, mount, pause, tierprobe, fio as bg-writer, ctl at the edges,
quiescence polls, unmount) and prints a console marker at each edge; the
profile's fault events go to the member's control socket at their time after
the `measure` marker. After QEMU has exited the host runs `tierfs fsck -n` over
the boot's images and turns what the guest wrote into pair.py's run directory
(run.json, probe.json, bg.json, ctl-EDGE.json, ...) with pair.py's and the
bg-writer folder's own code, so `tierlab gate` and `tierlab report` read a vm
pair directory unchanged.

Invariants: a boot never outlives its hard timeout (vmboot kills it); a boot
that fails or hangs is a failed run, and the lab goes on; Ctrl-C cancels both
guests and removes the images."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tierlab import REPO_ROOT, LabError, vmboot, vmimage
from tierlab import pair as pair_mod
from tierlab import profile as profile_mod

GUEST_RUNNER = REPO_ROOT / "vmlab" / "guest" / "profile-run"
BG_JOB = REPO_ROOT / "workloads" / "bg-writer" / "bgwrite.fio"
BG_PARSE = REPO_ROOT / "workloads" / "bg-writer" / "parse.py"
GUEST_MNT = "/mnt/lab"
# Beyond the profile's phases: boot (~6-10 s under TCG), format, mount, the
# probe's working set, unmount, results; generous for a loaded 2-core host.
BOOT_OVERHEAD_S = 150.0
FSCK_TIMEOUT = 300.0
PARSE_TIMEOUT = 60.0
CANCEL_JOIN_S = 30.0
# Files of the guest's results that make up the run directory (as pair.py's).
RUN_FILES = ("probe.raw.json", "ctl-start.json", "ctl-measure.json", "ctl-end.json",
             "ctl-idle.json", "format.txt", "mount.log", "probe.stderr", "bg.stderr",
             "bg.json.fio.json", "pause.txt")


@dataclass
class VmSettings:
    cpus: int
    mem_mib: int
    timeout: float
    accel: str
    budget: float | None = None  # the job's own limit in the guest (None: vmboot's default)


def add_vm_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", default="fixed-delay", help="lab profile name or path "
                   "(workloads/profiles/; default fixed-delay)")
    p.add_argument("--out", required=True, metavar="DIR", help="results directory (new or empty)")
    p.add_argument("--seed", type=int, help="base seed (default: the profile's); pair i uses S+i")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a profile key (repeatable)")
    p.add_argument("--timeout", type=float, metavar="S", help="hard limit of each boot "
                   f"(default {BOOT_OVERHEAD_S:g} s + the profile's phases and quiesce.max_s)")
    p.add_argument("--cpus", type=int, default=1, help="CPUs of each guest (default 1: two guests share the host's cores)")
    p.add_argument("--mem", type=int, default=1536, metavar="MiB",
                   help="memory of each guest (default 1536)")
    p.add_argument("--budget", type=float, metavar="S",
                   help="the job's own limit inside the guest (default: the timeout minus 60 s)")
    p.add_argument("--accel", choices=("auto", "kvm", "tcg"), default="auto",
                   help="auto: KVM when /dev/kvm opens, else TCG")
    p.add_argument("--shm", default="/dev/shm", help="RAM directory for member images")


def register(vsub: Any) -> None:
    pr = vsub.add_parser("run", help="one arm of a lab profile in one guest (no gate)")
    add_vm_args(pr)
    pr.add_argument("--arm", choices=("active", "control"), default="active",
                    help="control pauses background work (default active)")
    pr.add_argument("--pair", type=int, default=0, help="pair index for the documents (default 0)")
    pr.add_argument("--slot", type=int, default=0, choices=(0, 1), help="slot index (default 0)")
    pr.add_argument("--static-build", metavar="BUILD_DIR",
                    help="the guest's tierfs and tierprobe from BUILD_DIR/bin (a -DTIERFS_STATIC=ON "
                         "build; default: build/vmlab's static build)")
    pr.set_defaults(run=run_one_cmd, error_prefix="vm run")

    pp = vsub.add_parser("pair", help="paired boots of a lab profile, gated like tierlab pair")
    add_vm_args(pp)
    pp.add_argument("--pairs", type=int, default=5, help="pairs of boots (default 5)")
    pp.add_argument("--arms", default="active,control",
                    help="active,control (one build; control pauses background work)")
    pp.add_argument("--baseline", metavar="STATIC_BUILD", help="gate a candidate build against this "
                    "(a -DTIERFS_STATIC=ON build directory)")
    pp.add_argument("--candidate", metavar="STATIC_BUILD", help="the build under test (static)")
    pp.add_argument("--no-report", action="store_true", help="skip the report at the end")
    pp.set_defaults(run=run_pairs_cmd, error_prefix="vm pair")


# ------------------------------------------------------------------ the guest's job

def guest_job(prof: profile_mod.Profile, arm: pair_mod.Arm, pair: int, slot: int, seed: int,
              boot_index: int) -> str:
    """The job script: variables from the profile, then vmlab/guest/profile-run."""
    devs = {m.label: f"/dev/lab/{m.label}" for m in prof.members}
    b, ph, q = prof.background, prof.phases, prof.quiesce
    probe = pair_mod.probe_args(prof, seed, pair, slot, arm.name) + ["--boot", str(boot_index)]
    env = {
        "MEMBERS": " ".join(devs[m.label] for m in prof.members),
        "FORMAT_ARGS": shlex.join(profile_mod.format_args(prof, devs)),
        "PAUSE": "1" if arm.pause else "0",
        "PROBE_ARGS": shlex.join(probe),
        "WARMUP_S": f"{ph['warmup_s']:g}", "MEASURE_S": f"{ph['measure_s']:g}",
        "BG": "1" if b["workload"] == "bg-writer" else "0",
        "BG_DIR": b["dir"], "BG_SIZE": str(b["size"]), "BG_FILES": str(b["files"]),
        "BG_RATE": str(b["rate"]), "BG_START_S": f"{b['start_s']:g}",
        "BG_KEEP": "1" if b["keep"] else "0",
        "Q_WINDOW_S": f"{q['window_s']:g}", "Q_MAX_S": f"{q['max_s']:g}",
        "PROBE_SLACK_S": f"{pair_mod.PROBE_SLACK_S:g}", "BG_SLACK_S": f"{pair_mod.BG_SLACK_S:g}",
        "MOUNT_TIMEOUT_S": f"{pair_mod.MOUNT_TIMEOUT:g}",
        "READY_TIMEOUT_S": f"{pair_mod.READY_TIMEOUT:g}",
        "UMOUNT_TIMEOUT_S": f"{pair_mod.UMOUNT_TIMEOUT:g}",
    }
    for k, v in env.items():
        if "'" in v and k in ("FORMAT_ARGS", "PROBE_ARGS"):
            raise LabError(f"{prof.name}: a {k.lower()} value has a quote; the guest splits on spaces")
    head = [f"# {prof.name}: pair {pair}, slot {slot}, arm {arm.name}, seed {seed}",
            *[f"{k}={shlex.quote(v)}" for k, v in env.items()], ""]
    return "\n".join(head) + GUEST_RUNNER.read_text()


# ------------------------------------------------------------------ one boot, one run

@dataclass
class RunSpec:
    prof: profile_mod.Profile
    arm: pair_mod.Arm
    image: vmimage.Image
    pair: int
    slot: int
    seed: int
    images: Path                # the slot's member images (fully written)
    dir: Path                   # the run directory (runs/pNN-ARM)
    vm: VmSettings
    faultdev_build: Path
    cancel: threading.Event | None = None

    @property
    def boot_index(self) -> int:
        return 2 * self.pair + self.slot


def boot_timeout(prof: profile_mod.Profile) -> float:
    return BOOT_OVERHEAD_S + prof.workload_s + prof.quiesce["max_s"]


def member_specs(prof: profile_mod.Profile) -> tuple[list[vmboot.Member], dict[str, list[str]]]:
    members, sets = [], {}
    for m in prof.members:
        fault = m.fault
        if fault is not None and ("/" in fault or fault.endswith(".toml")):
            fault = str(profile_mod.fault_path(fault))
        members.append(vmboot.Member(m.label, m.size, fault))
        if m.fault_set:
            sets[m.label] = list(m.fault_set)
    return members, sets


def run_one(rs: RunSpec) -> dict[str, Any]:
    """One boot of one arm: boot, fsck, the run directory. Returns run.json's content."""
    t_start = time.time()
    prof = rs.prof
    rs.dir.mkdir(parents=True, exist_ok=True)
    info: dict[str, Any] = {
        "pair": rs.pair, "arm": rs.arm.name, "slot": rs.slot, "seed": rs.seed,
        "build": str(rs.arm.build), "status": "running", "error": None, "edges": {},
        "events": [], "pause": None, "quiescence_s": None, "quiesce": [],
        "fsck": None, "background": None, "probe": None, "boot": None}
    job = rs.dir / "job.sh"
    job.write_text(guest_job(prof, rs.arm, rs.pair, rs.slot, rs.seed, rs.boot_index))
    members, sets = member_specs(prof)
    events = [vmboot.Event(e.at_s, e.member, e.command.split()) for e in prof.events]
    spec = vmboot.BootSpec(
        image=rs.image, members=members, job=job, out=rs.dir / "boot", build=rs.faultdev_build,
        inputs=[BG_JOB], images_dir=rs.images, timeout=rs.vm.timeout, budget=rs.vm.budget,
        cpus=rs.vm.cpus,
        mem_mib=rs.vm.mem_mib, events=events, fault_sets=sets, seed=rs.seed, accel=rs.vm.accel,
        events_after="measure", cancel=rs.cancel)
    boot: dict[str, Any] = {}
    errors: list[str] = []
    try:
        boot = vmboot.boot(spec)
    except LabError as e:
        errors.append(f"boot: {e}")
    except Exception as e:  # a bug must not take the other slot's run with it
        errors.append(f"boot: {type(e).__name__}: {e}")
    if boot:
        try:
            collect(rs, boot, info, errors)
        except Exception as e:  # results cut short or malformed: the run failed, fsck still runs
            errors.append(f"results: {type(e).__name__}: {e}")
    info["fsck"] = fsck(rs)
    if errors:
        info["status"], info["error"] = "failed", errors[0]
    else:
        info["status"] = "ok"
    info["wall_s"] = round(time.time() - t_start, 1)
    (rs.dir / "run.json").write_text(json.dumps(info, indent=1) + "\n")
    return info


def collect(rs: RunSpec, boot: dict[str, Any], info: dict[str, Any], errors: list[str]) -> None:
    """What the guest and the boot left -> pair.py's run directory and run.json."""
    bdir, res = rs.dir / "boot", rs.dir / "boot" / "results"
    times = boot.get("times", {})
    q0 = boot.get("qemu_start_unix", boot.get("start_unix", 0.0))
    info["boot"] = {"index": rs.boot_index, "status": boot["status"], "reason": boot["reason"],
                    "times": times, "image": boot["image"]["key"], "accel": boot["accel"],
                    "cpus": boot["cpus"], "mem_mib": boot["mem_mib"],
                    "timeout_s": boot["timeout_s"], "wall_s": boot.get("wall_s")}
    for edge in ("start", "workload", "measure", "end", "idle"):
        if f"mark_{edge}" in times:
            info["edges"][edge] = round(q0 + times[f"mark_{edge}"], 3)
    if "workload" in info["edges"]:
        info["t0_unix"] = info["edges"]["workload"]
    if boot["status"] != "ok":
        err = read_line(res / "error.txt")
        what = "boot timeout" if boot["status"] == "timeout" else "boot failed"
        errors.append(err or f"{what}: {boot['reason']}")
    for name in RUN_FILES:
        if (res / name).is_file():
            shutil.copyfile(res / name, rs.dir / name)
    for m in rs.prof.members:
        if m.fault is not None and (bdir / f"fault-{m.label}.json").is_file():
            shutil.copyfile(bdir / f"fault-{m.label}.json", rs.dir / f"fault-{m.label}.json")
    if (res / "pause.rc").is_file():
        info["pause"] = {"rc": int(read_line(res / "pause.rc") or -1),
                         "reply": pair_mod.first_line((res / "pause.txt").read_text())}
    # Events: sent by vmboot at their time after the guest's `measure` marker.
    measure = times.get("mark_measure")
    by_key = {(e.member, i): e for i, e in enumerate(rs.prof.events)}
    for i, rec in enumerate(boot.get("events", [])):
        ev = by_key.get((rec["label"], i))
        if not rec.get("sent"):
            if boot["status"] == "ok":
                errors.append(f"fault {rec['label']} {rec['command']}: not sent")
            continue
        info["events"].append({
            "at_s": rec["at_s"], "unix": round(q0 + rec["sent_s"], 3),
            "probe_t": None if measure is None else
            round(rs.prof.phases["warmup_s"] + rec["sent_s"] - measure, 3),
            "member": rec["label"], "command": ev.command if ev else rec["command"],
            "duration_s": ev.duration_s if ev else 0.0, "rc": rec.get("rc"),
            "reply": rec.get("reply", "")})
        if rec.get("rc") != 0:
            errors.append(f"fault {rec['label']} {rec['command']}: exited {rec.get('rc')}: "
                          f"{rec.get('reply', '')}")
    quiesce(rs, res, info)
    if (res / "bg.rc").is_file():
        rc = int(read_line(res / "bg.rc") or -1)
        info["background"] = {"rc": rc, "error": None if rc == 0 else
                              pair_mod.last_line((res / "bg.stderr").read_text())}
        if (rs.dir / "bg.json.fio.json").is_file():
            err = parse_background(rs)
            if err and info["background"]["error"] is None:
                info["background"]["error"] = err
    if (rs.dir / "probe.raw.json").is_file():
        try:
            pair_mod.probe_document(rs.dir, rs.prof, rs.arm, rs.slot, rs.boot_index)
            info["probe"] = "probe.json"
        except LabError as e:
            errors.append(f"tierprobe's document: {e}")
    elif boot["status"] == "ok":
        errors.append("the guest wrote no probe document")


def quiesce(rs: RunSpec, res: Path, info: dict[str, Any]) -> None:
    """The series from the guest's polls (ctl-end.json, then ctl-qN.json at the
    uptimes in quiesce.txt) with pair.py's own counting."""
    try:
        end = float(read_line(res / "end.up"))
        doc = json.loads((res / "ctl-end.json").read_text())
    except (OSError, ValueError):
        return
    series = [(0.0, pair_mod.device_writes(doc))]
    lines = (res / "quiesce.txt").read_text().split("\n") if (res / "quiesce.txt").is_file() else []
    for line in lines:
        parts = line.split()
        if len(parts) != 2:
            continue
        try:
            doc = json.loads((res / f"ctl-q{parts[0]}.json").read_text())
        except (OSError, ValueError):
            break
        series.append((round(float(parts[1]) - end, 3), pair_mod.device_writes(doc)))
    found = pair_mod.quiet_since(series, rs.prof.quiesce["window_s"])
    info["quiesce"] = series
    info["quiescence_s"] = None if found is None else max(0.0, found)
    info["workload_end_unix"] = info["edges"].get("end")


def parse_background(rs: RunSpec) -> str | None:
    """bg-writer's own parser over fio's json+ from the guest -> bg.json."""
    b = rs.prof.background
    cmd = [sys.executable, str(BG_PARSE), str(rs.dir / "bg.json.fio.json"),
           "--dir", f"{GUEST_MNT}/{b['dir']}", "--out", str(rs.dir / "bg.json"),
           "--pair", str(rs.pair), "--boot", str(rs.boot_index), "--seed", str(rs.seed),
           "--fault-profile", rs.prof.name, "--label", f"slot={rs.slot}"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=PARSE_TIMEOUT)
    except subprocess.TimeoutExpired:
        return f"bg-writer/parse.py: no answer within {PARSE_TIMEOUT:g} s"
    return None if p.returncode == 0 else f"bg-writer/parse.py: {pair_mod.last_line(p.stderr)}"


def fsck(rs: RunSpec) -> dict[str, Any]:
    """`tierfs fsck -n` over the boot's member images, on the host, after QEMU."""
    imgs = [str(rs.images / f"{m.label}.img") for m in rs.prof.members]
    try:
        p = subprocess.run([rs.arm.tierfs, "fsck", "-n", *imgs], capture_output=True, text=True,
                           timeout=FSCK_TIMEOUT, start_new_session=True)
        out, rc = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired:
        out, rc = f"tierfs fsck: no answer within {FSCK_TIMEOUT:g} s (killed)\n", None
    (rs.dir / "fsck.txt").write_text(out)
    return {"rc": rc, "clean": rc == 0, "last": pair_mod.last_line(out)}


def read_line(path: Path) -> str:
    try:
        return path.read_text().strip().split("\n")[0][:300]
    except OSError:
        return ""


# ------------------------------------------------------------------ the lab

class VmLab:
    def __init__(self, args: argparse.Namespace, pairs: int) -> None:
        self.prof = profile_mod.load(args.profile, args.set)
        if pairs < 1 or pairs > 1000:
            raise LabError(f"--pairs: want 1..1000, got {pairs}")
        self.pairs = pairs
        self.seed = args.seed if args.seed is not None else self.prof.seed
        if self.seed < 0:
            raise LabError(f"--seed: must be >= 0, got {self.seed}")
        if args.cpus < 1 or args.mem < 256:
            raise LabError("--cpus must be at least 1, --mem at least 256")
        timeout = args.timeout if args.timeout is not None else boot_timeout(self.prof)
        if timeout <= 0:
            raise LabError("--timeout must be positive")
        self.vm = VmSettings(args.cpus, args.mem, timeout, args.accel, args.budget)
        self.build = pair_mod.default_build()
        for m in self.prof.members:
            if len(m.label) > vmboot.SERIAL_MAX:
                raise LabError(f"member label '{m.label}' is longer than {vmboot.SERIAL_MAX} "
                               "bytes (the virtio serial)")
        if shutil.which(vmboot.QEMU) is None:
            raise LabError(f"{vmboot.QEMU} is not installed: run scripts/install-deps lab")
        if not (self.build / "bin" / "faultdev").is_file():
            raise LabError(f"{self.build}/bin/faultdev: missing (make build)")
        if self.prof.background["workload"] == "bg-writer" and self.prof.background["rate"] == "":
            raise LabError(f"{self.prof.name}: background.rate is empty")
        self.out = Path(args.out)
        if self.out.exists() and any(self.out.iterdir()):
            raise LabError(f"--out {self.out}: not empty (each run gets its own directory)")
        shm = Path(args.shm).resolve()
        if not shm.is_dir():
            raise LabError(f"--shm {shm}: no such directory")
        self.shm = shm
        self.root = shm / f"tierlab-vm-{os.getpid()}"
        self.cancel = threading.Event()

    def check_memory(self, slots: int) -> None:
        need = slots * (self.prof.slot_bytes() + (self.vm.mem_mib << 20))
        st = os.statvfs(self.shm)
        avail = min(st.f_bavail * st.f_frsize, pair_mod._mem_available())
        if need > 0.7 * avail:
            raise LabError(f"{slots} slot(s) need {need >> 20} MiB of RAM for images and guests, "
                           f"{avail >> 20} MiB available: shrink the members or --mem")

    def image(self, static_build: Path | None) -> vmimage.Image:
        def log(msg: str) -> None:
            print(f"tierlab vm: {msg}", flush=True)
        opts = vmimage.Options(log=log)
        if static_build is not None:
            opts.static_bin = static_build / "bin"
        return vmimage.ensure(opts)

    def slot_images(self, slot: int) -> Path:
        s = pair_mod.Slot(slot, self.root / f"slot{slot}")
        pair_mod.write_images(s, self.prof)
        return s.root

    def run_spec(self, arm: pair_mod.Arm, image: vmimage.Image, pair: int, slot: int,
                 run_dir: Path) -> RunSpec:
        return RunSpec(self.prof, arm, image, pair, slot, self.seed + pair,
                       self.root / f"slot{slot}", run_dir, self.vm, self.build, self.cancel)

    def cleanup(self, threads: list[threading.Thread]) -> None:
        self.cancel.set()
        end = time.monotonic() + CANCEL_JOIN_S
        for t in threads:
            t.join(timeout=max(0.0, end - time.monotonic()))
        shutil.rmtree(self.root, ignore_errors=True)


def _sigterm_as_interrupt() -> Any:
    old = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    return old


def run_one_cmd(args: argparse.Namespace) -> int:
    lab = VmLab(args, 1)
    if args.pair < 0:
        raise LabError(f"--pair: must be >= 0, got {args.pair}")
    static = Path(args.static_build) if args.static_build else None
    tierfs_build = static if static is not None else lab.build
    arm = pair_mod.Arm(args.arm, tierfs_build, args.arm == "control")
    if not Path(arm.tierfs).is_file():
        raise LabError(f"{arm.tierfs}: no tierfs there (for the host's fsck)")
    lab.check_memory(1)
    image = lab.image(static)
    lab.out.mkdir(parents=True, exist_ok=True)
    old = _sigterm_as_interrupt()
    try:
        lab.slot_images(args.slot)
        info = run_one(lab.run_spec(arm, image, args.pair, args.slot, lab.out))
    finally:
        lab.cleanup([])
        signal.signal(signal.SIGTERM, old)
    fs = info["fsck"] or {}
    print(f"tierlab vm run: {info['arm']} {info['status']}"
          + (f" ({info['error']})" if info["error"] else "")
          + f"; quiescence {info['quiescence_s']} s; fsck "
          + ("clean" if fs.get("clean") else f"NOT CLEAN ({fs.get('last')})")
          + f"; {info['wall_s']:.0f} s -> {lab.out}", flush=True)
    return 0 if info["status"] == "ok" and fs.get("clean") else 1


def run_pairs_cmd(args: argparse.Namespace) -> int:
    lab = VmLab(args, args.pairs)
    arms, mode = pair_mod.parse_arms(args, lab.build)
    for a in arms:
        if not Path(a.tierfs).is_file():
            raise LabError(f"{a.tierfs}: no tierfs there (build it, or give the build dir)")
    lab.check_memory(2)
    # One image per build: active,control share the default static build's.
    by_build: dict[str, vmimage.Image] = {}
    images: dict[str, vmimage.Image] = {}
    for a in arms:
        static = a.build if mode == "builds" else None
        if str(static) not in by_build:
            by_build[str(static)] = lab.image(static)
        images[a.name] = by_build[str(static)]
    lab.out.mkdir(parents=True, exist_ok=True)
    (lab.out / "profile.toml").write_text(Path(lab.prof.path).read_text())
    meta = pair_mod.lab_meta(args, lab.prof, lab.pairs, lab.seed, mode, arms, lab.build)
    meta["vm"] = {"accel": lab.vm.accel, "cpus": lab.vm.cpus, "mem_mib": lab.vm.mem_mib,
                  "timeout_s": lab.vm.timeout,
                  "images": {name: im.key for name, im in images.items()}}
    (lab.out / "lab.json").write_text(json.dumps(meta, indent=1) + "\n")
    old = _sigterm_as_interrupt()
    t0 = time.time()
    results: list[dict[str, Any]] = []
    threads: list[threading.Thread] = []
    try:
        for s in range(2):
            lab.slot_images(s)
        for i in range(lab.pairs):
            # pair i: arm 0 in slot i % 2, so each arm takes each slot in turn
            order = [arms[0], arms[1]] if i % 2 == 0 else [arms[1], arms[0]]
            specs = [lab.run_spec(order[s], images[order[s].name], i, s,
                                  lab.out / "runs" / f"p{i:02d}-{order[s].name}") for s in range(2)]
            got: list[dict[str, Any]] = [{}, {}]

            def one(k: int) -> None:
                got[k] = run_one(specs[k])
            threads = [threading.Thread(target=one, args=(k,), daemon=True) for k in range(2)]
            print(f"tierlab vm pair: pair {i + 1}/{lab.pairs}: slot 0 {order[0].name}, "
                  f"slot 1 {order[1].name}", flush=True)
            for t in threads:
                t.start()
            for t in threads:
                while t.is_alive():
                    t.join(timeout=0.5)
            for k, info in enumerate(got):
                if not info:  # run_one itself failed: a bug; record it, go on
                    info = {"pair": i, "arm": order[k].name, "slot": k, "status": "failed",
                            "error": "the run's thread ended without a result"}
                    (specs[k].dir / "run.json").write_text(json.dumps(info, indent=1) + "\n")
                results.append(info)
                b = info.get("boot") or {}
                line = (f"tierlab vm pair: pair {i + 1} {info['arm']} (slot {k}): {info['status']}, "
                        f"boot {b.get('wall_s', '-')} s, fsck "
                        + ("clean" if (info.get("fsck") or {}).get("clean") else "NOT CLEAN"))
                if info["status"] != "ok":
                    line += f": {info['error']}"
                print(line, file=sys.stderr if info["status"] != "ok" else sys.stdout, flush=True)
    except KeyboardInterrupt:
        lab.cleanup(threads)
        raise
    finally:
        lab.cleanup(threads)
        signal.signal(signal.SIGTERM, old)
    return pair_mod.finish_lab("tierlab vm pair", lab.out, meta, results, t0, args.no_report)
