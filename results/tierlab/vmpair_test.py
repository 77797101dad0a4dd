"""Tests of lab profiles in QEMU guests (vmpair.py, `tierlab vm run` / `tierlab
vm pair`): mistakes as one-line errors, the guest job made from a profile, and
two real pair runs -- one A/A pair of `labtest` (documents valid, the events
sent, fsck clean on both boots, the gate gives a verdict; its verdict is not
asserted: one pair on a shared 2-core machine decides nothing), and pairs whose
guests are killed at a tiny boot timeout (failed runs, the lab goes on, the gate
fails "runs completed"). The real runs are skipped, saying why, only when
qemu-system-x86_64 is missing or the image cannot be built."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tierlab import schema, vmboot, vmimage, vmpair
from tierlab import pair as pair_mod
from tierlab import profile as profile_mod
from tierlab.testing import assert_one_line_error, hung_pairs, run, tool


# ------------------------------------------------------------------ mistakes

@pytest.mark.parametrize("extra,needle", [
    (["--profile", "no-such-profile"], "profile no-such-profile: no such profile"),
    (["--pairs", "0"], "--pairs: want 1..1000"),
    (["--baseline", "build"], "--baseline and --candidate go together"),
    (["--arms", "active,active"], "--arms: want active,control"),
    (["--set", "probe.nosuch=1"], "probe.nosuch"),
])
def test_pair_mistakes(extra: list[str], needle: str, tmp_path: Path) -> None:
    # (Each comes before the check for QEMU: no skip where it is missing.)
    p = run([tool("tierlab"), "vm", "pair", "--profile", "labtest", "--out", tmp_path / "o", *extra])
    assert_one_line_error(p, 2, "tierlab vm pair: ", needle)
    assert not (tmp_path / "o").exists()


def test_shm_too_long_for_the_sockets(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    p = run([tool("tierlab"), "vm", "pair", "--profile", "labtest", "--out", tmp_path / "o",
             "--shm", deep])
    assert_one_line_error(p, 2, "tierlab vm pair: ", "too long a path for the unix sockets")
    assert not (tmp_path / "o").exists()


def fsck_spec(tmp_path: Path, tierfs: Path, cancel: threading.Event) -> vmpair.RunSpec:
    prof = profile_mod.load("labtest")
    d = tmp_path / "run"
    d.mkdir(exist_ok=True)
    vm = vmpair.VmSettings(cpus=1, mem_mib=512, timeout=60, accel="tcg")
    arm = pair_mod.Arm("active", tmp_path, False)
    rs = vmpair.RunSpec(prof=prof, arm=arm, image=None, pair=0, slot=0,  # type: ignore[arg-type]
                        seed=1, images=tmp_path, dir=d, vm=vm, faultdev_build=tmp_path,
                        cancel=cancel)
    assert Path(arm.tierfs) == tierfs
    return rs


def test_host_fsck_stops_at_ctrl_c(tmp_path: Path) -> None:
    # A tierfs that never answers stands in for a long fsck.
    tierfs = tmp_path / "bin" / "tierfs"
    tierfs.parent.mkdir()
    tierfs.write_text("#!/bin/sh\nsleep 600\n")
    tierfs.chmod(0o755)
    cancel = threading.Event()
    rs = fsck_spec(tmp_path, tierfs, cancel)
    threading.Timer(1.0, cancel.set).start()
    t = time.monotonic()
    got = vmpair.fsck(rs)
    assert got["rc"] is None and not got["clean"] and got["last"] == "tierfs fsck: cancelled (killed)"
    assert time.monotonic() - t < 60
    # Cancelled before it starts: not run at all.
    got = vmpair.fsck(rs)
    assert got["last"] == "tierfs fsck: not run (cancelled)"


def test_bad_profile_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[[members]]\nlabel = "ssd.a"\n')
    p = run([tool("tierlab"), "vm", "run", "--profile", bad, "--out", tmp_path / "o"])
    assert_one_line_error(p, 2, "tierlab vm run: ", "size")


def test_guest_job_from_profile() -> None:
    prof = profile_mod.load("labtest")
    arm = pair_mod.Arm("control", Path("/b"), True)
    job = vmpair.guest_job(prof, arm, pair=3, slot=1, seed=4, boot_index=7)
    head = job.split("\n\n", 1)[0]
    assert "MEMBERS='/dev/lab/ssd.a /dev/lab/hdd.b'" in head
    assert "PAUSE=1" in head and "BG=1" in head and "Q_WINDOW_S=3" in head
    assert "--label /dev/lab/ssd.a" not in head  # format args: --label LABEL PATH
    assert "--label ssd.a /dev/lab/ssd.a --label hdd.b /dev/lab/hdd.b" in head
    for opt in ("--pair 3", "--seed 4", "--boot 7", "--label slot=1", "--rate 300", "--direct"):
        assert opt in head, opt
    assert job.endswith(vmpair.GUEST_RUNNER.read_text())
    # The runner is valid sh (busybox runs it in the guest; dash parses the same).
    p = subprocess.run(["sh", "-n"], input=job, text=True, capture_output=True)
    assert p.returncode == 0, p.stderr


def test_events_keep_profile_commands() -> None:
    prof = profile_mod.load("labtest")
    members, sets = vmpair.member_specs(prof)
    assert [(m.label, m.profile) for m in members] == [("ssd.a", None), ("hdd.b", "hdd-fixed-10ms")]
    assert sets == {"hdd.b": ["delay.all_ms=8"]}
    assert [vmboot.parse_event(f"{e.at_s}:{e.member}:{e.command}", ["hdd.b"]).command
            for e in prof.events] == [["stall", "2s"]]


# ------------------------------------------------------------------ real pairs
# (fixture `image`: conftest.py)


def test_one_pair_of_labtest(image: vmimage.Image, tmp_path: Path) -> None:
    out = tmp_path / "lab"
    t0 = time.monotonic()
    p = run([tool("tierlab"), "vm", "pair", "--profile", "labtest", "--pairs", "1", "--out", out,
             "--set", "gate.background_min_bytes=0"], timeout=900)
    wall = time.monotonic() - t0
    sys.stderr.write(p.stdout[-3000:] + p.stderr[-2000:])
    assert p.returncode in (0, 1), p.stdout[-2000:] + p.stderr
    meta = json.loads((out / "lab.json").read_text())
    assert meta["format"] == "tierlab-pair" and meta["vm"]["images"]["active"] == image.key
    assert sorted(meta["runs"]) == ["runs/p00-active", "runs/p00-control"]
    slots = set()
    for rel in meta["runs"]:
        r = out / rel
        info = json.loads((r / "run.json").read_text())
        assert info["status"] == "ok", (rel, info["error"])
        assert info["fsck"]["clean"], (rel, (r / "fsck.txt").read_text()[-500:])
        assert info["boot"]["status"] == "ok" and info["boot"]["index"] == info["slot"]
        doc = schema.load(r / "probe.json")
        m = doc["manifest"]
        assert (m["arm"], m["pair"], m["slot"], m["boot"]) == (info["arm"], 0, info["slot"],
                                                                info["slot"])
        schema.load(r / "bg.json")
        for edge in ("start", "measure", "end", "idle"):
            assert (r / f"ctl-{edge}.json").is_file() and edge in info["edges"]
        assert (r / "fault-hdd.b.json").is_file()
        assert [(e["command"], e["rc"]) for e in info["events"]] == [("stall 2s", 0)], info["events"]
        assert info["quiescence_s"] is not None, info["quiesce"][-3:]
        if info["arm"] == "control":
            assert info["pause"] is not None
        slots.add(info["slot"])
    assert slots == {0, 1}
    assert (out / "report" / "report.md").is_file()
    g = run([tool("tierlab"), "gate", out])
    assert g.returncode in (0, 1), g.stderr
    assert "gate: PASS" in g.stdout or "gate: FAIL" in g.stdout
    for name in ("runs completed", "p99 ratio", "fsck clean", "edge inventory"):
        assert name in g.stdout
    assert "PASS runs completed" in g.stdout and "PASS fsck clean" in g.stdout
    sys.stderr.write(f"\nvm pair (1 pair of labtest): {wall:.0f} s\n{g.stdout}")


def test_hung_guests_fail_their_runs_and_the_lab_goes_on(image: vmimage.Image,
                                                         tmp_path: Path) -> None:
    p, _ = hung_pairs(tmp_path / "lab")
    assert "FAIL runs completed" in p.stdout
