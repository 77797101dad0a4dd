"""tierlab crash: the model's checks (pure), a short seeded run of power cuts
through a mounted tierfs (the full run is `tierlab crash --cuts 1000 --jobs 2`,
docs/lab/crash.md), and the harness's own test: over drives that lie about
flushes, it must report a failure."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tierlab import crash
from tierlab.testing import build_dir, tool

needs_fuse = pytest.mark.skipif(not os.path.exists("/dev/fuse") or os.geteuid() != 0,
                                reason="needs /dev/fuse and root")


def _found(state: crash.State) -> dict[str, tuple[str, bytes]]:
    out: dict[str, tuple[str, bytes]] = {d: ("dir", b"") for d in state.dirs}
    for name, f in state.files.items():
        out[name] = ("file", b"".join(f.block(b) for b in range((f.size + crash.BLOCK - 1) // crash.BLOCK)))
    return out


def test_the_model_accepts_exactly_its_states() -> None:
    f = crash.File(7)
    f.blocks = {0: (11, crash.BLOCK), 1: (12, crash.BLOCK), 2: (13, crash.BLOCK)}
    f.size = 3 * crash.BLOCK
    s = crash.State({"d0/a": f}, {"d0"})
    found = _found(s)
    assert s.matches(found)
    # A shrinking truncate inside block 1, then an extension: zeros after the cut.
    t = s.copy()
    t.files["d0/a"].truncate(crash.BLOCK + 100)
    t.files["d0/a"].truncate(3 * crash.BLOCK)
    tf = _found(t)["d0/a"][1]
    assert tf[crash.BLOCK:crash.BLOCK + 100] == crash.block_bytes(7, 1, 12)[:100]
    assert tf[crash.BLOCK + 100:] == bytes(2 * crash.BLOCK - 100)
    assert not s.matches(_found(t)) and t.matches(_found(t))

    job = crash.Job.__new__(crash.Job)  # explain() needs no processes
    # A lost block names what recovery shows and what was fsynced.
    bad = dict(found)
    data = bytearray(found["d0/a"][1])
    data[crash.BLOCK:2 * crash.BLOCK] = crash.block_bytes(7, 1, 5)
    bad["d0/a"] = ("file", bytes(data))
    assert not s.matches(bad)
    why, lost = job.explain(s, bad)
    assert lost == crash.BLOCK
    assert "block 1 holds file 7 block 1 version 5, fsynced file 7 block 1 version 12" in why
    # A missing file, an extra one, a missing directory.
    why, lost = job.explain(s, {"d0": ("dir", b""), "b": ("file", b"x")})
    assert lost == 3 * crash.BLOCK and "d0/a: missing" in why and "b: a file not in the fsynced state" in why
    why, _ = job.explain(s, {"d0/a": found["d0/a"]})
    assert "d0/: directory missing" in why
    assert "bytes that no write wrote" in crash.describe_block(b"\x01" * crash.BLOCK)
    # The newest state of a window wins.
    assert job.match([s, t, s], found) == 2 and job.match([t], found) is None


@needs_fuse
def test_short_run_of_power_cuts_loses_nothing(tmp_path: Path) -> None:
    tool("tierfs")
    summary = crash.crash_run(build_dir(), cuts=30, seed=11, jobs=1, per_image=10, ops=120, keep=tmp_path / "keep",
                              where=Path("/dev/shm"), log=print)
    assert summary["failures"] == [], summary["failures"]
    assert summary["cuts"] == 30 and summary["images"] == 3
    assert summary["lost_fsynced_bytes"] == 0
    assert summary["fsynced_bytes_verified"] > 0 and summary["syncs"] > 0
    # Both ways of cutting happened: a trigger inside an operation, the command after one.
    assert summary["triggered"] > 0 and summary["commanded"] > 0, summary


@needs_fuse
def test_short_run_with_two_metadata_copies_loses_nothing(tmp_path: Path) -> None:
    """Three members, every journal entry and btree node on both SSDs; the cuts
    arm either SSD, and the shared supply reaches the members a moment apart
    (a member that missed the last roots block is stale: fsck -n notes, not
    errors)."""
    tool("tierfs")
    summary = crash.crash_run(build_dir(), cuts=20, seed=11, jobs=1, per_image=10, ops=120, keep=tmp_path / "keep",
                              where=Path("/dev/shm"), log=print, metadata_replicas=2)
    assert summary["failures"] == [], summary["failures"]
    assert summary["cuts"] == 20 and summary["images"] == 2 and summary["metadata_replicas"] == 2
    assert summary["lost_fsynced_bytes"] == 0 and summary["fsynced_bytes_verified"] > 0


@needs_fuse
def test_drives_that_lie_about_flushes_are_caught(tmp_path: Path) -> None:
    tool("tierfs")
    summary = crash.crash_run(build_dir(), cuts=8, seed=3, jobs=1, per_image=4, ops=120, keep=None,
                              where=Path("/dev/shm"), log=print, lying_disk=True)
    assert summary["failures"], "fsyncs lost on a lying drive went unnoticed"


def test_a_job_the_harness_breaks_is_a_failure(tmp_path: Path) -> None:
    """A job that dies of an exception (here: no tierfs to run) fails the run;
    it once left an empty summary that passed."""
    (tmp_path / "bin").mkdir()
    summary = crash.crash_run(tmp_path, cuts=2, seed=1, jobs=2, per_image=1, ops=10, keep=None, where=tmp_path,
                              log=print)
    assert len(summary["failures"]) == 2, summary
    assert all("the harness failed: FileNotFoundError" in f for f in summary["failures"]), summary


@pytest.mark.parametrize("args,needle", [
    (["--cuts", "0"], "--cuts must be at least 1"),
    (["--jobs", "x"], "invalid int value"),
    (["--metadata-replicas", "3"], "invalid choice: 3"),
    (["--build", "/nonexistent"], "/nonexistent/bin/tierfs is missing"),
])
def test_bad_arguments_are_one_line(args: list[str], needle: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(Path(crash.__file__).resolve().parent.parent))
    proc = subprocess.run(["/usr/bin/python3", "-m", "tierlab", "crash", *args], capture_output=True, text=True,
                          env=env)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and needle in proc.stderr, proc.stderr
