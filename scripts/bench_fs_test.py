"""bench_fs: a tiny end-to-end run on every default target (2 s fio jobs, 500 files,
one round) gives a result that matches its schema with sane numbers and leaves no
mount, loop device or scratch file behind; so does one of the two-member targets
(tierfs-r1, tierfs-r2: two rounds of the fio steps), with both copies written and
their ratio and goal; a failing mount is one line and cleans up too, and so is a run
whose files would not fit; medians, ratios and goals from synthetic rounds; the
tierfs ctl counters kept; the report's tables."""

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
    assert all(r["daemon_ctx_switches"] > 0 for r in fuse if r["step"] == "randrw")  # (threads that served fio)
    randrw = next(r for r in doc["runs"] if r["target"] == "tierfs" and r["step"] == "randrw")
    assert randrw["tierfs_ctl"]["data.bytes_written"] > 0  # tierfs ctl deltas recorded
    assert list(doc["tierfs_fsck"]) == ["tierfs"] and doc["tierfs_fsck"]["tierfs"]["exit"] == 0, doc["tierfs_fsck"]
    assert {g["metric"] for g in doc["summary"]["goals"]} == {"randrw.iops", "fsync.fsync_p99_us"}
    assert "randrw IOPS (read+write)" in proc.stdout and "tierfs/passthrough" in proc.stdout

    report = run([WRAPPER, "--report", out, "--markdown"])
    assert report.returncode == 0, report.stderr
    assert "| metric | tierfs | passthrough | ext4 | tierfs/passthrough | tierfs/ext4 |" in report.stdout
    assert "replicas=2" not in report.stdout  # no tierfs-r1/-r2: no such ratio, no such goal

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


def test_tiny_run_replicas(tmp_path: Path) -> None:
    """tierfs-r1 and tierfs-r2, each over two image files: tierfs-r2 writes a copy
    on both members (and pre-flushes both for an fsync), both fsck clean, and the
    result carries the ratio tierfs-r2/tierfs-r1 in each round and its goal."""
    needs_mounts()
    tool("tierfs")
    work = tmp_path / "work"
    work.mkdir()
    out = tmp_path / "fs.json"
    targets = ["tierfs-r1", "tierfs-r2"]
    proc = run([WRAPPER, "--build", build_dir(), "--dir", work, "--runtime", "2", "--size", "32M",
                "--fsync-size", "16M", "--image-size", "512M", "--rounds", "2", "--targets", ",".join(targets),
                "--steps", "randrw,fsync", "--json", out], timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert list(work.iterdir()) == [] and leftovers(work) == []
    doc = json.loads(out.read_text())
    jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text())).validate(doc)
    assert doc["config"]["targets"] == targets
    assert sorted((r["round"], r["step"], r["target"]) for r in doc["runs"]) == sorted(
        (n, s, t) for n in (1, 2) for s in ("randrw", "fsync") for t in targets)
    assert "--replicas 1" in doc["targets"]["tierfs-r1"]["description"]
    assert "--replicas 2" in doc["targets"]["tierfs-r2"]["description"]
    for m in doc["summary"]["medians"].values():
        assert m["randrw.iops"] > 50 and m["fsync.fsyncs"] >= m["fsync.write_iops"] > 0, m
    assert {t: f["exit"] for t, f in doc["tierfs_fsck"].items()} == {"tierfs-r1": 0, "tierfs-r2": 0}, \
        doc["tierfs_fsck"]

    ratios = doc["summary"]["ratios"]
    assert list(ratios) == ["tierfs-r2/tierfs-r1"]
    for key in ("randrw.iops", "fsync.write_iops"):
        r = ratios["tierfs-r2/tierfs-r1"][key]
        m = doc["summary"]["medians"]
        assert r["of_medians"] == pytest.approx(m["tierfs-r2"][key] / m["tierfs-r1"][key])
        assert len(r["per_round"]) == 2 and all(x > 0 for x in r["per_round"])
    [goal] = doc["summary"]["goals"]
    assert goal["pair"] == "tierfs-r2/tierfs-r1" and goal["metric"] == "randrw.iops" and goal["bound"] == 0.8
    assert goal["met"] == (goal["ratio"] >= 0.8)

    # tierfs ctl's counters for both: tierfs-r2's randrw wrote every extent's second
    # copy to the other member (but for a degraded one, whose copy was left behind
    # on a member slower than its late bound: rare, possible on a loaded machine);
    # its fsyncs pre-flushed both members.
    ctl = {(r["target"], r["step"], r["round"]): r["tierfs_ctl"] for r in doc["runs"]}
    r2 = ctl[("tierfs-r2", "randrw", 2)]
    extents, degraded = r2["data.extents_written"], r2.get("data.degraded_writes", 0)
    assert extents > 0 and r2["data.replica_copies"] + degraded == extents and degraded <= extents // 100, r2
    ops = [r2[f"devices.{member}.io.foreground_write.write.ops"] for member in ("ssd.a", "ssd.b")]
    assert min(ops) >= extents - degraded and sum(ops) >= 2 * extents - degraded, r2
    fs2 = ctl[("tierfs-r2", "fsync", 2)]
    assert fs2["journal.preflushes.0"] > 0 and fs2["journal.preflushes.1"] > 0, fs2
    assert "data.replica_copies" not in ctl[("tierfs-r1", "randrw", 2)]

    report = run([WRAPPER, "--report", out, "--markdown"])
    assert report.returncode == 0, report.stderr
    assert "| metric | tierfs-r1 | tierfs-r2 | tierfs-r2/tierfs-r1 |" in report.stdout
    assert "- replicas=2 randrw IOPS >= 80% of replicas=1: " in report.stdout
    assert "| metric | tierfs-r1 | tierfs-r2 |" in report.stdout  # each round
    assert sorted(p.name for p in out.with_suffix(".runs").iterdir()) == sorted(
        f"{t}-{s}-r{n}.json" for t in targets for s in ("randrw", "fsync") for n in (1, 2))


def test_files_that_do_not_fit_are_refused_up_front(tmp_path: Path) -> None:
    """fio's files times the data copies must stay under 40% of a target's images:
    with 3 GiB images, 2.25 GiB of files fit tierfs-r1 (two images) but neither
    tierfs (one) nor tierfs-r2 (two copies); without randrw, the 256 MiB file fits all."""
    def config(targets: list[str], steps: list[str]) -> Any:
        return bench_fs.Config(rounds=1, runtime=1, size=1 << 30, fsync_size=256 << 20, files=1, per_dir=1,
                               image_size=3 << 30, targets=targets, steps=steps)

    bench_fs.check_room(config(["tierfs-r1", "passthrough"], ["randrw", "fsync"]))
    bench_fs.check_room(config(["tierfs", "tierfs-r2", "ext4"], ["fsync"]))
    for target in ("tierfs", "tierfs-r2", "ext4"):
        with pytest.raises(bench_fs.BenchError, match=f"too small for {target}"):
            bench_fs.check_room(config(["tierfs-r1", target], ["randrw", "fsync"]))
    with pytest.raises(bench_fs.BenchError, match=r"\(2304M x 2 copies\).*--image-size 6G or more"):
        bench_fs.check_room(config(["tierfs-r2"], ["randrw", "fsync"]))

    if os.geteuid() != 0:
        pytest.skip("the root check comes first")
    proc = run([WRAPPER, "--build", build_dir(), "--dir", tmp_path, "--targets", "tierfs-r1,tierfs-r2",
                "--image-size", "3G", "--steps", "randrw,fsync"])
    assert_one_line_error(proc, 1, "--image-size 3G is too small for tierfs-r2")
    assert list(tmp_path.iterdir()) == []


def test_ctl_counters_of_labelled_members() -> None:
    """The ctl deltas keep labelled members' (label with a dot) device counters and
    the per-member journal pre-flushes, not a fault device's view or gauges."""
    def ctl(ops: int, flushes: list[int], seq: int) -> dict[str, Any]:
        io = {"foreground_write": {"write": {"ops": ops, "bytes": 4096 * ops, "p99_ns": 5000}}}
        return {"devices": [{"label": label, "in_flight": 3, "io": io, "fault": {"io": io}}
                            for label in ("ssd.a", "dev1")],
                "journal": {"preflushes": flushes, "next_seq": seq, "unordered_entries": seq,
                            "flushes_late": seq, "flushes_out": seq, "rings_passed_stalling": seq},
                "btree": {"merges_given_up": seq, "unwritten_nodes": seq},
                "data": {"late_writes": seq, "abandoned_reads": seq, "write_points": seq, "hedged": seq},
                "posix": {"inode_locks_now": seq, "open_inodes": seq, "writes_direct": seq}}

    delta = bench_fs.ctl_delta(ctl(10, [1, 2], 5), ctl(30, [4, 2], 9))
    assert delta == {
        "devices.dev1.io.foreground_write.write.bytes": 81920, "devices.dev1.io.foreground_write.write.ops": 20,
        "devices.ssd.a.io.foreground_write.write.bytes": 81920, "devices.ssd.a.io.foreground_write.write.ops": 20,
        "journal.preflushes.0": 3, "journal.unordered_entries": 4,
        "journal.flushes_late": 4, "journal.rings_passed_stalling": 4, "btree.merges_given_up": 4,
        "data.hedged": 4, "posix.writes_direct": 4}  # (gauges and levels left out)


def test_ctx_switches_of_threads_come_and_gone() -> None:
    """A step's context switches: a thread alive throughout counts its growth,
    one new since the start counts whole, one gone by the end is missing; a
    live process's own view is read from /proc."""
    assert bench_fs.ctx_switch_delta({1: 10, 2: 5, 3: 7}, {1: 15, 2: 5, 4: 3}) == 5 + 0 + 3
    assert bench_fs.ctx_switch_delta({}, {}) == 0
    view = bench_fs.process_ctx_switches(os.getpid())
    assert os.getpid() in view and all(n >= 0 for n in view.values())
    assert bench_fs.process_ctx_switches(2 ** 22 + 12345) == {}  # (no such process)


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


def test_replica_ratio_and_goal() -> None:
    """tierfs-r2/tierfs-r1 is taken beside tierfs/passthrough (never tierfs against
    tierfs-r1), with its goal on randrw IOPS; the tables show both ratio columns."""
    targets = ["tierfs", "passthrough", "tierfs-r1", "tierfs-r2"]
    runs = []
    for rnd, (r1, r2) in enumerate(((1000.0, 700.0), (2000.0, 1700.0), (3000.0, 2700.0)), 1):
        for t, iops, writes in (("tierfs", 900.0, 10.0), ("passthrough", 1000.0, 20.0),
                                ("tierfs-r1", r1, 40.0), ("tierfs-r2", r2, 30.0)):
            runs.append({**record(rnd, "randrw", t, iops=iops), "machine": {}})
            runs.append({**record(rnd, "fsync", t, write_iops=writes, fsync_p99_us=100.0), "machine": {}})
    s = bench_fs.summarize(runs, targets)
    assert list(s["ratios"]) == ["tierfs/passthrough", "tierfs-r2/tierfs-r1"]
    r = s["ratios"]["tierfs-r2/tierfs-r1"]
    assert r["randrw.iops"]["of_medians"] == pytest.approx(0.85)
    assert r["randrw.iops"]["per_round"] == pytest.approx([0.7, 0.85, 0.9])
    assert r["fsync.write_iops"]["of_medians"] == pytest.approx(0.75)
    goals = {g["pair"]: g for g in s["goals"] if g["metric"] == "randrw.iops"}
    assert goals["tierfs-r2/tierfs-r1"]["met"] and goals["tierfs-r2/tierfs-r1"]["ratio"] == pytest.approx(0.85)
    assert goals["tierfs/passthrough"]["met"] and goals["tierfs/passthrough"]["ratio"] == pytest.approx(0.9)

    doc = {"config": {"targets": targets, "rounds": 3}, "runs": runs, "summary": s}
    text = bench_fs.tables(doc, markdown=True)
    assert ("| metric | tierfs | passthrough | tierfs-r1 | tierfs-r2 | tierfs/passthrough "
            "| tierfs-r2/tierfs-r1 |") in text
    assert "| randrw IOPS (read+write) | 900 | 1000 | 2000 | 1700 | 0.90 | 0.85 |" in text
    assert "| fsync job writes/s | 10 | 20 | 40 | 30 | 0.50 | 0.75 |" in text
    assert ("- replicas=2 randrw IOPS >= 80% of replicas=1: 0.85 (target >= 0.8; per round 0.70, 0.85, 0.90): met"
            in text)

    # Only the two-member targets: their ratio and goal alone.
    s = bench_fs.summarize([r for r in runs if r["target"].startswith("tierfs-")], ["tierfs-r1", "tierfs-r2"])
    assert list(s["ratios"]) == ["tierfs-r2/tierfs-r1"]
    assert [g["name"] for g in s["goals"]] == ["replicas=2 randrw IOPS >= 80% of replicas=1"]


def test_report_of_a_result_before_the_pairs(tmp_path: Path) -> None:
    """A result written before issue 21 (goals with no pair, tierfs_fsck one object)
    still matches the schema and reports."""
    runs = [{**record(1, "randrw", t, iops=v), "machine": {}} for t, v in (("tierfs", 90.0), ("passthrough", 100.0))]
    s = bench_fs.summarize(runs, ["tierfs", "passthrough"])
    for g in s["goals"]:
        del g["pair"]
    doc = {"config": {"targets": ["tierfs", "passthrough"], "rounds": 1}, "runs": runs, "summary": s,
           "tierfs_fsck": {"exit": 0, "summary": "fsck: 0 error(s), 0 repaired, 0 note(s): clean"}}
    schema_doc = json.loads(SCHEMA.read_text())
    fsck_schema = {**schema_doc["properties"]["tierfs_fsck"], "$defs": schema_doc["$defs"]}
    jsonschema.Draft202012Validator(fsck_schema).validate(doc["tierfs_fsck"])
    assert "- randrw IOPS >= 80% of passthrough: 0.90 (target >= 0.8; per round 0.90): met" in \
        bench_fs.tables(doc, markdown=True)


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
