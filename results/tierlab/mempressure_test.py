"""Issue 19 step 5 in real guests and in the guest's job: the mem-pressure
profile's job (swap member, hog, every step bounded and counted in the
budget), one short `tierlab vm run` of mem-pressure (the guest really swaps,
the hog runs, run.json carries vmstat, the run ends with a status), and a job
cut by its budget naming the step it was in. Real boots are skipped, saying
why, only where QEMU or the guest image cannot be had. Nothing here asserts
on timing."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from tierlab import guestmem, vmimage, vmpair
from tierlab import pair as pair_mod
from tierlab import profile as profile_mod
from tierlab.testing import run, tool


def header(job: str) -> dict[str, str]:
    head = job.split("\n\n", 1)[0]
    return dict(re.findall(r"^([A-Z_0-9]+)='?(.*?)'?$", head, re.M))


def test_mem_pressure_job() -> None:
    prof = profile_mod.load("mem-pressure")
    job = vmpair.guest_job(prof, pair_mod.Arm("active", Path("/b"), False), 0, 0, 1, 0)
    h = header(job)
    assert h["SWAP"] == "/dev/lab/swap.c" and int(h["HOG_BYTES"]) == prof.vm["hog"] > 0
    assert "swap.c" not in h["MEMBERS"] and "swap.c" not in h["FORMAT_ARGS"]
    assert h["MEMBERS"] == "/dev/lab/ssd.a /dev/lab/hdd.b"
    p = subprocess.run(["sh", "-n"], input=job, text=True, capture_output=True)
    assert p.returncode == 0, p.stderr
    # Every bound the runner uses is in the header (an empty one would make
    # `timeout` fail), and a profile without [vm] gets no swap and no hog.
    runner = vmpair.GUEST_RUNNER.read_text()
    used = set(re.findall(r'\$\{?([A-Z][A-Z_0-9]*_S)\b', runner))
    assert {"KILL_GRACE_S", "HOG_FILL_S", "CTL_TIMEOUT_S"} <= used
    assert used <= set(h), used - set(h)
    assert not re.search(r"(timeout -k|bound) [0-9]", runner)   # no bound outside the header
    plain = header(vmpair.guest_job(profile_mod.load("labtest"),
                                    pair_mod.Arm("active", Path("/b"), False), 0, 0, 1, 0))
    assert plain["SWAP"] == "" and plain["HOG_BYTES"] == "0"


def test_budget_covers_every_bounded_step() -> None:
    for name in ("labtest", "mem-pressure", "stall-60"):
        prof = profile_mod.load(name)
        b = vmpair.guest_bounds(prof)
        need = (pair_mod.FORMAT_TIMEOUT + pair_mod.MOUNT_TIMEOUT + pair_mod.READY_TIMEOUT
                + prof.workload_s + pair_mod.PROBE_SLACK_S + pair_mod.BG_SLACK_S
                + prof.quiesce["max_s"] + 2 * pair_mod.UMOUNT_TIMEOUT
                + 4 * vmpair.GUEST_CTL_TIMEOUT_S)
        if prof.vm["swap"]:
            need += 2 * vmpair.GUEST_SWAP_TIMEOUT_S + 60 + (prof.member("swap.c").size >> 20) / 2
            assert "swapon" in b and "swapoff" in b
        else:
            assert "swapon" not in b and "hog-stop" not in b
        assert sum(b.values()) >= need, (name, b)
        assert vmpair.guest_budget(prof) > sum(b.values())
        # vmboot's default budget (the timeout less BOOT_OVERHEAD_S) is the guest's.
        assert vmpair.boot_timeout(prof) - vmpair.BOOT_OVERHEAD_S == vmpair.guest_budget(prof)
    # Every step the runner names has its bound (and nothing else does), on a
    # profile that takes every step.
    b = vmpair.guest_bounds(profile_mod.load("mem-pressure", ["background.keep=false"]))
    runner = vmpair.GUEST_RUNNER.read_text()
    named = set(re.findall(r'^\s*step "?([a-z-]+)"?$', runner, re.M)) - {"done"}
    assert {"swapon", "hog-fill", "bg-rm", "quiesce"} <= named
    assert named == set(b) - {"fail"}, named ^ (set(b) - {"fail"})


# ------------------------------------------------------------------ real guests

def short_mem_pressure(tmp_path: Path) -> Path:
    """mem-pressure with its 10 s swap stall at 15 s made a 2 s stall at 3 s,
    so the measured phase can be short."""
    text = profile_mod.find("mem-pressure").read_text()
    short = text.replace("at_s = 15", "at_s = 3").replace('"stall 10s"', '"stall 2s"')
    assert short.count("at_s = 3") == 1 and '"stall 2s"' in short, "the profile's event changed"
    f = tmp_path / "mem-pressure-short.toml"
    f.write_text(short)
    return f


def test_short_mem_pressure_run_swaps(image: vmimage.Image, tmp_path: Path) -> None:
    out = tmp_path / "run"
    p = run([tool("tierlab"), "vm", "run", "--profile", short_mem_pressure(tmp_path),
             "--arm", "active", "--out", out,
             "--set", "phases.warmup_s=5", "--set", "phases.measure_s=8",
             "--set", "quiesce.window_s=2", "--set", "quiesce.max_s=10",
             "--set", "gate.quiesce_max_s=5"], timeout=1800)
    sys.stderr.write(p.stdout[-2000:] + p.stderr[-2000:])
    assert p.returncode in (0, 1), p.stderr
    info = json.loads((out / "run.json").read_text())
    # The run ended with a status (the guest powered off by itself).
    assert info["status"] in ("ok", "failed") and info["boot"]["status"] != "timeout", info
    if info["status"] == "ok":
        assert info["step"] == "done"
    assert info["boot"]["mem_mib"] == 448 and info["boot"]["cpus"] == 1  # the profile's [vm]
    vm = info["vmstat"]
    assert set(vm["edges"]) == set(guestmem.EDGES)
    m = vm["measured"]
    # The guest really swapped in its measured phase: pages went out or came
    # back in (which one a short phase sees depends on how far the hog's fill
    # ran ahead of it -- a loaded host's guest paged only in: stressed make
    # test, session 30); the swap in use at the end says pages went out.
    assert m["pswpout"] + m["pswpin"] > 0, m
    assert m["seconds"] > 0 and (m["pswpout_per_s"] or 0) + (m["pswpin_per_s"] or 0) > 0
    for key in guestmem.DELTAS:
        assert key in m
    mi = vm["meminfo"]["end"]
    assert mi["SwapTotal_kB"] > 0 and mi["SwapTotal_kB"] - mi["SwapFree_kB"] > 0
    h = info["hog"]
    # The runner fills the hog before the workload starts, and it pressed on
    # until the workload's end.
    assert h["error"] is None and h["bytes"] == 320 << 20, h
    assert h["filled"] and h["ran_to_end"] and h["fill_s"] > 0, h
    assert info["oom"] is None or info["oom"]["kills"] == 0
    assert info["liveness"]["ops_measured"] > 0
    assert [(e["member"], e["command"], e["rc"]) for e in info["events"]] == \
        [("swap.c", "stall 2s", 0)]
    res = out / "boot" / "results"
    assert "swap.c" not in (res / "format.txt").read_text()
    assert (res / "swap.txt").read_text().count("/dev/") >= 1   # /proc/swaps listed it
    assert info["fsck"]["clean"], (out / "fsck.txt").read_text()[-500:]


def test_a_job_cut_by_its_budget_names_its_step(image: vmimage.Image, tmp_path: Path) -> None:
    out = tmp_path / "run"
    # 12 s of budget: past boot, format and mount, within the workload's 12 s.
    p = run([tool("tierlab"), "vm", "run", "--profile", "labtest", "--out", out,
             "--budget", "12", "--timeout", "300"], timeout=900)
    assert p.returncode == 1, p.stdout[-2000:] + p.stderr
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "failed" and info["boot"]["status"] == "failed", info
    step = info["step"]
    assert step and step != "done", info
    assert info["error"].startswith("boot failed: the job exited with status 143"), info["error"]
    assert info["error"].endswith(f"in step '{step}'"), info["error"]
