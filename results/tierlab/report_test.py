"""`tierlab report` on synthetic runs with known differences: the files it writes,
well-formed self-contained HTML with every plot embedded, the numbers, the gate
and its exit code, and one-line errors for bad input. Runs the command the build
places in build/bin/, as a user would."""

from __future__ import annotations

import base64
import json
import time
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from tierlab import schema
from tierlab.testing import assert_one_line_error, run, synthetic_run, tool

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_runs(d: Path, name: str, n: int, scale: float, arm: str, **kw: Any) -> list[Path]:
    d.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        p = d / f"{name}{i}.json"
        schema.write(synthetic_run(seed=sum(map(ord, name)) * 100 + i, arm=arm, pair=i, scale=scale,
                                   **kw), p)
        paths.append(p)
    return paths


class TagChecker(HTMLParser):
    """Every non-void element closed in order; collects <img> attributes."""

    VOID = {"meta", "img", "br", "hr", "link", "input"}

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.imgs: list[dict[str, str | None]] = []
        self.errors: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "img":
            self.imgs.append(dict(attrs))
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in self.VOID:
            self.errors.append(f"<{tag} /> is not a void element")
        self.handle_starttag(tag, attrs)

    def handle_endtag(self, tag: str) -> None:
        if tag in self.VOID:
            self.errors.append(f"</{tag}> closes a void element")
        elif not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:]}")
        else:
            self.stack.pop()


@pytest.fixture(scope="module")
def slow_b(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], list[Path], Path]:
    d = tmp_path_factory.mktemp("runs")
    a = write_runs(d / "a", "a", 4, 1.0, "control")
    b = write_runs(d / "b", "b", 4, 1.5, "active")
    return a, b, d


def test_report_writes_wellformed_selfcontained_html(slow_b: Any, tmp_path: Path) -> None:
    a, b, _ = slow_b
    out = tmp_path / "out"
    proc = run([tool("tierlab"), "report", "--a", *a, "--b", *b, "-o", out])
    assert proc.returncode == 0, proc.stderr
    html = (out / "report.html").read_text()
    # Well-formed: parses as XML (after the doctype) and every tag closes in order.
    ET.fromstring(html.split("\n", 1)[1])
    checker = TagChecker()
    checker.feed(html)
    assert not checker.errors and not checker.stack, (checker.errors, checker.stack)
    # Every plot embedded as a PNG data URI; nothing loaded from elsewhere.
    ids = sorted(str(i["id"]) for i in checker.imgs)
    assert ids == ["plot-cdf", "plot-p99_runs", "plot-timeseries"]
    for img in checker.imgs:
        src = str(img["src"])
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1]).startswith(PNG_MAGIC)
    assert "http" not in html.replace("https://json-schema", "")
    for name in ("cdf", "p99_runs", "timeseries"):
        assert (out / f"{name}.png").read_bytes().startswith(PNG_MAGIC)
        assert f"]({name}.png)" in (out / "report.md").read_text()


def test_report_finds_the_planted_difference(slow_b: Any, tmp_path: Path) -> None:
    a, b, _ = slow_b
    out = tmp_path / "out"
    proc = run([tool("tierlab"), "report", "--a", *a, "--b", *b, "-o", out])
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["method"] == "pairs" and summary["labels"] == ["control", "active"]
    # B is A's distribution scaled by 1.5: every p50 and p99 ratio is significant
    # and near 1.5 (runs are 5000 samples, so each run's p99 moves by a few %).
    for row in summary["table"]:
        if row["stat"] in ("p50", "p99"):
            assert row["significant"] and 1.35 < row["lo"] and 1.35 < row["ratio"] < 1.65, row
    all_p50 = next(r for r in summary["table"] if r["op"] == "all" and r["stat"] == "p50")
    assert all_p50["lo"] < 1.5 < all_p50["hi"], all_p50
    md = (out / "report.md").read_text()
    assert "| all | p99 |" in md and "significant" in md
    assert "p99 active/control" in proc.stdout


def test_gate_pass_and_fail_set_the_exit_code(slow_b: Any, tmp_path: Path) -> None:
    a, b, d = slow_b
    gate = d / "gate.txt"
    gate.write_text("# bounds\np99_ratio_max = 2.0\nthroughput_ratio_min = 0.9\nmax_latency = 10s\n")
    ok = run([tool("tierlab"), "report", "--a", *a, "--b", *b, "-o", tmp_path / "ok",
              "--gate", gate])
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "PASS p99 ratio" in ok.stdout and "gate: PASS" in ok.stdout
    html = (tmp_path / "ok" / "report.html").read_text()
    assert "Gate: <span class=\"pass\">PASS" in html
    # The command-line bound overrides the file's and fails the gate.
    bad = run([tool("tierlab"), "report", "--a", *a, "--b", *b, "-o", tmp_path / "bad",
               "--gate", gate, "--max-p99-ratio", "1.1", "--max-latency", "1ms"])
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "FAIL p99 ratio" in bad.stdout and "FAIL max latency" in bad.stdout
    assert "PASS throughput ratio" in bad.stdout
    assert "- **FAIL** p99 ratio" in (tmp_path / "bad" / "report.md").read_text()


def test_gate_flags_runs_that_fell_behind(tmp_path: Path) -> None:
    a = write_runs(tmp_path / "a", "a", 2, 1.0, "control")
    b = write_runs(tmp_path / "b", "b", 2, 1.0, "active", fell_behind=True)
    proc = run([tool("tierlab"), "report", "--a", *a, "--b", *b, "-o", tmp_path / "o",
                "--max-p99-ratio", "10"])
    assert proc.returncode == 1
    assert "FAIL rate kept" in proc.stdout
    assert "fell behind" in (tmp_path / "o" / "report.md").read_text()


def test_single_runs_use_the_operations_bootstrap(tmp_path: Path) -> None:
    a = write_runs(tmp_path / "a", "a", 1, 1.0, "other", with_series=False)
    b = write_runs(tmp_path / "b", "b", 1, 1.0, "other", with_series=False)
    proc = run([tool("tierlab"), "report", "--a", *a, "--b", *b, "-o", tmp_path / "o"])
    assert proc.returncode == 0, proc.stderr
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert s["method"] == "operations" and s["labels"] == ["A", "B"]
    assert not (tmp_path / "o" / "timeseries.png").exists()  # no series, no plot
    assert "sampling noise only" in (tmp_path / "o" / "report.md").read_text()


def test_large_inputs_stay_fast(tmp_path: Path) -> None:
    # 2 x 10 runs of 10 million operations each: histograms, not samples.
    def big(seed: int, arm: str) -> dict[str, Any]:
        doc = synthetic_run(seed=seed, arm=arm, n=2000)
        for op in doc["measurements"]["ops"].values():
            for h in op.values():
                for bucket in h["buckets"]:
                    bucket[2] *= 5000
                h["count"] *= 5000
                h["sum"] *= 5000
        return doc
    a, b = [], []
    for i in range(10):
        for arm, lst in (("control", a), ("active", b)):
            p = tmp_path / f"{arm}{i}.json"
            schema.write(big(i + (100 if arm == "active" else 0), arm), p)
            lst.append(p)
    t0 = time.monotonic()
    proc = run([tool("tierlab"), "report", "--a", *a, "--b", *b, "-o", tmp_path / "o"])
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - t0 < 60


def test_bad_input_is_one_line_exit_2(slow_b: Any, tmp_path: Path) -> None:
    a, b, d = slow_b
    t = tool("tierlab")
    assert_one_line_error(run([t, "report", "--a", tmp_path / "nope.json", "--b", *b, "-o",
                               tmp_path]), 2, "no such file")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    assert_one_line_error(run([t, "report", "--a", bad, "--b", *b, "-o", tmp_path]), 2,
                          "not JSON")
    invalid = tmp_path / "invalid.json"
    doc = json.loads(a[0].read_text())
    doc["manifest"]["arm"] = "sideways"
    invalid.write_text(json.dumps(doc))
    assert_one_line_error(run([t, "report", "--a", invalid, "--b", *b, "-o", tmp_path]), 2,
                          "manifest/arm")
    gate = tmp_path / "gate.txt"
    gate.write_text("p99_ratio = 1.1\n")
    assert_one_line_error(run([t, "report", "--a", *a, "--b", *b, "-o", tmp_path, "--gate",
                               gate]), 2, "unknown gate key")
    other = tmp_path / "other.json"
    schema.write(synthetic_run(seed=1, ops=("stat",)), other)
    doc = json.loads(other.read_text())
    del doc["measurements"]["ops"]["all"]
    other.write_text(json.dumps(doc))
    assert_one_line_error(run([t, "report", "--a", other, "--b", *b, "-o", tmp_path]), 2,
                          "no op in common")
    assert_one_line_error(run([t, "report", "--a", *a]), 2, "required")
    assert_one_line_error(run([t, "frobnicate"]), 2, "invalid choice")


def test_validate_subcommand(slow_b: Any, tmp_path: Path) -> None:
    a, _, _ = slow_b
    ok = run([tool("tierlab"), "validate", *a])
    assert ok.returncode == 0 and ok.stdout.count(": ok") == len(a)
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    proc = run([tool("tierlab"), "validate", bad])
    assert proc.returncode == 1 and "is not of type 'object'" in proc.stderr


def _empty_op(path: Path, op: str) -> None:
    """Rewrites a run so that `op` had no operations in it (a valid document)."""
    doc = json.loads(path.read_text())
    empty = {"unit": "ns", "count": 0, "min": 0, "max": 0, "sum": 0, "p50": 0, "p90": 0,
             "p99": 0, "p999": 0, "buckets": []}
    doc["measurements"]["ops"][op] = {"latency": dict(empty), "service": dict(empty)}
    schema.write(doc, path)


def test_runs_without_operations_of_an_op_are_left_out(tmp_path: Path) -> None:
    # Pair 1 of arm B did no writes: its write quantiles are not 0 (a ratio of
    # tens of thousands), it is left out with its pair.
    a = write_runs(tmp_path / "a", "a", 3, 1.0, "control")
    b = write_runs(tmp_path / "b", "b", 3, 1.0, "active")
    _empty_op(b[1], "write")
    proc = run([tool("tierlab"), "report", "--a", *a, "--b", *b, "-o", tmp_path / "o",
                "--gate-op", "write", "--max-p99-ratio", "1.5"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    for row in s["table"]:
        if row["op"] == "write":
            assert 0.7 < row["ratio"] < 1.4, row
            assert len(row["a_runs"]) == len(row["b_runs"]) == 2 and row["method"] == "pairs"
        else:
            assert len(row["a_runs"]) == len(row["b_runs"]) == 3
    # Unpaired runs: only the empty run is left out.
    for p in a + b:
        doc = json.loads(p.read_text())
        doc["manifest"]["pair"] = None
        p.write_text(json.dumps(doc))
    proc = run([tool("tierlab"), "report", "--a", *a, "--b", *b, "-o", tmp_path / "u"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    s = json.loads((tmp_path / "u" / "summary.json").read_text())
    row = next(r for r in s["table"] if r["op"] == "write" and r["stat"] == "p99")
    assert (len(row["a_runs"]), len(row["b_runs"])) == (3, 2) and 0.7 < row["ratio"] < 1.4


def test_an_op_without_operations_in_an_arm(tmp_path: Path) -> None:
    a = write_runs(tmp_path / "a", "a", 2, 1.0, "control")
    b = write_runs(tmp_path / "b", "b", 2, 1.0, "active")
    for p in b:
        _empty_op(p, "write")
    t = tool("tierlab")
    # Without a gate on it, the op is left out of the comparison ...
    proc = run([t, "report", "--a", *a, "--b", *b, "-o", tmp_path / "o", "--max-p99-ratio", "2"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert s["no_data"] == ["write"] and "write" not in s["ops"]
    assert {row["op"] for row in s["table"]} == {"read", "all"}
    # ... and a gate on it cannot be decided: one line, exit 2.
    assert_one_line_error(run([t, "report", "--a", *a, "--b", *b, "-o", tmp_path / "g",
                               "--gate-op", "write", "--max-p99-ratio", "2"]), 2,
                          "gate op 'write' has no operations in any run of arm B")


def test_binary_and_deeply_nested_input_is_one_line(slow_b: Any, tmp_path: Path) -> None:
    a, b, _ = slow_b
    t = tool("tierlab")
    assert_one_line_error(run([t, "report", "--a", "/bin/true", "--b", *b, "-o", tmp_path]), 2,
                          "/bin/true: not JSON", "UTF-8")
    assert_one_line_error(run([t, "validate", "/bin/true"]), 1, "not JSON", "UTF-8")
    gate = tmp_path / "gate.bin"
    gate.write_bytes(b"p99_ratio_max = 1.1\n\xff\xfe\x00\x01")
    assert_one_line_error(run([t, "report", "--a", *a, "--b", *b, "-o", tmp_path, "--gate",
                               gate]), 2, "--gate", "not a gate file")
    for depth, where in ((100_000, "top"), (950, "manifest")):
        deep = tmp_path / f"deep{depth}.json"
        nested = "[" * depth + "]" * depth
        deep.write_text(nested if where == "top" else
                        '{"format": "tierfs-results", "version": 1, "manifest": ' + nested
                        + ', "measurements": {}}')
        assert_one_line_error(run([t, "report", "--a", deep, "--b", *b, "-o", tmp_path]), 2,
                              str(deep))
        assert_one_line_error(run([t, "validate", deep]), 1, str(deep))


def test_multiple_comparisons_and_concurrency(tmp_path: Path) -> None:
    """The latency table marks a row significant only by its Bonferroni interval
    (wider than the 95% one), and the report warns when the arms did not overlap
    in time."""
    a = write_runs(tmp_path / "a", "a", 3, 1.0, "control")
    b = write_runs(tmp_path / "b", "b", 3, 1.0, "active")
    for p in b:  # run B's after A's: one after the other, as the A/A story in the issue
        doc = json.loads(p.read_text())
        doc["manifest"]["start"] = "2026-01-01T01:00:00.000Z"
        doc["manifest"]["end"] = "2026-01-01T01:00:05.000Z"
        schema.write(doc, p)
    out = tmp_path / "out"
    proc = run([tool("tierlab"), "report", "--a", *a, "--b", *b, "-o", out])
    assert proc.returncode == 0, proc.stderr
    assert "warning: the arms of 3 of 3 pairs did not run at the same time" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["concurrency"]["concurrent"] is False
    assert summary["family"] == len(summary["table"])
    for row in summary["table"]:
        if row["lo"] is not None:
            assert row["lo_corrected"] <= row["lo"] and row["hi_corrected"] >= row["hi"]
            assert not row["significant_corrected"] or row["significant"]
    md = (out / "report.md").read_text()
    assert "did not run at the same time" in md and "Bonferroni" in md
    marked = sum(1 for line in md.splitlines() if line.endswith("| significant |"))
    assert marked == sum(r["significant_corrected"] for r in summary["table"])
    # concurrent runs: no warning
    out2 = tmp_path / "out2"
    a2 = write_runs(tmp_path / "a2", "a", 3, 1.0, "control")
    b2 = write_runs(tmp_path / "b2", "b", 3, 1.0, "active")
    proc = run([tool("tierlab"), "report", "--a", *a2, "--b", *b2, "-o", out2])
    assert "warning" not in proc.stdout


def test_few_pairs_never_mark_a_row(tmp_path: Path) -> None:
    """B is 1.5x slower in every one of 4 pairs: the 95% intervals exclude 1.0, but
    4 pairs cannot carry a 36-row family (2/2^4 > 0.05/36), so no row is marked;
    with 12 pairs the same difference is."""
    for n, marked_rows in ((4, False), (12, True)):
        a = write_runs(tmp_path / f"a{n}", "a", n, 1.0, "control")
        b = write_runs(tmp_path / f"b{n}", "b", n, 1.5, "active")
        out = tmp_path / f"out{n}"
        proc = run([tool("tierlab"), "report", "--a", *a, "--b", *b, "-o", out])
        assert proc.returncode == 0, proc.stderr
        summary = json.loads((out / "summary.json").read_text())
        p99 = next(r for r in summary["table"] if r["op"] == "all" and r["stat"] == "p99")
        assert p99["significant"]  # the 95% interval alone would say so
        assert p99["significant_corrected"] is marked_rows
        md = (out / "report.md").read_text()
        assert ("| significant |" in md) is marked_rows
        assert ("no row is marked at all" in md) is (not marked_rows)
