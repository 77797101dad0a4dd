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
pair directory unchanged. The profile's [vm] table sets the guest's memory and
CPUs, a member the guest swaps on (no tierfs member) and a memory hog; every
run.json also carries the guest's memory counters, OOM kills, the probe's
liveness and the runner's last step (guestmem.py).

Invariants: a boot never outlives its hard timeout (vmboot kills it), and the
job's budget covers every bounded step of the guest's runner (guest_bounds);
a boot that fails or hangs is a failed run, and the lab goes on; an OOM kill
in the guest fails its run; Ctrl-C cancels both guests and removes the
images."""

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

from tierlab import REPO_ROOT, LabError, guestmem, vmboot, vmimage, vmlibvirt
from tierlab import pair as pair_mod
from tierlab import profile as profile_mod

GUEST_RUNNER = REPO_ROOT / "vmlab" / "guest" / "profile-run"
BG_JOB = REPO_ROOT / "workloads" / "bg-writer" / "bgwrite.fio"
BG_PARSE = REPO_ROOT / "workloads" / "bg-writer" / "parse.py"
GUEST_MNT = "/mnt/lab"
# The guest runner's own bounds (vmlab/guest/profile-run; the rest are pair.py's).
GUEST_CTL_TIMEOUT_S = 20.0     # each `tierfs ctl`, and mkdir on the mount
GUEST_SWAP_TIMEOUT_S = 60.0    # mkswap, swapon each
# swapoff reads back all that is swapped (mem-pressure: 75-78 MiB in 18-25 s
# at 10 ms per request): 60 s and the whole swap member at 2 MiB/s.
GUEST_SWAPOFF_MIB_PER_S = 2.0
GUEST_HOG_MOUNT_S = 30.0       # the hog's tmpfs's mount
# Filling the hog's tmpfs before the workload starts (mem-pressure: 320 MiB
# in a 448 MiB guest, 3.6-4.4 s measured on 2026-12-04 with nothing else
# running yet; 180 s leaves room for a slow swap member and a loaded host).
GUEST_HOG_FILL_S = 180.0
GUEST_HOG_STOP_S = 30.0        # the hog's exit after its kill; then its tmpfs's unmount
GUEST_RM_TIMEOUT_S = 60.0      # rm -rf of the background files (background.keep = false)
GUEST_CLEANUP_UMOUNT_S = 20.0  # a failed run's unmount before umount -l
GUEST_LIVE_CHECK_S = 10.0      # a hung probe: does the mount still answer a readdir?
GUEST_KILL_GRACE_S = 5.0       # `timeout -k`: KILL this long after TERM
# The job's commands between its bounded steps (awk, cp, sleep, the snapshots)
# on a loaded TCG guest under memory pressure.
GUEST_BUDGET_MARGIN_S = 60.0
# Outside the job's budget: boot to the job's start (6-10 s measured under TCG)
# and the results after it; vmboot's default budget is the timeout minus this.
BOOT_OVERHEAD_S = 60.0
# A guest's CPUs and memory when neither the command line nor the profile's
# [vm] table sets them.
DEFAULT_CPUS = 1
DEFAULT_MEM_MIB = 1536
FSCK_TIMEOUT = 300.0
PARSE_TIMEOUT = 60.0
CANCEL_JOIN_S = 30.0
UNIX_PATH_MAX = 107   # sockaddr_un's sun_path less its NUL
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
    backend: str = "qemu"        # vmboot's backend: qemu | libvirt
    connect: tuple[str, ...] = ()   # libvirt: the URIs the pairs fan out over

    def uri(self, pair: int) -> str | None:
        """Pair i's libvirt URI: the i-th in turn (both slots of a pair on one host)."""
        return self.connect[pair % len(self.connect)] if self.connect else None


def add_vm_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", default="fixed-delay", help="lab profile name or path "
                   "(workloads/profiles/; default fixed-delay)")
    p.add_argument("--out", required=True, metavar="DIR", help="results directory (new or empty)")
    p.add_argument("--seed", type=int, help="base seed (default: the profile's); pair i uses S+i")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a profile key (repeatable)")
    p.add_argument("--timeout", type=float, metavar="S", help="hard limit of each boot "
                   f"(default: the guest runner's step bounds, vmpair.guest_bounds, + {BOOT_OVERHEAD_S:g} s)")
    p.add_argument("--cpus", type=int, help="CPUs of each guest (default: the profile's vm.cpus, "
                   f"else {DEFAULT_CPUS}: two guests share the host's cores)")
    p.add_argument("--mem", type=int, metavar="MiB", help="memory of each guest (default: the "
                   f"profile's vm.mem_mib, else {DEFAULT_MEM_MIB})")
    p.add_argument("--budget", type=float, metavar="S",
                   help="the job's own limit inside the guest (default: the timeout minus 60 s)")
    p.add_argument("--accel", choices=("auto", "kvm", "tcg"), default="auto",
                   help="auto: KVM when /dev/kvm opens, else TCG")
    vmlibvirt.add_backend_args(p)
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
        "MEMBERS": " ".join(devs[m.label] for m in prof.fs_members()),
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
        "SWAP": devs[prof.vm["swap"]] if prof.vm.get("swap") else "",
        "HOG_BYTES": str(prof.vm.get("hog", 0)),
        "FORMAT_TIMEOUT_S": f"{pair_mod.FORMAT_TIMEOUT:g}",
        "CTL_TIMEOUT_S": f"{GUEST_CTL_TIMEOUT_S:g}",
        "SWAP_TIMEOUT_S": f"{GUEST_SWAP_TIMEOUT_S:g}",
        "SWAPOFF_TIMEOUT_S": f"{swapoff_timeout(prof):g}",
        "HOG_MOUNT_S": f"{GUEST_HOG_MOUNT_S:g}", "HOG_FILL_S": f"{GUEST_HOG_FILL_S:g}",
        "HOG_STOP_S": f"{GUEST_HOG_STOP_S:g}", "KILL_GRACE_S": f"{GUEST_KILL_GRACE_S:g}",
        "RM_TIMEOUT_S": f"{GUEST_RM_TIMEOUT_S:g}",
        "CLEANUP_UMOUNT_S": f"{GUEST_CLEANUP_UMOUNT_S:g}",
        "LIVE_CHECK_S": f"{GUEST_LIVE_CHECK_S:g}",
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
    # vm pair: both runs of a pair meet here after their boots, so that one
    # run's host fsck does not compete with the other guest's measured phase.
    booted: threading.Barrier | None = None

    @property
    def boot_index(self) -> int:
        return 2 * self.pair + self.slot


def guest_bounds(prof: profile_mod.Profile) -> dict[str, float]:
    """Each step of vmlab/guest/profile-run (its `step NAME`s) with its bound
    in seconds, as the header gives them (a `timeout -k` step counts its KILL
    grace too), and `fail`, a failure's own steps. Their sum is the least the
    job's budget must be."""
    k = GUEST_KILL_GRACE_S
    ctl = GUEST_CTL_TIMEOUT_S + k
    b, q = prof.background, prof.quiesce
    steps: dict[str, float] = {}
    if prof.vm.get("swap"):
        steps["swapon"] = 2 * (GUEST_SWAP_TIMEOUT_S + k)     # mkswap, swapon
    steps.update({"format": pair_mod.FORMAT_TIMEOUT + k, "mount": pair_mod.MOUNT_TIMEOUT,
                  "pause": ctl, "start": ctl, "probe-start": pair_mod.READY_TIMEOUT,
                  # the sleeps to the measure and end edges; `measure` is its ctl
                  "warmup": prof.workload_s, "measure": ctl})
    if prof.vm.get("hog"):
        steps["hog-fill"] = GUEST_HOG_MOUNT_S + k + GUEST_HOG_FILL_S
        steps["hog-stop"] = 2 * GUEST_HOG_STOP_S + 2 * k     # TERM wait, KILL wait, umount
    if b["workload"] == "bg-writer":
        steps["bg-start"] = ctl                               # mkdir on the mount
        steps["bg-wait"] = pair_mod.BG_SLACK_S
        if not b["keep"]:
            steps["bg-rm"] = GUEST_RM_TIMEOUT_S + k
    steps["probe-wait"] = pair_mod.PROBE_SLACK_S
    steps["end"] = ctl
    steps["quiesce"] = q["max_s"] + 1 + ctl                   # the last poll starts before max_s
    steps["umount"] = pair_mod.UMOUNT_TIMEOUT + k
    steps["daemon-exit"] = pair_mod.UMOUNT_TIMEOUT
    if prof.vm.get("swap"):
        steps["swapoff"] = swapoff_timeout(prof) + k
    # a failure on the way: the liveness check, the cleanup's hog stop,
    # unmount and swapoff
    steps["fail"] = GUEST_LIVE_CHECK_S + k + GUEST_CLEANUP_UMOUNT_S + k
    if prof.vm.get("hog"):
        steps["fail"] += 2 * GUEST_HOG_STOP_S + 2 * k
    if prof.vm.get("swap"):
        steps["fail"] += swapoff_timeout(prof) + k
    return steps


def swapoff_timeout(prof: profile_mod.Profile) -> float:
    m = prof.member(prof.vm.get("swap") or "")
    return 0.0 if m is None else 60.0 + round((m.size >> 20) / GUEST_SWAPOFF_MIB_PER_S)


def guest_budget(prof: profile_mod.Profile) -> float:
    """The job's budget: every step's bound and a margin for what runs between."""
    return sum(guest_bounds(prof).values()) + GUEST_BUDGET_MARGIN_S


def boot_timeout(prof: profile_mod.Profile) -> float:
    """The hard limit of a boot: the job's budget and the boot around it (with
    vmboot's default budget, the timeout minus BOOT_OVERHEAD_S, that is
    guest_budget)."""
    return guest_budget(prof) + BOOT_OVERHEAD_S


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
        events_after="measure", cancel=rs.cancel, backend=rs.vm.backend,
        shm=rs.images.parent,  # the boot's private directory beside the images (--shm)
        connect=rs.vm.uri(rs.pair))
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
        try:  # apart: an OOM kill is the first error even when the results were cut short
            memory(rs, rs.dir / "boot" / "results", info, errors)
        except Exception as e:
            errors.append(f"results (memory): {type(e).__name__}: {e}")
    if rs.booted is not None:
        try:
            rs.booted.wait(timeout=rs.vm.timeout + vmboot.SERVE_READY_S + vmboot.KILL_WAIT_S
                           + vmboot.SERVER_STOP_S + 60)
        except threading.BrokenBarrierError:
            pass  # the other run ended without a boot; fsck anyway
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
    # What the guest ran (the host's `build` above is what fsck used).
    info["guest_tierfs"] = rs.image.source("tierfs")
    info["guest_tierprobe"] = rs.image.source("tierprobe")
    info["boot"] = {"index": rs.boot_index, "status": boot["status"], "reason": boot["reason"],
                    "times": times, "image": boot["image"]["key"], "accel": boot["accel"],
                    "cpus": boot["cpus"], "mem_mib": boot["mem_mib"],
                    "timeout_s": boot["timeout_s"], "wall_s": boot.get("wall_s"),
                    "backend": boot.get("backend"), "connect": boot.get("connect")}
    for edge in ("start", "workload", "measure", "end", "idle"):
        if f"mark_{edge}" in times:
            info["edges"][edge] = round(q0 + times[f"mark_{edge}"], 3)
    if "workload" in info["edges"]:
        info["t0_unix"] = info["edges"]["workload"]
    # The runner's last step: where a job cut by its budget, or a guest the
    # host killed, was.
    info["step"] = guestmem.guest_step(res, bdir / "console.log") or None
    if boot["status"] != "ok":
        err = read_line(res / "error.txt")
        what = "boot timeout" if boot["status"] == "timeout" else "boot failed"
        errors.append(err or f"{what}: {boot['reason']}"
                      + (f" in step '{info['step']}'" if info["step"] else ""))
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


def memory(rs: RunSpec, res: Path, info: dict[str, Any], errors: list[str]) -> None:
    """run.json's vmstat, oom, hog and liveness (guestmem). An OOM kill in the
    guest is the run's first error (whatever failed after it, it is why); a
    hog that could not fill its tmpfs is an error too."""
    vm = guestmem.vmstat(res)
    if vm is not None:
        info["vmstat"] = vm
    o = guestmem.oom(res, vm)
    info["oom"] = o
    if o is not None and o["kills"]:
        errors.insert(0, guestmem.oom_error(o))
    h = guestmem.hog(res, rs.prof.vm.get("hog", 0))
    if h is not None:
        info["hog"] = h
        if h["error"]:
            errors.append(f"hog: {h['error']}")
        elif not h["started"] and not errors:
            # Nothing else went wrong, yet the runner never got to it.
            errors.append("hog: the guest's runner never started it")
    if (rs.dir / "probe.json").is_file():
        try:
            info["liveness"] = guestmem.liveness(json.loads((rs.dir / "probe.json").read_text()),
                                                 rs.prof.phases["measure_s"])
        except (OSError, ValueError):
            pass


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
    """`tierfs fsck -n` over the boot's member images, on the host, after QEMU.
    Ctrl-C (rs.cancel) stops it, or skips it when it comes first."""
    imgs = [str(rs.images / f"{m.label}.img") for m in rs.prof.fs_members()]
    if rs.cancel is not None and rs.cancel.is_set():
        out, rc = "tierfs fsck: not run (cancelled)\n", None
    else:
        p = subprocess.Popen([rs.arm.tierfs, "fsck", "-n", *imgs], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
        deadline = time.monotonic() + FSCK_TIMEOUT
        try:
            while True:
                try:
                    out, _ = p.communicate(timeout=0.5)
                    rc = p.returncode
                    break
                except subprocess.TimeoutExpired:
                    why = ("cancelled" if rs.cancel is not None and rs.cancel.is_set() else
                           f"no answer within {FSCK_TIMEOUT:g} s" if time.monotonic() > deadline
                           else None)
                    if why:
                        vmboot.signal_group(p, signal.SIGKILL)
                        p.communicate()
                        out, rc = f"tierfs fsck: {why} (killed)\n", None
                        break
        except BaseException:
            # Ctrl-C in `vm run` (no cancel event there) or any other way out:
            # the fsck must not outlive us.
            vmboot.signal_group(p, signal.SIGKILL)
            p.wait()
            raise
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
        # The command line, else the profile's [vm], else the defaults.
        cpus = args.cpus if args.cpus is not None else self.prof.vm["cpus"] or DEFAULT_CPUS
        mem = args.mem if args.mem is not None else self.prof.vm["mem_mib"] or DEFAULT_MEM_MIB
        if cpus < 1 or mem < 256:
            raise LabError("--cpus must be at least 1, --mem at least 256")
        if self.prof.vm["hog"] and self.prof.vm["hog"] >= mem << 20:
            raise LabError(f"{self.prof.name}: vm.hog ({profile_mod.size_text(self.prof.vm['hog'])}) "
                           f"is not below the guest's memory ({mem} MiB)")
        timeout = args.timeout if args.timeout is not None else boot_timeout(self.prof)
        if timeout <= 0:
            raise LabError("--timeout must be positive")
        self.vm = VmSettings(cpus, mem, timeout, args.accel, args.budget, args.backend,
                             tuple(vmlibvirt.backend_uris(args, several=True)))
        self.build = pair_mod.default_build()
        for m in self.prof.members:
            if len(m.label) > vmboot.SERIAL_MAX:
                raise LabError(f"member label '{m.label}' is longer than {vmboot.SERIAL_MAX} "
                               "bytes (the virtio serial)")
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
        # The boots' unix sockets live under it: ROOT/tierlab-vm-XXXXXXXX/LABEL.sock.ctl
        longest = len(str(self.root)) + len("/tierlab-vm-XXXXXXXX/.sock.ctl") + max(
            [len(m.label) for m in self.prof.members] + [len("console")])
        if longest > UNIX_PATH_MAX:
            raise LabError(f"--shm {shm}: too long a path for the unix sockets under it "
                           f"({longest} > {UNIX_PATH_MAX} bytes)")
        self.cancel = threading.Event()

    def check_tools(self, slots: int) -> None:
        """After the command line's own mistakes: QEMU, faultdev, and RAM for
        `slots` slots."""
        if shutil.which(vmboot.QEMU) is None:
            raise LabError(f"{vmboot.QEMU} is not installed: run scripts/install-deps lab")
        if not (self.build / "bin" / "faultdev").is_file():
            raise LabError(f"{self.build}/bin/faultdev: missing (make build)")
        self.check_memory(slots)

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
            # tierfs from that build; tierprobe, the instrument, from the
            # default static build in every arm (as tierlab pair uses one).
            opts.static_bin = static_build / "bin"
            opts.probe_from_default = True
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
    lab.check_tools(1)
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
    mem = memory_line(info)
    if mem:
        print(f"tierlab vm run: {mem}", flush=True)
    return 0 if info["status"] == "ok" and fs.get("clean") else 1


def memory_line(info: dict[str, Any]) -> str:
    """One line of what run.json says about the guest's memory and the probe."""
    parts = []
    if info.get("liveness"):
        parts.append(info["liveness"]["text"])
    m = (info.get("vmstat") or {}).get("measured")
    if m:
        parts.append(f"measured phase: swap in {m['pswpin']} / out {m['pswpout']} pages "
                     f"({m['pswpin_per_s']} / {m['pswpout_per_s']} per s), pgscan direct "
                     f"{m['pgscan_direct']}, allocstall {m['allocstall']}, oom_kill {m['oom_kill']}")
    h = info.get("hog")
    if h:
        parts.append(f"hog {h['bytes'] >> 20} MiB: " + (f"error {h['error']}" if h["error"] else
                     f"{h['passes']} passes, {h['chunks']} chunks rewritten"
                     + (f", filled in {h['fill_s']} s" if h["filled"] else ", still filling")))
    return "; ".join(parts)


def run_pairs_cmd(args: argparse.Namespace) -> int:
    lab = VmLab(args, args.pairs)
    arms, mode = pair_mod.parse_arms(args, lab.build)
    for a in arms:
        if not Path(a.tierfs).is_file():
            raise LabError(f"{a.tierfs}: no tierfs there (build it, or give the build dir)")
    lab.check_tools(2)
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
                  "timeout_s": lab.vm.timeout, "backend": lab.vm.backend,
                  "connect": list(lab.vm.connect),
                  "images": {name: im.key for name, im in images.items()}}
    (lab.out / "lab.json").write_text(json.dumps(meta, indent=1) + "\n")
    old = _sigterm_as_interrupt()
    t0 = time.time()
    results: list[dict[str, Any]] = []
    threads: list[threading.Thread] = []
    booted: threading.Barrier | None = None
    try:
        for s in range(2):
            lab.slot_images(s)
        for i in range(lab.pairs):
            # pair i: arm 0 in slot i % 2, so each arm takes each slot in turn
            order = [arms[0], arms[1]] if i % 2 == 0 else [arms[1], arms[0]]
            specs = [lab.run_spec(order[s], images[order[s].name], i, s,
                                  lab.out / "runs" / f"p{i:02d}-{order[s].name}") for s in range(2)]
            booted = threading.Barrier(2)
            for sp in specs:
                sp.booted = booted
            got: list[dict[str, Any]] = [{}, {}]

            def one(k: int, barrier: threading.Barrier = booted) -> None:
                try:
                    got[k] = run_one(specs[k])
                except BaseException:
                    # Ended before (or without) the barrier: release the
                    # other run's wait at once instead of at its timeout.
                    barrier.abort()
                    raise
            threads = [threading.Thread(target=one, args=(k,), daemon=True) for k in range(2)]
            print(f"tierlab vm pair: pair {i + 1}/{lab.pairs}: slot 0 {order[0].name}, "
                  f"slot 1 {order[1].name}"
                  + (f" on {lab.vm.uri(i)}" if lab.vm.connect else ""), flush=True)
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
        if booted is not None:
            booted.abort()
        lab.cleanup(threads)
        raise
    finally:
        lab.cleanup(threads)
        signal.signal(signal.SIGTERM, old)
    return pair_mod.finish_lab("tierlab vm pair", lab.out, meta, results, t0, args.no_report)
