"""fio-randrw end to end on a temporary directory (1 s, 8 MiB): the run script's
output is a valid results document with both directions' histograms, fio's own
numbers agree with the parsed ones, parse.py rebuilds the same measurements from
fio's JSON, and a bad directory or malformed fio JSON is one line."""

import json
from pathlib import Path
from typing import Any

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


def _fio_doc() -> dict[str, Any]:
    """A minimal fio json+ document with one read job of two I/Os."""
    return {"fio version": "fio-3.33", "timestamp_ms": 1_700_000_000_000, "time": "t",
            "jobs": [{"jobname": "r", "error": 0, "job_runtime": 1000, "elapsed": 1,
                      "usr_cpu": 1.0, "sys_cpu": 1.0,
                      "read": {"total_ios": 2, "iops": 2.0, "bw_bytes": 8192, "io_bytes": 8192,
                               "runtime": 1000,
                               "clat_ns": {"min": 1000, "max": 2000, "mean": 1500.0,
                                           "stddev": 500.0, "percentile": {},
                                           "bins": {"1000": 1, "2000": 1}}},
                      "write": {"total_ios": 0}}]}


def test_malformed_fio_output_is_one_line(tmp_path: Path) -> None:
    def parse(doc: Any, name: str) -> Any:
        src = tmp_path / f"{name}.fio.json"
        src.write_text(json.dumps(doc))
        return run([HERE / "parse.py", src, "--dir", tmp_path, "--out", tmp_path / f"{name}.json"])

    ok = parse(_fio_doc(), "ok")
    assert ok.returncode == 0, ok.stderr
    assert schema.load(tmp_path / "ok.json")["measurements"]["ops"]["read"]["latency"]["count"] == 2

    bad_bin = _fio_doc()
    bad_bin["jobs"][0]["read"]["clat_ns"]["bins"] = {"fast": 2}
    no_min = _fio_doc()
    del no_min["jobs"][0]["read"]["clat_ns"]["min"]
    bad_job = _fio_doc()
    bad_job["jobs"] = ["r"]
    bad_time = _fio_doc()
    bad_time["timestamp_ms"] = "soon"
    bad_ios = _fio_doc()
    bad_ios["jobs"][0]["read"]["total_ios"] = "2"
    for name, doc, needle in (("bin", bad_bin, "ValueError"), ("min", no_min, "KeyError"),
                              ("list", [1, 2], "not an object"),
                              ("job", bad_job, "malformed"), ("time", bad_time, "ValueError"),
                              ("ios", bad_ios, "malformed")):
        assert_one_line_error(parse(doc, name), 2, "fio output is", needle)
        assert not (tmp_path / f"{name}.json").exists()
    binary = tmp_path / "binary.fio.json"
    binary.write_bytes(b"{\"jobs\": \"\xff\xfe\"}")
    assert_one_line_error(run([HERE / "parse.py", binary, "--dir", tmp_path, "--out",
                               tmp_path / "x.json"]), 2, "not fio JSON output")
