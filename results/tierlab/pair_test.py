"""The paired runner's pure parts: quiescence from polled write counters, and
the command line's one-line errors (before anything is set up)."""

from __future__ import annotations

from pathlib import Path

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
    doc = ctl_doc({"ssd.a": {"journal": {"write": (7, 100), "flush": (3, 0)},
                             "btree": {"write": (2, 10)}},
                   "hdd.b": {"superblock": {"write": (1, 4096)}}})
    assert pair.device_writes(doc) == 10


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
