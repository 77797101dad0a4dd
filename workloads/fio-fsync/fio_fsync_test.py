"""fio-fsync end to end on a temporary directory (1 s): every write is followed by
an fsync, both are histograms in a valid results document."""

from pathlib import Path

from tierlab import schema
from tierlab.testing import assert_one_line_error, run

HERE = Path(__file__).resolve().parent


def test_writes_and_fsyncs(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    proc = run([HERE / "run", "--dir", tmp_path, "--out", out, "--runtime", "1", "--size", "4M"])
    assert proc.returncode == 0, proc.stderr
    meas = schema.load(out)["measurements"]
    writes = meas["ops"]["write"]["latency"]["count"]
    fsyncs = meas["ops"]["fsync"]["latency"]["count"]
    assert writes > 10 and abs(fsyncs - writes) <= 2  # fsync=1: one per write
    assert meas["throughput"]["ops"] == writes


def test_bad_fio_output_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "fio.json"
    bad.write_text('{"fio version": "fio-3.33", "jobs": []}')
    assert_one_line_error(run([HERE / "parse.py", bad, "--dir", tmp_path, "--out",
                               tmp_path / "x.json"]), 2, "no jobs")
