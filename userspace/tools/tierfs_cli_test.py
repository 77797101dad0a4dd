"""The tierfs command line end to end on image files: format, show, fsck and their
errors, fsck's exit codes on a damaged image, and the journal, btree and mount benchmarks' output."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tierlab.testing import assert_one_line_error, run, tool

SB_PRIMARY = 4096


def image(path: Path, mib: int) -> Path:
    with open(path, "wb") as f:
        f.truncate(mib << 20)
    return path


@pytest.fixture
def fs(tmp_path: Path) -> list[Path]:
    ssd, hdd = image(tmp_path / "ssd.img", 64), image(tmp_path / "hdd.img", 96)
    proc = run([tool("tierfs"), "format", "--label", "ssd.a", ssd, "--label", "hdd.b", hdd,
                "--foreground-target", "ssd", "--background-target", "hdd", "--bucket-size", "256K"])
    assert proc.returncode == 0, proc.stderr
    assert "formatted 2 device(s)" in proc.stdout
    return [ssd, hdd]


def test_format_show_fsck_round_trip(fs: list[Path]) -> None:
    proc = run([tool("tierfs"), "show", "--json", fs[1], fs[0]])  # any order
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["clean"] is True
    assert doc["bucket_size"] == 256 << 10
    assert doc["options"]["foreground_target"] == "ssd"
    labels = [m["label"] for m in doc["members"]]
    assert labels == ["ssd.a", "hdd.b"]
    ssd, hdd = doc["members"]
    assert ssd["journal_buckets"] > 0 and hdd["journal_buckets"] == 0
    assert ssd["data_allowed"] == ["journal", "btree", "user"] and hdd["data_allowed"] == ["user"]
    assert ssd["buckets"]["journal"] == ssd["journal_buckets"]
    assert sum(ssd["buckets"].values()) == ssd["nbuckets"]
    text = run([tool("tierfs"), "show", *fs])
    assert "ssd.a" in text.stdout and "clean" in text.stdout
    proc = run([tool("tierfs"), "fsck", *fs])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "clean" in proc.stdout


def test_fsck_exit_codes_on_a_damaged_superblock(fs: list[Path]) -> None:
    with open(fs[1], "r+b") as f:  # flip bytes in the HDD's primary superblock copy
        f.seek(SB_PRIMARY + 200)
        f.write(b"\xde\xad\xbe\xef")
    proc = run([tool("tierfs"), "fsck", "-n", *fs])
    assert proc.returncode == 4, proc.stdout
    assert "superblock copies disagree" in proc.stdout
    proc = run([tool("fsck.tierfs"), "-y", *fs])
    assert proc.returncode == 1, proc.stdout
    proc = run([tool("tierfs"), "fsck", *fs])
    assert proc.returncode == 0, proc.stdout


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


def set_sb_flag(dev: Path, bit: int) -> None:
    """Sets a flag bit in both superblock copies of a member (flags at 42,
    the CRC-32C at 8 over the 8192 bytes with it zeroed: docs/format/superblock.md)."""
    with open(dev, "r+b") as f:
        for at in (SB_PRIMARY, 512 * 1024):
            f.seek(at)
            sb = bytearray(f.read(8192))
            flags = int.from_bytes(sb[42:44], "little") | (1 << bit)
            sb[42:44] = flags.to_bytes(2, "little")
            sb[8:12] = b"\0\0\0\0"
            sb[8:12] = crc32c(bytes(sb)).to_bytes(4, "little")
            f.seek(at)
            f.write(sb)


def test_an_unfinished_accounting_repair_is_shown_and_finished_by_fsck(fs: list[Path]) -> None:
    for dev in fs:
        set_sb_flag(dev, 4)  # kSbAcctRepair: an fsck -y cut short in its recount of the counts
    doc = json.loads(run([tool("tierfs"), "show", "--json", *fs]).stdout)
    assert doc["accounting_repair_unfinished"] is True
    assert "repair of the space accounting was cut short" in run([tool("tierfs"), "show", *fs]).stdout
    proc = run([tool("tierfs"), "fsck", "-n", *fs])
    assert proc.returncode == 4, proc.stdout
    assert "cut short in its repair of the space accounting" in proc.stdout
    proc = run([tool("tierfs"), "fsck", "-y", *fs])
    assert proc.returncode == 1, proc.stdout
    doc = json.loads(run([tool("tierfs"), "show", "--json", *fs]).stdout)
    assert doc["accounting_repair_unfinished"] is False
    proc = run([tool("tierfs"), "fsck", *fs])
    assert proc.returncode == 0, proc.stdout


def test_format_refuses_formatted_devices_without_force(fs: list[Path]) -> None:
    proc = run([tool("mkfs.tierfs"), fs[0]])
    assert_one_line_error(proc, 1, "already holds a tierfs filesystem", "--force")
    proc = run([tool("mkfs.tierfs"), "--force", fs[0]])
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("args,needle", [
    (["format", "/nonexistent/dev.img"], "no such file"),
    (["format", "--bucket-size", "3Q", "X"], "bad bucket size"),
    (["format", "--label", "ssd.a"], "not followed by a device"),
])
def test_format_bad_input(tmp_path: Path, args: list[str], needle: str) -> None:
    proc = run([tool("tierfs"), *args])
    assert proc.returncode != 0
    assert needle in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_format_too_small_and_bad_target(tmp_path: Path) -> None:
    small = image(tmp_path / "small.img", 2)
    assert_one_line_error(run([tool("tierfs"), "format", small]), 1, "too small")
    ok = image(tmp_path / "ok.img", 64)
    assert_one_line_error(run([tool("tierfs"), "format", "--label", "ssd", ok,
                               "--background-target", "hdd"]), 1, "background target 'hdd'")


def test_show_and_fsck_refuse_foreign_devices(tmp_path: Path, fs: list[Path]) -> None:
    blank = image(tmp_path / "blank.img", 64)
    assert_one_line_error(run([tool("tierfs"), "show", blank]), 1, "not a tierfs device")
    proc = run([tool("tierfs"), "show", fs[0]])  # a member missing
    assert_one_line_error(proc, 1, "missing: hdd.b")
    # fsck(8)'s operational error: a set that is not one whole filesystem, or a
    # device with no superblock, cannot be checked at all (it was 4).
    proc = run([tool("tierfs"), "fsck", fs[0]])
    assert proc.returncode == 8 and "missing: hdd.b" in proc.stdout, proc.stdout
    proc = run([tool("tierfs"), "fsck", "-n", blank])
    assert proc.returncode == 8 and "no valid superblock" in proc.stdout, proc.stdout


@pytest.mark.parametrize("args,code,needle", [
    (["format", "--bogus", "X"], 2, "--bogus"),
    (["format"], 2, "devices is required"),
    (["fsck", "--frob", "X"], 16, "--frob"),
    (["fsck"], 16, "devices is required"),
    (["fsck", "-n", "-y", "X"], 16, "-n and -y"),
    (["show"], 2, "devices is required"),
    (["mount", "X"], 2, "args"),
    (["ctl"], 2, "mountpoint is required"),
    (["setopt"], 2, "paths is required"),
    (["setopt", "X", "--bogus", "1"], 2, "--bogus"),
    (["setopt", "X"], 2, "nothing to set"),
    (["getopt"], 2, "paths is required"),
    (["bench", "journal", "--commits", "x"], 2, "--commits"),
    (["bench", "btree", "--nope"], 2, "--nope"),
    (["bench", "mount", "--mounts", "0"], 2, "--mounts"),
])
def test_command_line_mistakes_are_one_line(args: list[str], code: int, needle: str) -> None:
    """CLI11 reports a parse error in two lines with its own exit codes (104-114);
    each command says it in one line, with usage's exit code (fsck: 16, as fsck(8))."""
    proc = run([tool("tierfs"), *args])
    assert_one_line_error(proc, code, needle, "--help")
    assert proc.stderr.startswith("tierfs "), proc.stderr


def test_setopt_says_tierfs_inherited_is_read_only() -> None:
    """It names the inherited options (getopt shows them): nothing to unset."""
    for name in ("inherited", "tierfs.inherited"):
        assert_one_line_error(run([tool("tierfs"), "setopt", "X", "--unset", name]), 2, f"'{name}' is read-only")


def test_help_is_still_exit_0() -> None:
    for cmd in ("format", "fsck", "mount", "show", "ctl", "setopt", "getopt"):
        proc = run([tool("tierfs"), cmd, "--help"])
        assert proc.returncode == 0 and "Usage" in proc.stdout and not proc.stderr, (cmd, proc.stderr)


def test_replicas_are_accepted_and_shown(tmp_path: Path) -> None:
    """Data replicas are honoured (issue 21 step 5a): --replicas 2 formats, on
    two devices or on one (then writes are degraded: one copy, counted), and
    show reports it; outside 1..4 is still refused."""
    a, b = image(tmp_path / "a.img", 64), image(tmp_path / "b.img", 64)
    for devs in ([a, b], [a]):
        proc = run([tool("tierfs"), "format", "-f", "--replicas", "2", *devs])
        assert proc.returncode == 0, proc.stderr
        doc = json.loads(run([tool("tierfs"), "show", "--json", *devs]).stdout)
        assert doc["options"]["data_replicas"] == 2
    assert_one_line_error(run([tool("tierfs"), "format", "-f", "--replicas", "5", a]), 2, "replicas must be 1..4")


def test_a_fifo_or_directory_is_no_member(tmp_path: Path) -> None:
    """mount, fsck and format opened the path (to lock it) before checking its
    type: on a FIFO the open waited forever for a writer."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    for args in (["mount", fifo, mnt], ["fsck", fifo], ["format", fifo], ["show", fifo], ["mount", tmp_path, mnt]):
        proc = run([tool("tierfs"), *args], timeout=60)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode != 0 and len(lines) == 1, (args, proc.stderr)
        assert "not a regular file or block device" in lines[0], (args, lines)
    assert not os.path.ismount(mnt)


def test_unknown_command() -> None:
    proc = run([tool("tierfs"), "frobnicate"])
    assert proc.returncode == 2 and "unknown command" in proc.stderr


def test_bench_journal_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = run([tool("tierfs"), "bench", "journal", "--commits", "300", "--threads", "1,2",
                "--dir", tmp_path, "--image-size", "64M", "--json", out])
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    phases = {(p["mode"], p["threads"]): p for p in doc["phases"]}
    assert set(phases) == {("noflush", 1), ("noflush", 2), ("flush", 1), ("flush", 2)}
    for p in phases.values():
        assert p["commits"] == 300 and p["commits_per_sec"] > 0
        assert p["latency_p50_us"] <= p["latency_p99_us"] <= p["latency_max_us"]
    # Every flush commit is durable: one flush entry at most per commit; no-flush
    # commits are grouped into far fewer entries than commits.
    assert 0 < phases[("flush", 1)]["flush_entries"] <= 300
    assert phases[("noflush", 1)]["entries"] < 300
    assert not list(tmp_path.glob("tierfs-bench-journal-*.img"))  # cleaned up


def test_bench_mount_writes_json(tmp_path: Path) -> None:
    """Two small images, each filled, then timed clean and after a cut: every
    mount of the dirty image replayed the journal, every stage is timed."""
    out = tmp_path / "mount.json"
    proc = run([tool("tierfs"), "bench", "mount", "--sizes", "8M,16M", "--file-sizes", "4K,64K",
                "--mounts", "2", "--dir", tmp_path, "--json", out])
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "mount" and doc["mounts"] == 2
    assert [i["data_bytes"] for i in doc["images"]] == [8 << 20, 16 << 20]
    for image in doc["images"]:
        # The same bytes of each size: 4 MiB of 4 KiB files and of 64 KiB ones.
        want = image["data_bytes"] // 2 // 4096 + image["data_bytes"] // 2 // 65536
        assert image["files"] == want, image
        assert image["extents"] >= image["files"]
        for state in ("clean", "dirty"):
            each = image[state]["each"]
            assert len(each) == 2 and image[state]["mounts"] == 2
            for m in each:
                assert m["store_ms"] > 0 and m["data_ms"] > 0 and m["posix_ms"] > 0, m
                assert (m["replayed_keys"] > 0) == (state == "dirty"), m
            assert image[state]["total_ms_median"] > 0
    assert "clean" in proc.stdout and "dirty" in proc.stdout
    assert not list(tmp_path.glob("tierfs-bench-mount-*.img"))  # cleaned up


@pytest.mark.parametrize("args,needle", [
    (["--sizes", "1K"], "--sizes: '1K' is not a size from 4M to 1T"),
    (["--sizes", "1G,lots"], "--sizes: 'lots'"),
    (["--file-sizes", "1000"], "--file-sizes: '1000' is not a multiple of 4K"),
])
def test_bench_mount_bad_sizes_are_one_line(tmp_path: Path, args: list[str], needle: str) -> None:
    assert_one_line_error(run([tool("tierfs"), "bench", "mount", "--dir", tmp_path, *args]), 2, needle)
    assert not list(tmp_path.iterdir())  # nothing made


BTREE_PHASES = ["seq_insert", "seq_lookup", "seq_delete", "rand_insert", "rand_lookup", "rand_mixed"]


@pytest.mark.parametrize("threads", [1, 2])
def test_bench_btree_writes_json(tmp_path: Path, threads: int) -> None:
    n = 20000
    out = tmp_path / "btree.json"
    proc = run([tool("tierfs"), "bench", "btree", "--workload", ",".join(BTREE_PHASES), "--n", str(n),
                "--threads", str(threads), "--dir", tmp_path, "--json", out], timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "seq_insert" in proc.stdout and "rand_mixed" in proc.stdout
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "btree"
    cfg = doc["config"]
    assert cfg["n"] == n and cfg["threads"] == threads and cfg["rand_ops"] == n // 10
    assert cfg["workloads"] == BTREE_PHASES and cfg["setup_phases"] == []
    assert cfg["cache_bytes"] > 0 and cfg["node_size"] > 0
    assert doc["machine"]["cpus"] >= 1 and doc["machine"]["kernel"]
    phases = {p["phase"]: p for p in doc["phases"]}
    assert list(phases) == BTREE_PHASES
    for name, p in phases.items():
        assert p["threads"] == threads
        assert p["ops"] == (n if name in ("seq_insert", "seq_lookup", "seq_delete", "rand_insert") else n // 10)
        assert p["seconds"] > 0 and p["ops_per_sec"] > 0 and p["ns_per_op"] > 0
        assert abs(p["ops_per_sec"] * p["seconds"] - p["ops"]) < 1e-6 * p["ops"] + 1
        assert p["cpu_seconds"] >= 0 and p["peak_rss_kib"] > 0
        assert p["bytes_written"] == sum(d["bytes_written"] for d in p["devices"])
        for key in ("splits", "node_reads", "node_writes", "cache_hits", "cache_misses", "evictions", "restarts",
                    "commits", "depth", "cached_nodes", "dirty_bytes"):
            assert key in p["btree"], (name, key)
    # One transaction per update, and every writing phase ends durable in the journal.
    assert phases["seq_insert"]["btree"]["commits"] == n
    assert phases["seq_insert"]["btree"]["inserts"] == n
    assert phases["seq_delete"]["btree"]["commits"] == n
    assert phases["seq_delete"]["btree"]["deletes"] == n
    assert phases["rand_insert"]["btree"]["commits"] == n
    assert phases["rand_mixed"]["btree"]["commits"] == n // 10 // 4
    assert phases["rand_lookup"]["btree"]["commits"] == 0
    for name in ("seq_insert", "seq_delete", "rand_insert", "rand_mixed"):
        assert phases[name]["devices"][0]["bytes_written_by_origin"].get("journal", 0) > 0, name
    assert phases["rand_insert"]["btree"]["depth"] >= 1
    assert not list(tmp_path.glob("tierfs-bench-btree-*.img"))  # cleaned up


def test_bench_btree_two_node_copies(tmp_path: Path) -> None:
    """--metadata-replicas 2: two images, and every node the checkpoints write goes to both."""
    out = tmp_path / "btree.json"
    proc = run([tool("tierfs"), "bench", "btree", "--workload", "rand_insert", "--n", "20000",
                "--metadata-replicas", "2", "--cache-mb", "1", "--dir", tmp_path, "--json", out], timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "2 node copies" in proc.stdout
    doc = json.loads(out.read_text())
    assert doc["config"]["metadata_replicas"] == 2
    (p,) = doc["phases"]
    assert p["btree"]["node_writes"] > 0  # (a 1 MiB cache: checkpoints during the phase)
    written = [d["bytes_written_by_origin"].get("btree", 0) for d in p["devices"]]
    assert len(written) == 2 and written[0] > 0 and written[0] == written[1], written
    assert doc["final_btree"]["degraded_nodes"] == 0
    assert not list(tmp_path.glob("tierfs-bench-btree-*.img"))  # both cleaned up


def test_bench_btree_runs_missing_setup(tmp_path: Path) -> None:
    """A lookup phase alone first inserts its keys untimed, and reports only itself."""
    out = tmp_path / "btree.json"
    proc = run([tool("tierfs"), "bench", "btree", "--workload", "rand_lookup", "--n", "5000",
                "--dir", tmp_path, "--json", out], timeout=60)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert doc["config"]["setup_phases"] == ["rand_insert"]
    assert [p["phase"] for p in doc["phases"]] == ["rand_lookup"]


@pytest.mark.parametrize("args,code,needle", [
    (["--n", "0"], 2, "--n"),
    (["--n", "ten"], 2, "--n"),
    (["--n", "1000", "--threads", "0"], 2, "--threads"),
    (["--n", "1000", "--metadata-replicas", "5"], 2, "--metadata-replicas"),
    (["--n", "1000", "--workload", "seq_insert,seq_frob"], 2, "unknown workload 'seq_frob'"),
    (["--n", "1000", "--cache-mb", "-3"], 2, "--cache-mb"),
    (["--n", "1000", "--image-size", "1M"], 2, "--image-size"),
    (["--bogus"], 2, "--bogus"),
    (["--n", "1000", "--dir", "/nonexistent/dir"], 1, "/nonexistent/dir"),
    (["--n", "1000", "--json", "/nonexistent/dir/out.json"], 2, "cannot write"),
])
def test_bench_btree_bad_input(tmp_path: Path, args: list[str], code: int, needle: str) -> None:
    proc = run([tool("tierfs"), "bench", "btree", *args], cwd=tmp_path)
    assert_one_line_error(proc, code, needle)


def test_bench_unknown_benchmark() -> None:
    assert_one_line_error(run([tool("tierfs"), "bench", "frob"]), 2, "unknown benchmark 'frob'")
