"""fio-randrw end to end on a temporary directory (1 s, 8 MiB): the run script's
output is a valid results document with both directions' histograms, fio's own
numbers agree with the parsed ones, parse.py rebuilds the same measurements from
fio's JSON, and a bad directory is one line."""

from pathlib import Path

from tierlab import schema
from tierlab.testing import assert_one_line_error, run

HERE = Path(__file__).resolve().parent


def test_run_and_reparse(tmp_path: Path) -> None:
    target = tmp_path / "t"
    target.mkdir()
    out = tmp_path / "r.json"
    proc = run([HERE / "run", "--dir", target, "--out", out, "--runtime", "1", "--size", "8M",
                "--arm", "active", "--pair", "1"])
    assert proc.returncode == 0, proc.stderr
    doc = schema.load(out)
    meas = doc["measurements"]
    assert set(meas["ops"]) == {"read", "write", "all"}
    assert doc["manifest"]["workload"] == "fio-randrw" and doc["manifest"]["arm"] == "active"
    assert doc["manifest"]["tool_versions"]["fio"].startswith("fio-")
    jobs = meas["fio"]["jobs"]
    assert len(jobs) == 2  # numjobs=2
    ios = sum(j[d]["ios"] for j in jobs for d in ("read", "write"))
    assert meas["throughput"]["ops"] == ios == meas["ops"]["all"]["latency"]["count"]
    fio_max = max(j["read"]["lat_ns"]["max"] for j in jobs)
    assert meas["ops"]["read"]["latency"]["max"] == fio_max
    assert list(target.iterdir()) == []  # fio's files removed
    again = tmp_path / "again.json"
    proc = run([HERE / "parse.py", f"{out}.fio.json", "--dir", target, "--out", again])
    assert proc.returncode == 0, proc.stderr
    assert schema.load(again)["measurements"]["ops"] == meas["ops"]


def test_missing_dir_is_one_line(tmp_path: Path) -> None:
    assert_one_line_error(run([HERE / "run", "--dir", tmp_path / "no", "--out",
                               tmp_path / "x.json"]), 2, "no such directory")
