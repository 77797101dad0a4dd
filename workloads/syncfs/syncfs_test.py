"""syncfs end to end (1.5 s, calls every 0.1 s, a background writer): the calls are
timed and paced as asked, in a valid results document."""

from pathlib import Path

from tierlab import schema
from tierlab.testing import assert_one_line_error, run

HERE = Path(__file__).resolve().parent


def test_times_syncfs_under_load(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    proc = run([HERE / "run", "--dir", tmp_path, "--out", out, "--duration", "1.5",
                "--interval", "0.1", "--writer-bytes", str(16 << 20)])
    assert proc.returncode == 0, proc.stderr
    meas = schema.load(out)["measurements"]
    calls = meas["ops"]["syncfs"]["latency"]["count"]
    assert calls == meas["counters"]["calls"]
    assert 3 <= calls <= 16  # paced at 0.1 s, slower when a syncfs takes long
    assert meas["counters"]["writer_bytes"] > 0


def test_missing_dir_is_one_line(tmp_path: Path) -> None:
    assert_one_line_error(run([HERE / "run", "--dir", tmp_path / "nope", "--out",
                               tmp_path / "x.json"]), 2, "no such directory")
