"""metadata-storm end to end (2 s, a small tree, a background writer): every sweep
type is timed, each stat sample belongs to a sweep, the writer really wrote, and
parse.py rebuilds the document from the raw samples."""

from pathlib import Path

from tierlab import schema
from tierlab.testing import assert_one_line_error, run

HERE = Path(__file__).resolve().parent


def test_sweeps_while_writing(tmp_path: Path) -> None:
    target = tmp_path / "t"
    target.mkdir()
    out = tmp_path / "r.json"
    proc = run([HERE / "run", "--dir", target, "--out", out, "--duration", "1.5", "--dirs", "3",
                "--files", "20", "--writer-bytes", str(8 << 20), "--boot", "2"])
    assert proc.returncode == 0, proc.stderr
    doc = schema.load(out)
    meas = doc["measurements"]
    rounds = int(meas["counters"]["rounds"])
    assert rounds >= 1
    for op in ("ls-lR", "stat-all", "grep-r"):
        assert meas["ops"][op]["latency"]["count"] == rounds
    assert meas["ops"]["stat"]["latency"]["count"] == 60 * rounds
    assert meas["counters"]["writer_bytes"] > 0
    assert doc["manifest"]["boot"] == 2
    assert meas["timeseries"]["points"][0]["count"] > 0
    assert list(target.iterdir()) == []
    again = tmp_path / "again.json"
    proc = run([HERE / "parse.py", f"{out}.raw.json", "--out", again, "--boot", "2"])
    assert proc.returncode == 0, proc.stderr
    assert schema.load(again)["measurements"] == meas


def test_bad_raw_is_one_line(tmp_path: Path) -> None:
    raw = tmp_path / "raw.json"
    raw.write_text('{"samples": {}}')
    assert_one_line_error(run([HERE / "parse.py", raw, "--out", tmp_path / "x.json"]), 2,
                          "malformed")
