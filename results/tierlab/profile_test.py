"""Lab profiles: every shipped one loads, and every kind of mistake is one line
`PROFILE:KEY: what is wrong` with exit 2 (through `tierlab profile`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tierlab import LabError
from tierlab import profile as profile_mod
from tierlab.testing import assert_one_line_error, run, tool

GOOD = """
[[members]]
label = "ssd.a"
size = "1GiB"
[[members]]
label = "hdd.b"
size = "2GiB"
fault = "hdd-7200"
"""

SWAP = GOOD + """
[[members]]
label = "swap.c"
size = "256MiB"
fault = "hdd-fixed-10ms"
"""

SHIPPED = ("fixed-delay", "hdd", "smr", "stall", "timeout", "flaky", "idle", "mem-pressure", "replica-stall",
           "replica-stall-writes")


def test_shipped_profiles_load() -> None:
    assert set(SHIPPED) <= set(profile_mod.names())
    for name in SHIPPED:
        p = profile_mod.load(name)
        assert p.slow_members() and p.slot_bytes() * 2 < 16 << 30
        assert "--fault" in profile_mod.fault_args(p, 3)
    stall = profile_mod.load("stall")
    assert [(e.at_s, e.command, e.duration_s) for e in stall.events] == [(10, "stall 30s", 30)]
    assert profile_mod.load("fixed-delay").members[1].fault_set == ["delay.all_ms=8"]
    # Two copies of everything, the member of the first copies stalled, reads gated.
    rs = profile_mod.load("replica-stall")
    assert "--replicas" in profile_mod.format_args(rs, {"mirror.a": "a", "mirror.b": "b"})
    assert [(e.member, e.command) for e in rs.events] == [("mirror.a", "stall 30s")]
    assert (rs.gate["op"], rs.gate["max_latency_s"]) == ("read", 0.05)
    # The mirror with writes: metadata copies too, every op gated.
    rw = profile_mod.load("replica-stall-writes")
    fmt = profile_mod.format_args(rw, {"mirror.a": "a", "mirror.b": "b"})
    assert "--metadata-replicas" in fmt and "write=" in rw.probe["mix"]
    assert rw.gate.get("op") in (None, "all") and rw.gate["max_latency_s"] == 0.05
    args = profile_mod.fault_args(profile_mod.load("timeout"), 1)
    assert any(a.endswith("workloads/profiles/faults/hdd-timeout-at.toml") for a in
               (x.split("=", 1)[-1] for x in args))


def test_defaults_and_set(tmp_path: Path) -> None:
    f = tmp_path / "p.toml"
    f.write_text(GOOD)
    p = profile_mod.load(str(f), ["gate.p99_ratio_max=1.2", "probe.rate=300",
                                  "phases.measure_s=5"])
    assert p.gate["p99_ratio_max"] == 1.2 and p.probe["rate"] == 300
    assert p.phases == {"warmup_s": 5, "measure_s": 5}
    assert p.gate["allowlist"] == ["reconcile", "copygc"]
    assert p.background["workload"] == "bg-writer" and p.quiesce["window_s"] == 10
    fa = profile_mod.format_args(p, {"ssd.a": "A", "hdd.b": "B"})
    assert fa[:6] == ["--label", "ssd.a", "A", "--label", "hdd.b", "B"]
    assert "--foreground-target" in fa and "--background-target" in fa


@pytest.mark.parametrize("text,needle", [
    ("bogus = 1\n" + GOOD, "p:bogus: unknown key"),
    (GOOD + "bogus = 1\n", "p:members[1].bogus: unknown key"),
    (GOOD + "[probe]\nrate = 'fast'\n", "p:probe.rate: want a number"),
    (GOOD + "[probe]\nrate = -3\n", "p:probe.rate: want 0 < rate"),
    (GOOD + "[probe]\nratee = 3\n", "p:probe.ratee: unknown key"),
    (GOOD + "[probe]\nmix = 'read=1,sleep=2'\n", "p:probe.mix"),
    (GOOD + "[probe]\nmix = 'read=0,write=0'\n", "p:probe.mix: every weight is 0"),
    (GOOD + "[probe]\nmix = 'read=1,write=0'\n[gate]\nop = 'write'\n",
     "p:gate.op: want all or an op of probe.mix with weight > 0 (read)"),
    (GOOD + "[probe]\nmix = 'read=1'\n[gate]\nop = 'stat'\n", "p:gate.op"),
    (GOOD + "[phases]\nwarmup_s = 5\n[background]\nstart_s = 6\n",
     "p:background.start_s: want <= phases.warmup_s (5)"),
    (GOOD + "[gate]\nallowlist = ['reconcile', 'journl']\n", "p:gate.allowlist: 'journl'"),
    (GOOD + "[gate]\nmax_latency = 'soon'\n", "p:gate.max_latency"),
    (GOOD + "[phases]\nmeasure_s = 0\n", "p:phases.measure_s"),
    (GOOD + "[[events]]\nat_s = 99\nmember = 'hdd.b'\ncommand = 'stall 1s'\n", "p:events[0].at_s"),
    (GOOD + "[[events]]\nat_s = 1\nmember = 'ssd.a'\ncommand = 'stall 1s'\n",
     "p:events[0].member: ssd.a has no fault profile"),
    (GOOD + "[[events]]\nat_s = 1\nmember = 'hdd.b'\ncommand = 'explode'\n", "p:events[0].command"),
    (GOOD + "[format]\nbackground_target = 'tape'\n", "p:format.background_target"),
    (GOOD.replace('"2GiB"', '"1KiB"'), "p:members[1].size"),
    (GOOD.replace('"hdd-7200"', '"hdd-9000"'), "p:members[1].fault: no faultdev profile"),
    (GOOD.replace('"hdd.b"', '"hdd"'), "p:members[1].label"),
    ("[probe]\nrate = 1\n", "p:members: want at least one"),
    ("[[members]]\nlabel = 'ssd.a'\n", "p:members[0].size: missing"),
    (GOOD + "[quiesce]\nmax_s = 20\n[gate]\nquiesce_max_s = 15\n", "p:gate.quiesce_max_s"),
    ("x = [", "p: not TOML"),
    (GOOD + "[vm]\nbogus = 1\n", "p:vm.bogus: unknown key"),
    (GOOD + "[vm]\nmem_mib = 100\n", "p:vm.mem_mib: want 256..65536 (MiB), got 100"),
    (GOOD + "[vm]\nmem_mib = '1G'\n", "p:vm.mem_mib: want an integer"),
    (GOOD + "[vm]\ncpus = 99\n", "p:vm.cpus: want 1..64, got 99"),
    (GOOD + "[vm]\nswap = 'swap.c'\n", "p:vm.swap: 'swap.c' is not a member (ssd.a, hdd.b)"),
    (GOOD + "[vm]\nswap = 'hdd.b'\n", "p:format.background_target: 'hdd' names the swap member hdd.b"),
    (SWAP + "[gate]\nslow_group = 'swap'\n[vm]\nswap = 'swap.c'\n",
     "p:gate.slow_group: 'swap' is the swap member's group (vm.swap)"),
    (SWAP.replace('"swap.c"', '"ssd.c"') + "[vm]\nswap = 'ssd.c'\n",
     "p:vm.swap: ssd.c shares group 'ssd' with tierfs members"),
    (SWAP + "[format]\nbackground_target = 'swap'\n[vm]\nswap = 'swap.c'\n",
     "p:format.background_target: 'swap' names the swap member swap.c (vm.swap)"),
    (SWAP + "[vm]\nhog = 'lots'\n", "p:vm.hog: want a size"),
    (SWAP + "[vm]\nhog = 1000\n", "p:vm.hog: want whole MiB"),
    (SWAP + "[vm]\nmem_mib = 512\nhog = '512MiB'\n",
     "p:vm.hog: 512MiB is not below the guest's memory (vm.mem_mib 512)"),
])
def test_bad_profiles_are_one_line(tmp_path: Path, text: str, needle: str) -> None:
    f = tmp_path / "p.toml"
    f.write_text(text)
    with pytest.raises(LabError) as e:
        profile_mod.load(str(f))
    assert needle in str(e.value) and "\n" not in str(e.value)
    assert_one_line_error(run([tool("tierlab"), "profile", f]), 2, needle)


def test_vm_table(tmp_path: Path) -> None:
    """[vm]: unset by default; a swap member is no tierfs member (not formatted,
    not mounted, not fsck'd); swap or a hog make the profile a guest-only one."""
    f = tmp_path / "p.toml"
    f.write_text(GOOD)
    p = profile_mod.load(str(f))
    assert p.vm == {"mem_mib": 0, "cpus": 0, "swap": "", "hog": 0} and not p.needs_guest
    assert p.fs_members() == p.members
    f.write_text(SWAP + "[vm]\nmem_mib = 448\ncpus = 1\nswap = 'swap.c'\nhog = '300MiB'\n")
    p = profile_mod.load(str(f))
    assert p.vm == {"mem_mib": 448, "cpus": 1, "swap": "swap.c", "hog": 300 << 20}
    assert [m.label for m in p.fs_members()] == ["ssd.a", "hdd.b"]
    fa = profile_mod.format_args(p, {m.label: m.label.upper() for m in p.members})
    assert "swap.c" not in fa and "SWAP.C" not in fa
    assert p.needs_guest == "vm.swap and vm.hog"
    assert profile_mod.load(str(f), ["vm.hog=0"]).needs_guest == "vm.swap"
    assert profile_mod.load(str(f), ["vm.mem_mib=1024"]).vm["mem_mib"] == 1024
    mp = profile_mod.load("mem-pressure")
    assert mp.vm["swap"] == "swap.c" and mp.vm["hog"] and mp.vm["mem_mib"]
    assert [e.member for e in mp.events] == ["swap.c"] and mp.probe["rate"] <= 100
    out = run([tool("tierlab"), "profile", "mem-pressure"])
    assert out.returncode == 0 and "vm: mem_mib 448, cpus 1, swap swap.c, hog 320MiB" in out.stdout


def test_gate_op_and_start_s_limits_that_hold(tmp_path: Path) -> None:
    f = tmp_path / "p.toml"
    f.write_text(GOOD + "[probe]\nmix = 'read=1,write=0'\n[gate]\nop = 'read'\n"
                 "[phases]\nwarmup_s = 5\n[background]\nstart_s = 5\n")
    p = profile_mod.load(str(f))
    assert p.gate["op"] == "read" and p.background["start_s"] == 5


def test_command_line(tmp_path: Path) -> None:
    t = tool("tierlab")
    proc = run([t, "profile"])
    assert proc.returncode == 0, proc.stderr
    assert all(any(line.startswith(f"{n}:") for line in proc.stdout.splitlines()) for n in SHIPPED)
    assert_one_line_error(run([t, "profile", "nope"]), 2, "no such profile")
    assert_one_line_error(run([t, "profile", "stall", "--set", "gate.max_latency=3"]), 2,
                          "stall:gate.max_latency")
    assert_one_line_error(run([t, "profile", "stall", "--set", "members.size=1"]), 2, "--set")


def test_shipped_fault_settings_load_in_faultdev(tmp_path: Path) -> None:
    """Every member's fault profile with its fault_set loads in faultdev's own
    loader (the one tierfs --fault uses): one op through each."""
    fd = tool("faultdev")
    for name in SHIPPED + ("labtest",):
        for m in profile_mod.load(name).members:
            if m.fault is None:
                continue
            fault = str(profile_mod.fault_path(m.fault)) if "/" in m.fault else m.fault
            sets = [x for s in m.fault_set for x in ("--set", s)]
            proc = run([fd, "run", "--profile", fault, "--image", tmp_path / "i.img", "--size",
                        "64M", "--pattern", "seqwrite", "--ops", "1", "--qd", "1", *sets],
                       timeout=120)
            assert proc.returncode == 0, (name, m.label, proc.stderr)
