"""bench_host_sync: a tiny run prints every pattern with sane numbers, writes its
JSON and leaves no scratch file; bad input is one line and exit 1."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tierlab.testing import assert_one_line_error, run

HERE = Path(__file__).resolve().parent
WRAPPER = HERE / "bench-host-sync"
PATTERNS = ["odirect_write", "fdatasync", "dsync_write", "buffered_write_fsync", "ordered_commit",
            "unordered_commit"]


def direct_io_dir(tmp_path: Path) -> Path:
    """A directory on a disk that takes O_DIRECT: the test's own, else /var/tmp."""
    for d in (tmp_path, Path("/var/tmp")):
        probe = d / f"o_direct_probe.{os.getpid()}"
        try:
            os.close(os.open(probe, os.O_CREAT | os.O_RDWR | os.O_DIRECT, 0o600))
            return d
        except OSError:
            continue
        finally:
            probe.unlink(missing_ok=True)
    pytest.skip("no directory here takes O_DIRECT")


def test_a_small_run(tmp_path: Path) -> None:
    d = direct_io_dir(tmp_path)
    before = set(d.glob("bench-host-sync.*"))
    out = tmp_path / "r.json"
    proc = run([WRAPPER, "--dir", d, "--n", "20", "--size", "1M", "--json", out])
    assert proc.returncode == 0, proc.stderr
    for name in PATTERNS:
        assert any(line.startswith(name + " ") for line in proc.stdout.splitlines()), proc.stdout
    doc = json.loads(out.read_text())
    assert list(doc["results"]) == PATTERNS and doc["n"] == 20
    for r in doc["results"].values():
        assert 0 < r["p50_us"] <= r["p99_us"] < 10_000_000
    # Three syscalls take longer than one, on any disk.
    assert doc["results"]["ordered_commit"]["p50_us"] > doc["results"]["odirect_write"]["p50_us"]
    assert set(d.glob("bench-host-sync.*")) == before  # the scratch file is gone


def test_bad_input_is_one_line(tmp_path: Path) -> None:
    for args, needle in ((["--dir", tmp_path / "missing"], "not a directory"), (["--n", "0"], "at least 1"),
                         (["--size", "lots"], "not a size"), (["--size", "4K"], "too small"),
                         (["--bogus"], "unrecognized")):
        proc = run([WRAPPER, *map(str, args)])
        assert_one_line_error(proc, 1, "bench-host-sync:", needle)
