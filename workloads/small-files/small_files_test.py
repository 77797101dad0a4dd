"""small-files end to end: every file is read once per pass and timed, in a valid
results document with the bytes it read."""

from pathlib import Path

from tierlab import schema
from tierlab.testing import assert_one_line_error, run

HERE = Path(__file__).resolve().parent


def test_reads_every_file(tmp_path: Path) -> None:
    target = tmp_path / "t"
    target.mkdir()
    out = tmp_path / "r.json"
    proc = run([HERE / "run", "--dir", target, "--out", out, "--files", "300", "--size", "1000",
                "--per-dir", "50", "--passes", "2"])
    assert proc.returncode == 0, proc.stderr
    meas = schema.load(out)["measurements"]
    assert meas["ops"]["read-file"]["latency"]["count"] == 600
    assert meas["counters"]["bytes_read"] == 600 * 1000
    assert meas["throughput"]["ops"] == 600
    assert list(target.iterdir()) == []


def test_bad_numbers_are_one_line(tmp_path: Path) -> None:
    assert_one_line_error(run([HERE / "run", "--dir", tmp_path, "--out", tmp_path / "x.json",
                               "--files", "0"]), 2, "must be positive")
    assert_one_line_error(run([HERE / "run", "--dir", tmp_path, "--out", tmp_path / "x.json",
                               "--files", "many"]), 2, "invalid int value")
