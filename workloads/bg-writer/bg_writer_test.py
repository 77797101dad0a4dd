"""bg-writer end to end: it writes exactly what it was asked to (16 MiB in 1 MiB
writes) and reports bandwidth in a valid results document."""

from pathlib import Path

from tierlab import schema
from tierlab.testing import run

HERE = Path(__file__).resolve().parent


def test_writes_the_requested_bytes(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    proc = run([HERE / "run", "--dir", tmp_path, "--out", out, "--size", "16M", "--files", "2"])
    assert proc.returncode == 0, proc.stderr
    meas = schema.load(out)["measurements"]
    assert meas["ops"]["write"]["latency"]["count"] == 16
    assert meas["fio"]["jobs"][0]["write"]["io_bytes"] == 16 << 20
    assert meas["throughput"]["bytes_per_s"] > 0
