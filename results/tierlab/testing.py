"""Helpers for the lab's tests: where the built tools are, synthetic results
documents with known content, and running a command to check its one-line errors.
Not used outside tests."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from tierlab import REPO_ROOT
from tierlab.hist import Histogram


def build_dir() -> Path:
    return Path(os.environ.get("TIERFS_BUILD", REPO_ROOT / "build"))


def tool(name: str) -> Path:
    """A built tool in build/bin; fails the test (not skips) when it is missing."""
    import pytest

    p = build_dir() / "bin" / name
    if not p.exists():
        pytest.fail(f"{p} is missing: build first (make), or set TIERFS_BUILD")
    return p


def run(cmd: Sequence[str | Path], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)


def assert_one_line_error(proc: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def synthetic_run(*, seed: int, arm: str = "other", pair: int | None = None, scale: float = 1.0,
                  ops: Sequence[str] = ("read", "write"), n: int = 5000, seconds: int = 5,
                  rate: float | None = None, fell_behind: bool = False,
                  with_series: bool = True, tail: tuple[float, float] | None = None) -> dict[str, Any]:
    """A valid results document whose latencies are lognormal (median 100 us x
    `scale`), so tests know what a report must find. `tail` = (delay_ns,
    fraction) adds delay_ns to a seeded `fraction` of each op's samples, as
    tierprobe --inject-delay plants a slowdown."""
    rng = np.random.default_rng(seed)
    hists = {}
    every = []
    for op in ops:
        samples = rng.lognormal(np.log(100e3 * scale), 0.6, size=n)
        if tail is not None:
            delay_ns, fraction = tail
            samples = samples + np.where(rng.random(n) < fraction, delay_ns, 0.0)
        hists[op] = Histogram.from_samples(samples)
        every.extend(samples)
    all_h = Histogram.from_samples(every)
    points = []
    chunk = np.array_split(np.asarray(every), seconds)
    for t, part in enumerate(chunk):
        h = Histogram.from_samples(part)
        points.append({"t": t, "phase": "measure", "count": h.count, "p50_ns": h.quantile(0.5),
                       "p99_ns": h.quantile(0.99), "p999_ns": h.quantile(0.999), "max_ns": h.max})
    total = all_h.count
    meas: dict[str, Any] = {
        "ops": {op: {"latency": h.to_json(), "service": h.to_json()}
                for op, h in {**hists, "all": all_h}.items()},
        "throughput": {"ops": total, "seconds": seconds, "ops_per_s": total / seconds,
                       "target_ops_per_s": rate if rate is not None else total / seconds},
        "counters": {"fell_behind": 1 if fell_behind else 0},
    }
    if with_series:
        meas["timeseries"] = {"interval_s": 1, "of": "latency", "points": points}
    return {
        "format": "tierfs-results", "version": 1,
        "manifest": {
            "producer": "synthetic", "workload": "tierprobe", "tool_versions": {"synthetic": "1"},
            "git_commit": "unknown", "host": {"hostname": "h", "cpus": 2, "memory_bytes": 1},
            "kernel": {"release": "6.1", "version": "#1", "machine": "x86_64"},
            "filesystem": {"path": "/mnt", "mount_point": "/mnt", "type": "tmpfs",
                           "source": "tmpfs", "options": "rw"},
            "device_layout": None, "fault_profile": "none", "seed": seed,
            "start": "2026-01-01T00:00:00.000Z", "end": "2026-01-01T00:00:05.000Z",
            "arm": arm, "pair": pair, "boot": None},
        "measurements": meas,
    }


def ctl_doc(io_by_member: dict[str, dict[str, dict[str, tuple[int, int]]]]) -> dict[str, Any]:
    """A `tierfs ctl` document with per-origin counters: member label -> origin ->
    op -> (ops, bytes). The group is the label's part before the dot."""
    devices = []
    for label, origins in io_by_member.items():
        io = {o: {op: {"ops": n, "bytes": b} for op, (n, b) in ops.items()}
              for o, ops in origins.items()}
        for v in io.values():
            v.update({"errors": 0, "service_p50_ns": 1000})
        devices.append({"label": label, "group": label.split(".")[0], "io": io})
    return {"devices": devices}


def synthetic_pair_dir(d: Path, *, pairs: int = 4, profile: str = "fixed-delay",
                       b_scale: float = 1.0, arms: tuple[str, str] = ("control", "active"),
                       b_hdd_extra: dict[str, dict[str, tuple[int, int]]] | None = None,
                       hdd_during: dict[str, dict[str, tuple[int, int]]] | None = None,
                       background_bytes: int = 128 << 20, quiescence: float | None = 5.0,
                       b_max_ns: int | None = None, a_max_ns: int | None = None,
                       fail_run: str | None = None, dirty_run: str | None = None,
                       errors_run: str | None = None,
                       events: list[dict[str, Any]] | None = None, sets: list[str] | None = None,
                       ) -> Path:
    """A `tierlab pair` output directory with known content: arm B's latencies
    scaled by b_scale, slow-member I/O during the foreground phases `hdd_during`
    (both arms) plus `b_hdd_extra` (arm B only), background writes of
    `background_bytes` between end and idle, and optional planted failures (run
    names like "p01-active"; errors_run: 3 failed reads in its probe counters)."""
    import json

    from tierlab import profile as profile_mod
    from tierlab import schema
    from tierlab.hist import Histogram

    prof = profile_mod.load(profile)
    d.mkdir(parents=True, exist_ok=True)
    (d / "profile.toml").write_text(Path(prof.path).read_text())
    (d / "lab.json").write_text(json.dumps({
        "format": "tierlab-pair", "version": 1, "profile": prof.name, "sets": sets or [],
        "pairs": pairs, "seed": 1, "mode": "arms",
        "arms": [{"name": a, "build": "/b", "pause": a == "control"} for a in arms],
        "wall_s": 1.0}))
    hdd = prof.slow_members()[0].label
    for i in range(pairs):
        for k, arm in enumerate(arms):
            name = f"p{i:02d}-{arm}"
            run = d / "runs" / name
            run.mkdir(parents=True)
            is_b = k == 1
            doc = synthetic_run(seed=1000 * i + 17 * k, arm=arm if arm in ("active", "control")
                                else "other", pair=i, scale=b_scale if is_b else 1.0)
            doc["manifest"]["arm"] = arm
            doc["manifest"]["slot"] = (i + k) % 2
            doc["manifest"]["start"] = f"2026-01-01T00:{i:02d}:00.000Z"
            doc["manifest"]["end"] = f"2026-01-01T00:{i:02d}:05.000Z"
            big = b_max_ns if is_b else a_max_ns
            if big is not None:
                for op in ("all", "read"):
                    h = Histogram.from_json(doc["measurements"]["ops"][op]["latency"])
                    h.record(big)
                    doc["measurements"]["ops"][op]["latency"] = h.to_json()
            if name == errors_run:
                doc["measurements"]["counters"].update({"errors": 3, "errors_read": 3})
            schema.write(doc, run / "probe.json")
            during = {o: dict(v) for o, v in (hdd_during or {}).items()}
            if is_b:
                for o, v in (b_hdd_extra or {}).items():
                    during.setdefault(o, {}).update(v)
            start = ctl_doc({"ssd.a": {"journal": {"write": (10, 40960)}}, hdd: {}})
            end = ctl_doc({"ssd.a": {"journal": {"write": (900, 3686400)}}, hdd: during})
            idle_hdd = {o: dict(v) for o, v in during.items()}
            idle_hdd.setdefault("reconcile", {})["write"] = (
                background_bytes >> 20, background_bytes)
            idle = ctl_doc({"ssd.a": {"journal": {"write": (950, 3891200)}}, hdd: idle_hdd})
            for edge, c in (("start", start), ("measure", start), ("end", end), ("idle", idle)):
                (run / f"ctl-{edge}.json").write_text(json.dumps(c))
            failed = name == fail_run
            info = {"pair": i, "arm": arm, "slot": (i + k) % 2, "seed": 1 + i, "build": "/b",
                    "status": "failed" if failed else "ok",
                    "error": "tierprobe: still running 120 s past its end (hung; killed)"
                    if failed else None,
                    "events": [dict(e, probe_t=e["at_s"] + 5) for e in (events or [])],
                    "quiescence_s": quiescence, "wall_s": 60,
                    "fsck": {"rc": 4 if name == dirty_run else 0, "clean": name != dirty_run,
                             "last": "errors left" if name == dirty_run else "clean"}}
            (run / "run.json").write_text(json.dumps(info))
    return d


def guest_image() -> Any:
    """The VM lab's guest image for a test that boots guests (built or taken
    from the cache); skips the test, saying why, only where QEMU is missing or
    the image cannot be built."""
    import pytest
    from tierlab import LabError, vmboot, vmimage
    if shutil.which(vmboot.QEMU) is None:
        pytest.skip("qemu-system-x86_64 is not installed (scripts/install-deps lab brings it)")
    try:
        return vmimage.ensure(vmimage.Options())
    except LabError as e:
        pytest.skip(f"the guest image cannot be built: {e}")


# vmboot_test's and vmlibvirt_test's job: tierfs over both members,
# FUSE-mounted; a file written and read back, tierprobe for a few seconds, a
# clean unmount (and the daemon gone) before the init takes the results.
TIERFS_JOB = """\
set -e
tierfs format --label ssd.a /dev/lab/ssd.a --label hdd.b /dev/lab/hdd.b \\
    --foreground-target ssd --background-target hdd
mkdir -p /mnt/t
tierfs mount /dev/lab/ssd.a /dev/lab/hdd.b /mnt/t
cp "$JOB/inputs/payload.bin" /mnt/t/payload.bin
sync
md5sum /mnt/t/payload.bin | cut -d' ' -f1 > "$RESULTS/payload.md5"
echo "hello tierfs" > /mnt/t/hello
cat /mnt/t/hello > "$RESULTS/hello.txt"
mkdir /mnt/t/probe
tierprobe --dir /mnt/t/probe --rate 50 --duration 3s --working-set 4M --files 16 \\
    --json "$RESULTS/probe.json" --quiet
umount /mnt/t
while pidof tierfs > /dev/null; do sleep 0.1; done
echo done > "$RESULTS/done"
"""


def boot_tierfs_job(tmp_path: Path, images_dir: Path, *extra: str | Path) -> tuple[dict[str, Any], Path]:
    """`tierlab vm boot` of TIERFS_JOB on ssd.a and hdd.b (hdd-fixed-10ms) with
    a `stall 1` event, plus `extra` options (a backend); checks what every
    backend must give -- status ok, the results, a stamped console, the event
    sent, fault stats, members fsck-clean on the host. Returns boot.json's
    content and the output directory."""
    import hashlib
    import json
    import re

    job = tmp_path / "job.sh"
    job.write_text(TIERFS_JOB)
    payload = tmp_path / "payload.bin"
    payload.write_bytes(bytes(range(256)) * 1024 * 3)
    out = tmp_path / "boot"
    p = run([tool("tierlab"), "vm", "boot", "--member", "ssd.a=256M", "--member", "hdd.b=512M:hdd-fixed-10ms",
             "--job", job, "--input", payload, "--out", out, "--images", images_dir,
             "--timeout", "400", "--event", "1:hdd.b:stall 1", *extra], timeout=600)
    boot = json.loads((out / "boot.json").read_text())
    console = (out / "console.log").read_text()
    assert p.returncode == 0, (p.stdout, p.stderr, boot["reason"], console[-3000:])
    assert boot["status"] == "ok" and boot["job_rc"] == 0
    assert "boot ok: to /init " in p.stdout

    # Results came back through the results disk.
    r = out / "results"
    assert (r / "done").read_text() == "done\n"
    assert (r / "hello.txt").read_text() == "hello tierfs\n"
    assert (r / "payload.md5").read_text().strip() == hashlib.md5(payload.read_bytes()).hexdigest()
    probe = json.loads((r / "probe.json").read_text())
    assert probe["measurements"]["throughput"]["ops"] > 0, probe["measurements"]["throughput"]
    assert (r / "job.rc").read_text().strip() == "0"
    assert "modules loaded" in (r / "init.log").read_text()

    # The console: every line stamped; the init's steps in order.
    lines = console.splitlines()
    assert lines and all(re.match(r"\[ *\d+\.\d{3}\] ", ln) for ln in lines)
    t = boot["times"]
    assert 0 < t["to_init_s"] <= t["job_start_s"] <= t["job_end_s"] <= t["to_poweroff_s"]
    assert "tierlab-init: results written" in console

    # The members as documented; the event reached the device.
    assert [m["profile"] for m in boot["members"]] == ["passthrough", "hdd-fixed-10ms"]
    assert all(m["serve_rc"] == 0 for m in boot["members"]), boot["members"]
    ev = boot["events"]
    assert len(ev) == 1 and ev[0]["sent"] and ev[0]["rc"] == 0, ev
    stats = json.loads((out / "fault-hdd.b.json").read_text())
    assert stats["ops"]["write"]["ops"] > 0

    # The host checks the members the guest left.
    fsck = run([tool("tierfs"), "fsck", "-n", images_dir / "ssd.a.img", images_dir / "hdd.b.img"], timeout=300)
    assert fsck.returncode == 0, (fsck.stdout, fsck.stderr)
    return boot, out


def hung_pairs(out: Path, *extra: str | Path) -> tuple[subprocess.CompletedProcess[str],
                                                        list[dict[str, Any]]]:
    """`tierlab vm pair` of two pairs of labtest whose guests are killed at a
    12 s boot timeout -- they boot, start the job and are killed in the middle
    of it -- plus `extra` options; checks that the lab went on: exit status 1,
    four failed runs, each a boot timeout, fsck run over each one's images.
    Returns the process and the runs' run.json contents (lab.json's order)."""
    import json

    p = run([tool("tierlab"), "vm", "pair", "--profile", "labtest", "--pairs", "2", "--out", out,
             "--timeout", "12", "--budget", "100000", *extra], timeout=600)
    assert p.returncode == 1, p.stdout[-2000:] + p.stderr
    meta = json.loads((out / "lab.json").read_text())
    assert len(meta["runs"]) == 4  # the second pair ran after the first one's failures
    runs = []
    for rel in meta["runs"]:
        info = json.loads((out / rel / "run.json").read_text())
        assert info["status"] == "failed", rel
        assert info["boot"]["status"] == "timeout", info["boot"]
        assert info["error"].startswith("boot timeout: no poweroff within 12 s"), info["error"]
        assert info["fsck"] is not None  # fsck ran over the killed guest's images
        runs.append(info)
    return p, runs
