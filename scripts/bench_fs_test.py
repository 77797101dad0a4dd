"""bench_fs: a tiny end-to-end run on every target (2 s fio jobs, 500 files, one
round) gives a result that matches its schema with sane numbers and leaves no mount,
loop device or scratch file behind; a failing mount is one line and cleans up too;
medians, ratios and goals from synthetic rounds; the report's tables."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tierlab import schema
from tierlab.testing import assert_one_line_error, build_dir, run, tool

HERE = Path(__file__).resolve().parent
WRAPPER = HERE / "bench-fs"
SCHEMA = HERE.parent / "results" / "schema" / "bench-fs-v1.schema.json"

spec = importlib.util.spec_from_file_location("bench_fs", HERE / "bench_fs.py")
assert spec is not None and spec.loader is not None
bench_fs = importlib.util.module_from_spec(spec)
sys.modules["bench_fs"] = bench_fs  # dataclasses look their module up there
spec.loader.exec_module(bench_fs)


def needs_mounts() -> None:
    """Skips unless this machine can run the benchmark: root, FUSE, a loop device."""
    if os.geteuid() != 0:
        pytest.skip("needs root (mounts, a loop device, drop_caches)")
    if not os.path.exists("/dev/fuse"):
        pytest.skip("needs /dev/fuse")
    if shutil.which("losetup") is None or run(["losetup", "--find"]).returncode != 0:
        pytest.skip("needs a free loop device (losetup --find)")


def leftovers(under: Path) -> list[str]:
    """Mounts and loop devices that still refer to anything under `under`."""
    out = [ln.split()[4] for ln in Path("/proc/self/mountinfo").read_text().splitlines()
           if ln.split()[4].startswith(str(under))]
    out += [ln for ln in run(["losetup", "--list", "--noheadings", "--output", "NAME,BACK-FILE"]).stdout.splitlines()
            if str(under) in ln]
    return out


def test_tiny_run_every_target(tmp_path: Path) -> None:
    needs_mounts()
    tool("tierfs")
    work = tmp_path / "work"
    work.mkdir()
    out = tmp_path / "fs.json"
    proc = run([WRAPPER, "--build", build_dir(), "--dir", work, "--runtime", "2", "--files", "500",
                "--per-dir", "200", "--size", "64M", "--fsync-size", "16M", "--image-size", "1G",
                "--rounds", "1", "--json", out], timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert list(work.iterdir()) == [] and leftovers(work) == []
    doc = json.loads(out.read_text())
    jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text())).validate(doc)
    assert doc["config"]["targets"] == ["tierfs", "passthrough", "ext4"]
    assert {(r["step"], r["target"]) for r in doc["runs"]} == {
        (s, t) for s in bench_fs.STEPS for t in ("tierfs", "passthrough", "ext4")}
    for target, m in doc["summary"]["medians"].items():
        assert m["randrw.iops"] > 50, (target, m)
        assert m["randrw.read_iops"] > 0 and m["randrw.write_iops"] > 0
        assert 0 < m["randrw.read_clat_p50_us"] <= m["randrw.read_clat_p99_us"] < 10e6
        assert 0 < m["fsync.fsync_p50_us"] <= m["fsync.fsync_p99_us"] < 10e6
        assert m["fsync.fsyncs"] >= m["fsync.write_iops"]  # 2 s of writes, one fsync each
        for step in ("create", "stat", "unlink"):
            assert m[f"{step}.files_per_s"] > 10
        assert 0 < m["ls_lR.seconds"] < 60 and 0 < m["du_s.seconds"] < 60
    fuse = [r for r in doc["runs"] if r["target"] != "ext4"]
    assert all(r["daemon_cpu_s"] >= 0 for r in fuse)
    randrw = next(r for r in doc["runs"] if r["target"] == "tierfs" and r["step"] == "randrw")
    assert randrw["tierfs_ctl"]["data.bytes_written"] > 0  # tierfs ctl deltas recorded
    assert doc["tierfs_fsck"]["exit"] == 0, doc["tierfs_fsck"]
    assert {g["metric"] for g in doc["summary"]["goals"]} == {"randrw.iops", "fsync.fsync_p99_us"}
    assert "randrw IOPS (read+write)" in proc.stdout and "tierfs/passthrough" in proc.stdout

    report = run([WRAPPER, "--report", out, "--markdown"])
    assert report.returncode == 0, report.stderr
    assert "| metric | tierfs | passthrough | ext4 | tierfs/passthrough | tierfs/ext4 |" in report.stdout

    # The fio steps also went through the lab's one fio parser and results path:
    # run-v1 documents that `tierlab report` compares target against target.
    runs_dir = out.with_suffix(".runs")
    assert doc["config"]["results_documents"] == str(runs_dir)
    docs = sorted(p.name for p in runs_dir.iterdir())
    assert docs == sorted(f"{t}-{s}-r1.json" for t in ("tierfs", "passthrough", "ext4")
                          for s in ("randrw", "fsync")), docs
    fs = schema.load(runs_dir / "tierfs-fsync-r1.json")
    assert fs["manifest"]["labels"] == {"target": "tierfs", "step": "fsync", "round": "1"}
    assert fs["measurements"]["ops"]["fsync"]["latency"]["count"] > 0
    rep = run([tool("tierlab"), "report", "--a", runs_dir / "passthrough-randrw-r1.json",
               "--b", runs_dir / "tierfs-randrw-r1.json", "-o", tmp_path / "rep"])
    assert rep.returncode == 0, rep.stderr


def test_failing_mount_is_one_line_and_cleans_up(tmp_path: Path) -> None:
    """A tierfs whose mount fails: one line naming the step and the daemon's last
    line, exit 1, nothing left mounted and no scratch directory."""
    needs_mounts()
    fake = tmp_path / "build" / "bin"
    fake.mkdir(parents=True)
    (fake / "tierfs").write_text('#!/bin/sh\n[ "$1" = format ] && exit 0\n'
                                 'echo "tierfs: something went wrong" >&2; exit 1\n')
    (fake / "tierfs").chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    proc = run([WRAPPER, "--build", fake.parent, "--dir", work, "--targets", "ext4,tierfs",
                "--image-size", "1G", "--size", "64M", "--fsync-size", "16M", "--rounds", "1"])
    assert_one_line_error(proc, 1, "mounting tierfs failed (exit 1)", "something went wrong")
    assert list(work.iterdir()) == [] and leftovers(work) == []


def test_missing_build_is_one_line(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the root check comes first")
    proc = run([WRAPPER, "--build", tmp_path / "none", "--dir", tmp_path, "--targets", "tierfs"])
    assert_one_line_error(proc, 1, "bin/tierfs is missing")


def record(rnd: int, step: str, target: str, **metrics: float) -> dict[str, Any]:
    return {"round": rnd, "step": step, "target": target, "metrics": metrics}


def test_medians_ratios_and_goals() -> None:
    runs = []
    for rnd, (t, p) in enumerate(((100.0, 200.0), (300.0, 400.0), (900.0, 1000.0)), 1):
        runs.append(record(rnd, "randrw", "tierfs", iops=t))
        runs.append(record(rnd, "randrw", "passthrough", iops=p))
        runs.append(record(rnd, "fsync", "tierfs", fsync_p99_us=1.4 * p))
        runs.append(record(rnd, "fsync", "passthrough", fsync_p99_us=p))
    s = bench_fs.summarize(runs, ["tierfs", "passthrough"])
    assert s["medians"]["tierfs"]["randrw.iops"] == 300.0
    r = s["ratios"]["tierfs/passthrough"]["randrw.iops"]
    assert r["of_medians"] == pytest.approx(0.75) and r["per_round"] == pytest.approx([0.5, 0.75, 0.9])
    goals = {g["metric"]: g for g in s["goals"]}
    assert not goals["randrw.iops"]["met"] and goals["fsync.fsync_p99_us"]["met"]
    assert goals["fsync.fsync_p99_us"]["ratio"] == pytest.approx(1.4)
    assert "tierfs/ext4" not in s["ratios"]


def test_sizes() -> None:
    assert bench_fs.parse_size("64M") == 64 << 20 and bench_fs.parse_size("1G") == 1 << 30
    assert bench_fs.parse_size("4096") == 4096 and bench_fs.parse_size("2GiB") == 2 << 30
    for bad in ("0", "1X", "-1G", ""):
        with pytest.raises(Exception):
            bench_fs.parse_size(bad)


def test_bad_options_exit_2(tmp_path: Path) -> None:
    proc = subprocess.run([str(WRAPPER), "--targets", "tierfs,zfs"], capture_output=True, text=True)
    assert proc.returncode == 2 and "--targets: choose from" in proc.stderr
    proc = subprocess.run([str(WRAPPER), "--steps", "stat,ls_lR"], capture_output=True, text=True)
    assert proc.returncode == 2 and "need create" in proc.stderr


def test_tables_leave_out_steps_not_run() -> None:
    runs = [{**record(rnd, "create", t, files_per_s=v), "machine": {}}
            for rnd, (a, b) in enumerate(((1000.0, 4000.0), (3000.0, 2000.0)), 1)
            for t, v in (("tierfs", a), ("ext4", b))]
    doc = {"config": {"targets": ["tierfs", "ext4"], "rounds": 2}, "runs": runs,
           "summary": bench_fs.summarize(runs, ["tierfs", "ext4"])}
    text = bench_fs.tables(doc, markdown=True)
    assert "| create files/s | 2000 | 3000 | 0.67 |" in text  # medians and their ratio
    assert "| create files/s | 1000 / 3000 | 4000 / 2000 |" in text  # each round
    assert "randrw" not in text and "target >=" not in text  # no fio step, no goals
