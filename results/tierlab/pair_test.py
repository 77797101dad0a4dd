"""The paired runner's pure parts: quiescence from polled write counters, and
the command line's one-line errors (before anything is set up)."""

from __future__ import annotations

import argparse
import os
import subprocess
import time
import types
from pathlib import Path

import pytest

from tierlab import pair
from tierlab.testing import assert_one_line_error, ctl_doc, run, tool


def test_quiet_since() -> None:
    s = [(0.0, 5), (1.0, 9), (2.0, 12), (3.0, 12), (4.0, 12), (5.0, 13), (6.0, 13), (7.0, 13),
         (8.0, 13), (9.0, 13)]
    assert pair.quiet_since(s, 2) == 2.0      # 2 -> 4 without a write
    assert pair.quiet_since(s, 3) == 5.0      # 2 -> 4 is too short; 5 -> 8 holds
    assert pair.quiet_since(s, 5) is None     # not yet
    assert pair.quiet_since([], 1) is None


def test_device_writes() -> None:
    """Quiescence counts write, flush and discard (not reads), in tierfs's own
    counters and in the fault device's view when a member has one."""
    doc = ctl_doc({"ssd.a": {"journal": {"write": (7, 100), "flush": (3, 0)},
                             "btree": {"write": (2, 10), "read": (50, 999)}},
                   "hdd.b": {"superblock": {"write": (1, 4096), "discard": (4, 1 << 20)}}})
    assert pair.device_writes(doc) == 7 + 3 + 2 + 1 + 4
    doc["devices"][1]["fault"] = {"io": {"superblock": {"write": {"ops": 2, "bytes": 8192},
                                                        "flush": {"ops": 5, "bytes": 0},
                                                        "read": {"ops": 9, "bytes": 1}}}}
    assert pair.device_writes(doc) == 17 + 2 + 5
    # a flush alone (no write) ends a quiet window
    a = pair.device_writes(ctl_doc({"hdd.b": {"journal": {"write": (1, 1), "flush": (1, 0)}}}))
    b = pair.device_writes(ctl_doc({"hdd.b": {"journal": {"write": (1, 1), "flush": (2, 0)}}}))
    assert pair.quiet_since([(0.0, a), (1.0, b), (2.0, b)], 1.5) is None


def test_is_mounted_unescapes_and_resolves(tmp_path: Path) -> None:
    real = tmp_path / "with space" / "mnt"
    real.mkdir(parents=True)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "with space")
    esc = str(real).replace(" ", "\\040")
    info = tmp_path / "mountinfo"
    info.write_text(f"36 35 0:42 / {esc} rw,nosuid - fuse.tierfs tierfs rw\n"
                    "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n")
    assert pair.is_mounted(str(real), str(info))
    assert pair.is_mounted(str(link / "mnt"), str(info))            # symlinked
    rel = os.path.relpath(real)
    assert pair.is_mounted(rel, str(info))                           # relative (--shm ./shm)
    assert not pair.is_mounted(str(tmp_path / "other"), str(info))
    assert pair.unescape_mountinfo("a\\040b\\011c\\134d") == "a b\tc\\d"


def test_slots_use_the_resolved_shm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--shm ./x or a symlink: the slot's mount point is the path tierfs mounts at."""
    (tmp_path / "real").mkdir()
    (tmp_path / "ln").symlink_to(tmp_path / "real")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(pair.shutil, "which", lambda _: "/bin/true")
    args = argparse.Namespace(profile="fixed-delay", set=[], pairs=1, seed=None, build=None,
                              baseline=None, candidate=None, arms="active,control",
                              out=str(tmp_path / "o"), shm="./ln")
    lab = pair.Lab(args)
    assert lab.slots[0].mnt == str(tmp_path.resolve() / "real" / f"tierlab-{os.getpid()}"
                                   / "slot0" / "mnt")


def fake_run(tmp_path: Path) -> pair.Run:
    """A Run with just what unmount and teardown use."""
    r = pair.Run.__new__(pair.Run)
    r.lab = types.SimpleNamespace(children=pair.Children())
    r.slot = pair.Slot(0, tmp_path / "slot0")
    r.slot.root.mkdir()
    r.dir = tmp_path
    (tmp_path / "mount.log").write_text("")
    r.mount_started = True
    r.mount_proc = r.lab.children.popen(["sleep", "60"])
    r.lab.children.mounts.add(r.slot.mnt)
    return r


def test_teardown_always_unmounts_and_kills_the_daemon(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Even when the mount is not seen (is_mounted false), teardown lazily
    unmounts, ends the daemon and leaves nothing registered."""
    calls: list[str] = []
    monkeypatch.setattr(pair, "lazy_unmount", calls.append)
    monkeypatch.setattr(pair, "TEARDOWN_REAP_S", 0.2)
    r = fake_run(tmp_path)
    p = r.mount_proc
    t0 = time.monotonic()
    r._teardown()
    assert time.monotonic() - t0 < 10
    assert p.poll() is not None and r.mount_proc is None
    assert calls == [r.slot.mnt]
    assert not r.lab.children.procs and not r.lab.children.mounts


def test_unmount_timeout_is_a_run_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """fusermount3 -u that hangs: RunFailed (not TimeoutExpired), lazy unmount,
    the daemon reaped or killed."""
    calls: list[str] = []
    monkeypatch.setattr(pair, "lazy_unmount", calls.append)
    monkeypatch.setattr(pair, "is_mounted", lambda _p: True)

    def hang(cmd, **kw):  # type: ignore[no-untyped-def]
        raise subprocess.TimeoutExpired(cmd, kw.get("timeout", 0))
    monkeypatch.setattr(pair.subprocess, "run", hang)
    r = fake_run(tmp_path)
    p = r.mount_proc
    with pytest.raises(pair.RunFailed, match="fusermount3 -u: no answer within"):
        r._unmount(strict=True)
    assert p.poll() is not None and r.mount_proc is None and calls == [r.slot.mnt]
    r._teardown()
    assert not r.lab.children.procs and not r.lab.children.mounts


def test_kill_ends_the_group_after_the_leader_exited(tmp_path: Path) -> None:
    pidf = tmp_path / "pid"
    ch = pair.Children()
    p = ch.popen(["sh", "-c", f"sleep 60 & echo $! > {pidf}"])
    p.wait(timeout=10)
    orphan = int(pidf.read_text())
    pair.kill(p)
    for _ in range(100):
        try:
            st = Path(f"/proc/{orphan}/stat").read_text().split(") ")[-1].split()[0]
        except OSError:
            break
        if st == "Z":
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"pid {orphan} of the killed group still runs")


def test_popen_after_kill_all_is_refused_and_kill_running_does_not_stop() -> None:
    ch = pair.Children()
    p = ch.popen(["sleep", "60"])
    ch.kill_running([])                  # the watchdog: kills, the lab goes on
    assert p.poll() is not None and not ch.stopping.is_set()
    q = ch.popen(["sleep", "60"])
    ch.kill_all()
    assert q.poll() is not None
    with pytest.raises(pair.RunFailed, match="stopping"):
        ch.popen(["true"])


def test_pair_deadline_covers_the_steps() -> None:
    from tierlab import profile as profile_mod
    prof = profile_mod.load("fixed-delay")
    d = pair.pair_deadline_s(prof)
    assert d > prof.workload_s + pair.FSCK_TIMEOUT + prof.quiesce["max_s"]


def test_bad_command_lines(tmp_path: Path) -> None:
    t = tool("tierlab")
    assert_one_line_error(run([t, "pair", "--profile", "nope", "--out", tmp_path / "o"]), 2,
                          "no such profile")
    assert_one_line_error(run([t, "pair", "--pairs", "0", "--out", tmp_path / "o"]), 2, "--pairs")
    assert_one_line_error(run([t, "pair", "--baseline", "/x", "--out", tmp_path / "o"]), 2,
                          "--baseline and --candidate")
    assert_one_line_error(run([t, "pair", "--arms", "a,b", "--out", tmp_path / "o"]), 2, "--arms")
    assert_one_line_error(run([t, "pair", "--baseline", "/x", "--candidate", "/y",
                               "--out", tmp_path / "o"]), 2, "/x/bin/tierfs")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_text("x")
    assert_one_line_error(run([t, "pair", "--out", tmp_path / "full"]), 2, "not empty")
    assert_one_line_error(run([t, "pair", "--set", "probe.rate=0", "--out", tmp_path / "o"]), 2,
                          "fixed-delay:probe.rate")


def test_a_profile_that_needs_a_guest_is_refused(tmp_path: Path) -> None:
    """[vm] swap and hog exist only in a QEMU guest: the host runner refuses
    such a profile before it sets anything up, naming the command that runs it."""
    t = tool("tierlab")
    p = run([t, "pair", "--profile", "mem-pressure", "--pairs", "1", "--out", tmp_path / "o"])
    assert_one_line_error(p, 2, "tierlab pair: profile mem-pressure sets vm.swap and vm.hog, "
                          "which only a QEMU guest has: run it with tierlab vm pair")
    assert not (tmp_path / "o").exists()
    # Without them ([vm] cpus and mem_mib alone are defaults for the VM lab) it
    # is a host profile: the refusal is not what stops this one.
    p = run([t, "pair", "--profile", "mem-pressure", "--set", "vm.swap=", "--set", "vm.hog=0",
             "--pairs", "0", "--out", tmp_path / "o"])
    assert_one_line_error(p, 2, "--pairs: want 1..1000")


def test_a_hung_child_is_killed_and_reported() -> None:
    import time

    import pytest

    ch = pair.Children()
    t0 = time.monotonic()
    with pytest.raises(pair.RunFailed, match="no answer within 0.5 s"):
        ch.run(["sh", "-c", "sleep 30 & sleep 30"], 0.5, "sleeper")
    assert time.monotonic() - t0 < 10
    assert not ch.procs  # nothing left behind
    p = ch.popen(["sleep", "30"])
    ch.kill_all()  # what Ctrl-C does: every child we started, and only those
    assert p.poll() is not None and ch.stopping.is_set()
    with pytest.raises(pair.RunFailed, match="stopping"):
        ch.popen(["true"])


def test_kill_all_racing_popen_leaves_nothing_running() -> None:
    """Ctrl-C while run threads start children: every child is either refused
    ("stopping") or killed by kill_all, never started unseen."""
    import threading

    ch = pair.Children()
    started: list[subprocess.Popen] = []
    lock = threading.Lock()

    def starter() -> None:
        for _ in range(200):
            try:
                p = ch.popen(["sleep", "60"])
            except pair.RunFailed:
                return
            with lock:
                started.append(p)

    threads = [threading.Thread(target=starter) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    ch.kill_all()
    for t in threads:
        t.join(timeout=30)
    assert started and all(p.poll() is not None for p in started)


def test_a_failed_fault_event_fails_the_run(tmp_path: Path) -> None:
    from tierlab import profile as profile_mod

    r = pair.Run.__new__(pair.Run)
    r.lab = types.SimpleNamespace(children=pair.Children())
    r.slot = pair.Slot(0, tmp_path)
    r.info = {"events": []}
    replies = iter([(0, "stalled\n"), (1, "fault: no such member hdd.b\n")])

    def fake_tierfs(args, timeout, what):  # type: ignore[no-untyped-def]
        rc, out = next(replies)
        return subprocess.CompletedProcess(args, rc, out, "")
    r.tierfs = fake_tierfs  # type: ignore[method-assign]
    ev = profile_mod.Event(1.0, "hdd.b", "stall 2s")
    r._fire(ev, time.time())
    assert r.info["events"][-1]["rc"] == 0
    with pytest.raises(pair.RunFailed, match="fault hdd.b stall 2s: exited 1: fault: no such"):
        r._fire(ev, time.time())
    assert r.info["events"][-1]["rc"] == 1  # still recorded
