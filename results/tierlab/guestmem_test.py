"""The guest's memory in VM lab runs (guestmem.py, vmpair.memory, the report's
"Guest memory" section), from saved files and documents: no guest boots here.
mempressure_test.py runs the mem-pressure profile in a real guest."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tierlab import guestmem, labgate, vmpair
from tierlab import profile as profile_mod
from tierlab.testing import synthetic_pair_dir

# /proc/vmstat as a 6.1 guest writes it (a subset, with the family members the
# deltas sum and a near-name that must not count: pgscan_direct_throttle).
VMSTAT = """nr_free_pages {free}
workingset_refault_anon {wra}
workingset_refault_file {wrf}
pswpin {pswpin}
pswpout {pswpout}
allocstall_dma 0
allocstall_dma32 {as32}
allocstall_normal {asn}
allocstall_movable {asm}
pgmajfault {majf}
pgsteal_kswapd {stk}
pgsteal_direct {std}
pgscan_kswapd {sck}
pgscan_direct {scd}
pgscan_direct_throttle 999
oom_kill {oom}
uptime_ms {up}
"""
MEMINFO = """MemTotal:         402816 kB
MemFree:            6428 kB
MemAvailable:      10300 kB
Shmem:            350976 kB
SwapTotal:        524284 kB
SwapFree:         {swapfree} kB
"""


def counters(**kw: int) -> str:
    base = dict(free=1000, wra=0, wrf=0, pswpin=0, pswpout=0, as32=0, asn=0, asm=0, majf=0,
                stk=0, std=0, sck=0, scd=0, oom=0, up=10000)
    base.update(kw)
    return VMSTAT.format(**base)


def guest_results(d: Path, *, oom: int = 0, dmesg: str = "", hog: str | None = None,
                  hog_rc: str = "143 running") -> Path:
    """A guest's results directory with vmstat/meminfo/daemon snapshots at the
    four edges: 20 s of measured phase with known deltas."""
    d.mkdir(parents=True, exist_ok=True)
    snaps = {
        "start": counters(up=9000),
        "measure": counters(pswpin=100, pswpout=1000, sck=500, scd=50, stk=400, std=40,
                            as32=1, asn=2, majf=7, wra=30, wrf=3, up=20000),
        "end": counters(pswpin=2100, pswpout=5000, sck=1500, scd=250, stk=1200, std=140,
                        as32=2, asn=6, asm=1, majf=17, wra=2030, wrf=13, oom=oom, up=40000),
        "idle": counters(pswpin=2200, pswpout=5000, sck=1500, scd=250, stk=1200, std=140,
                         as32=2, asn=6, asm=1, majf=17, wra=2130, wrf=13, oom=oom, up=50000),
    }
    for edge, text in snaps.items():
        (d / f"vmstat-{edge}.txt").write_text(text)
        (d / f"meminfo-{edge}.txt").write_text(MEMINFO.format(
            swapfree=524284 - (20480 if edge in ("end", "idle") else 0)))
    (d / "daemon-measure.txt").write_text("minflt 3000\nmajflt 2\nVmRSS_kB 13444\nVmSwap_kB 0\n")
    (d / "daemon-end.txt").write_text("minflt 3900\nmajflt 12\nVmRSS_kB 16868\nVmSwap_kB 512\n")
    (d / "dmesg.txt").write_text("[    0.000000] Linux version 6.1.0\n" + dmesg)
    if hog is not None:
        (d / "hog.progress").write_text(hog + "\n")
        (d / "hog.rc").write_text(hog_rc + "\n")
    return d


def test_vmstat_edges_and_measured_deltas(tmp_path: Path) -> None:
    vm = guestmem.vmstat(guest_results(tmp_path / "res"))
    assert vm is not None
    assert set(vm["edges"]) == {"start", "measure", "end", "idle"}
    assert vm["edges"]["end"]["pswpout"] == 5000 and "uptime_ms" not in vm["edges"]["end"]
    assert vm["uptime_s"] == {"start": 9.0, "measure": 20.0, "end": 40.0, "idle": 50.0}
    m = vm["measured"]
    assert (m["pswpin"], m["pswpout"]) == (2000, 4000)
    assert (m["pgscan_kswapd"], m["pgscan_direct"]) == (1000, 200)   # not the _throttle line
    assert (m["pgsteal_kswapd"], m["pgsteal_direct"]) == (800, 100)
    assert m["allocstall"] == (2 + 6 + 1) - (1 + 2)                   # every zone summed
    assert m["workingset_refault"] == (2030 + 13) - (30 + 3)          # anon + file
    assert (m["pgmajfault"], m["oom_kill"]) == (10, 0)
    assert m["seconds"] == 20.0 and m["pswpin_per_s"] == 100.0 and m["pswpout_per_s"] == 200.0
    assert m["daemon_majflt"] == 10
    assert vm["meminfo"]["end"]["SwapTotal_kB"] - vm["meminfo"]["end"]["SwapFree_kB"] == 20480
    assert vm["daemon"]["end"]["VmSwap_kB"] == 512
    assert guestmem.oom(tmp_path / "res", vm) is None
    # No snapshots (an older runner, a job that failed before the start edge): no key.
    assert guestmem.vmstat(tmp_path) is None


def test_oom_kill_is_found_in_dmesg_and_the_counter(tmp_path: Path) -> None:
    dmesg = ("[   61.1] tierfs invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE)\n"
             "[   61.2] Out of memory: Killed process 631 (tierfs) total-vm:90000kB, "
             "anon-rss:12000kB\n")
    res = guest_results(tmp_path / "res", oom=1, dmesg=dmesg)
    o = guestmem.oom(res, guestmem.vmstat(res))
    assert o is not None and o["kills"] == 1
    msg = guestmem.oom_error(o)
    assert msg.startswith("guest out of memory: the OOM killer killed 1 process(es)")
    assert "Killed process 631 (tierfs)" in msg and "\n" not in msg
    # The counter alone (dmesg wrapped or lost) still counts.
    res2 = guest_results(tmp_path / "res2", oom=2)
    o2 = guestmem.oom(res2, guestmem.vmstat(res2))
    assert o2 is not None and o2["kills"] == 2


def test_hog_progress(tmp_path: Path) -> None:
    assert guestmem.hog(tmp_path, 0) is None
    # No progress file: the runner never got to it (the run's own error says why).
    h = guestmem.hog(tmp_path, 1 << 20)
    assert h is not None and not h["started"] and h["error"] is None and h["ran_to_end"] is None
    res = guest_results(tmp_path / "a", hog="passes=3 chunks=130 filled_s=10.9")
    h = guestmem.hog(res, 320 << 20)
    assert h == {"bytes": 320 << 20, "started": True, "filled": True, "passes": 3,
                 "chunks": 130, "fill_s": 10.9, "error": None, "rc": 143, "ran_to_end": True}
    # One that ended on its own did not press on the whole phase.
    h = guestmem.hog(guest_results(tmp_path / "d", hog="passes=1 chunks=40 filled_s=30.2",
                                   hog_rc="0 exited"), 320 << 20)
    assert h is not None and h["filled"] and not h["ran_to_end"]
    assert h["error"] == "it exited on its own (status 0) before the workload's end"
    # An older runner's hog.rc (status only) says nothing about it.
    h = guestmem.hog(guest_results(tmp_path / "e", hog="passes=1 chunks=4 filled_s=3",
                                   hog_rc="143"), 1 << 20)
    assert h is not None and h["error"] is None and h["rc"] == 143 and h["ran_to_end"] is None
    # SIGKILL did not end it: no status, and that is an error.
    h = guestmem.hog(guest_results(tmp_path / "f", hog="passes=2 chunks=9 filled_s=4",
                                   hog_rc="? running"), 1 << 20)
    assert h is not None and h["rc"] is None and h["ran_to_end"] is True
    assert h["error"] == "it was still running after SIGKILL (stuck in the kernel)"
    # Stopped by a failed run's cleanup while filling: it never pressed on a
    # workload, so it did not "run to the end" of one.
    h = guestmem.hog(guest_results(tmp_path / "b", hog="filling"), 320 << 20)
    assert h is not None and not h["filled"] and h["error"] is None and h["ran_to_end"] is None
    h = guestmem.hog(guest_results(tmp_path / "c", hog="error=fill failed at chunk 3"), 1 << 20)
    assert h is not None and h["error"] == "fill failed at chunk 3"


def test_guest_step_from_results_or_console(tmp_path: Path) -> None:
    console = tmp_path / "console.log"
    console.write_text("[   5.1] tierlab-step: format\n[   5.3] tierlab-init: job start\n"
                       "[  95.7] tierlab-step: umount\n[  96.0] some other line\n")
    assert guestmem.guest_step(tmp_path / "none", console) == "umount"
    (tmp_path / "res").mkdir()
    (tmp_path / "res" / "step").write_text("quiesce\n")
    assert guestmem.guest_step(tmp_path / "res", console) == "quiesce"
    assert guestmem.guest_step(tmp_path / "none", tmp_path / "no-console") == ""


def probe_doc(max_ns: int) -> dict[str, Any]:
    return {"measurements": {
        "ops": {"all": {"latency": {"max": max_ns}}},
        "throughput": {"ops": 4486, "target_ops_per_s": 100.0},
        "counters": {"ops_measured": 4486, "max_lag_ns": 14_297_315_533, "late_ops": 5108,
                     "backlog_at_end": 1149, "fell_behind": 1}}}


def test_liveness_from_the_probe_document() -> None:
    lv = guestmem.liveness(probe_doc(14_300_708_133), 45)
    assert lv["max_latency_s"] == 14.301 and lv["max_lag_s"] == 14.297
    assert (lv["ops_measured"], lv["ops_scheduled"], lv["backlog_at_end"]) == (4486, 4500, 1149)
    assert lv["fell_behind"]
    assert lv["text"] == ("probe: 4486 of ~4500 scheduled ops, max latency 14.301 s, "
                          "max lag 14.297 s, fell behind")


def run_spec(tmp_path: Path) -> Any:
    prof = profile_mod.load("mem-pressure")
    d = tmp_path / "run"
    d.mkdir()
    (d / "probe.json").write_text(json.dumps(probe_doc(7_502_235_339)))
    return SimpleNamespace(prof=prof, dir=d)


def test_memory_into_run_json_and_oom_is_the_first_error(tmp_path: Path) -> None:
    rs = run_spec(tmp_path)
    res = guest_results(tmp_path / "res", hog="passes=0 chunks=12 filled_s=10.9")
    info: dict[str, Any] = {}
    errors: list[str] = []
    vmpair.memory(rs, res, info, errors)
    assert errors == []
    assert info["vmstat"]["measured"]["pswpout"] == 4000 and info["oom"] is None
    assert info["hog"]["chunks"] == 12 and info["liveness"]["max_latency_s"] == 7.502
    assert "swap in 2000 / out 4000 pages (100.0 / 200.0 per s)" in vmpair.memory_line(info)

    dmesg = "[   61.2] Out of memory: Killed process 631 (tierfs) total-vm:90000kB\n"
    res2 = guest_results(tmp_path / "res2", oom=1, dmesg=dmesg, hog="error=fill failed at chunk 0")
    errors = ["tierfs ctl: Transport endpoint is not connected"]
    vmpair.memory(rs, res2, {}, errors)
    assert errors[0].startswith("guest out of memory") and "(tierfs)" in errors[0]
    assert errors[1].startswith("tierfs ctl") and errors[2] == "hog: fill failed at chunk 0"

    # No progress file: an error of its own only when nothing else explains it.
    res3 = guest_results(tmp_path / "res3")
    errors = []
    vmpair.memory(rs, res3, {}, errors)
    assert errors == ["hog: the guest's runner never started it"]
    errors = ["mkswap /dev/vdc: no answer within 65 s"]
    vmpair.memory(rs, res3, {}, errors)
    assert errors == ["mkswap /dev/vdc: no answer within 65 s"]


def test_report_section_only_with_vmstat(tmp_path: Path) -> None:
    # A host run's report (no vmstat): no section, and the rest as before.
    host = synthetic_pair_dir(tmp_path / "host", pairs=2)
    labgate.report_dir(host, host / "report", [])
    md = (host / "report" / "report.md").read_text()
    assert "Guest memory" not in md and "## Runs" in md
    assert "guest_memory" not in json.loads((host / "report" / "summary.json").read_text())

    # VM runs: each run.json carries vmstat (arm B's swap traffic twice arm A's).
    vm = synthetic_pair_dir(tmp_path / "vm", pairs=3)
    base = guestmem.vmstat(guest_results(tmp_path / "res"))
    assert base is not None
    for f in sorted((vm / "runs").glob("*/run.json")):
        info = json.loads(f.read_text())
        v = json.loads(json.dumps(base))
        k = 2 if info["arm"] == "active" else 1
        for key in ("pswpin", "pswpout", "pswpin_per_s", "pswpout_per_s"):
            v["measured"][key] *= k
        info["vmstat"] = v
        info["hog"] = {"bytes": 1 << 20, "filled": True, "passes": 2 * k, "chunks": 9,
                       "fill_s": 1.0, "error": None}
        f.write_text(json.dumps(info))
    labgate.report_dir(vm, vm / "report", [])
    md = (vm / "report" / "report.md").read_text()
    assert "## Guest memory" in md
    sec = md.split("## Guest memory", 1)[1].split("\n## ", 1)[0]
    assert "| measured phase, median | control | active |" in sec
    assert "| swap-in pages/s | 100 | 200 |" in sec
    assert "| pages swapped out | 4000 | 8000 |" in sec
    assert "| allocstall (all zones) | 6 | 6 |" in sec
    assert "| tierfs daemon's major faults | 10 | 10 |" in sec
    assert "| hog passes | 2 | 4 |" in sec
    assert "| hog chunks rewritten | 9 | 9 |" in sec and "2 passes, 9 chunks, filled in 1 s" in sec
    assert "all p99 (median)" in sec and "| runs with counters | 3 | 3 |" in sec
    assert "p00-active" in sec and "20 MiB" in sec  # per run: swap used at the end edge
    summ = json.loads((vm / "report" / "summary.json").read_text())["guest_memory"]
    assert summ["active"]["pswpout_per_s"] == 400.0 and summ["control"]["runs"] == 3
    assert summ["active"]["p99_ns"] > 0


def test_every_measured_delta_has_a_report_row() -> None:
    rows = {k for k, _label in guestmem.ROWS}
    assert set(guestmem.DELTAS) <= rows, set(guestmem.DELTAS) - rows


def test_an_oom_kill_is_the_first_error_even_when_results_are_cut_short(
        tmp_path: Path, monkeypatch: Any) -> None:
    # collect() raises on malformed results; memory() still runs after it.
    prof = profile_mod.load("mem-pressure")
    d = tmp_path / "run"
    dmesg = "[   61.2] Out of memory: Killed process 631 (tierfs) total-vm:90000kB\n"
    guest_results(d / "boot" / "results", oom=1, dmesg=dmesg)
    boot = {"status": "ok", "reason": ""}

    def bad_collect(*_a: Any) -> None:
        raise ValueError("malformed")
    monkeypatch.setattr(vmpair.vmboot, "boot", lambda spec: boot)
    monkeypatch.setattr(vmpair, "collect", bad_collect)
    monkeypatch.setattr(vmpair, "fsck", lambda rs: {"rc": 0, "clean": True, "last": ""})
    vm = vmpair.VmSettings(cpus=1, mem_mib=448, timeout=60, accel="tcg")
    rs = vmpair.RunSpec(prof=prof, arm=vmpair.pair_mod.Arm("active", tmp_path, False),
                        image=SimpleNamespace(), pair=0, slot=0, seed=1, images=tmp_path,
                        dir=d, vm=vm, faultdev_build=tmp_path)
    info = vmpair.run_one(rs)
    assert info["status"] == "failed"
    assert info["error"].startswith("guest out of memory"), info["error"]
    assert info["oom"]["kills"] == 1 and "vmstat" in info
