"""The lab checks itself: `tierlab report` must find no difference between two
arms drawn alike (A/A) and must find a planted slowdown (A/B), and real
tierprobe runs must go through the whole chain.

The statistics are tested on synthetic runs (tierlab.testing.synthetic_run):
seeded lognormal latencies, five pairs, each pair with its own machine drift
shared by both of its runs, as the lab's paired runner sees. The planted arm
adds 5 ms to 3% of its operations, as `tierprobe --inject-delay 5ms:0.03`
does, so its p99 lies inside the planted tail. Seeded documents make these
tests exact: the same report every time, on any machine, however loaded.
(They used to run real probes and test significance on their timings; on a
loaded machine one control run's 54 ms outlier pulled the interval's lower
bound under 1.0.)

One end-to-end run keeps the real path honest -- tierprobe on tmpfs, with and
without the planted delay, two pairs at the same time, through `tierlab
report` -- and asserts only what timing cannot break: the report's structure,
and that the planted arm's p99 is at least the planted delay (load only adds
latency)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tierlab import schema
from tierlab.testing import run, synthetic_run, tool

PAIRS = 5
DELAY_NS = 5e6
TAIL = (DELAY_NS, 0.03)


def synthetic_arm(d: Path, name: str, arm: str, seed: int, tail: tuple[float, float] | None = None) -> list[Path]:
    """PAIRS runs of one arm; pair i drifts by the same factor in every arm."""
    d.mkdir(parents=True, exist_ok=True)
    paths = []
    for pair in range(PAIRS):
        p = d / f"{name}{pair}.json"
        schema.write(synthetic_run(seed=seed * 100 + pair, arm=arm, pair=pair, scale=1.0 + 0.15 * pair,
                                   n=4000, tail=tail), p)
        paths.append(p)
    return paths


def report(a: list[Path], b: list[Path], out: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    proc = run([tool("tierlab"), "report", "--a", *a, "--b", *b, "-o", out, *extra])
    assert proc.returncode in (0, 1), proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    return proc.returncode, summary


def p99_all(summary: dict[str, Any]) -> dict[str, Any]:
    return next(r for r in summary["table"] if r["op"] == "all" and r["stat"] == "p99")


def test_aa_interval_contains_one(tmp_path: Path) -> None:
    a = synthetic_arm(tmp_path / "a", "a", "control", seed=1)
    b = synthetic_arm(tmp_path / "b", "b", "active", seed=2)
    code, summary = report(a, b, tmp_path / "aa", "--max-p99-ratio", "1.10")
    row = p99_all(summary)
    assert summary["method"] == "pairs"
    assert row["lo"] <= 1.0 <= row["hi"] and not row["significant"], row
    assert code == 0 and summary["gate_passed"] is True


def test_planted_slowdown_is_significant(tmp_path: Path) -> None:
    a = synthetic_arm(tmp_path / "a", "a", "control", seed=1)
    slow = synthetic_arm(tmp_path / "slow", "slow", "active", seed=3, tail=TAIL)
    code, summary = report(a, slow, tmp_path / "ab", "--max-p99-ratio", "1.10")
    row = p99_all(summary)
    assert summary["method"] == "pairs"
    assert row["significant"] and row["lo"] > 1.0, row
    assert row["b_ns"] >= 0.9 * DELAY_NS  # the slowed arm's p99 is inside the planted tail
    assert code == 1 and summary["gate_passed"] is False
    assert not summary["fell_behind"]


def test_real_probe_runs_through_the_report(tmp_path: Path) -> None:
    """Two pairs of real tierprobe runs (control, planted delay) at the same time
    on tmpfs; structure only, no significance."""
    target = Path("/dev/shm") if Path("/dev/shm").is_dir() else tmp_path
    probe = ["--rate", "2000", "--duration", "1s", "--warmup", "0.2s", "--working-set", "4M",
             "--files", "64", "--quiet"]
    arms: dict[str, list[Path]] = {"a": [], "slow": []}
    for pair in range(2):
        procs = []
        for name, arm, extra in (("a", "control", []), ("slow", "active", ["--inject-delay", "5ms:0.03"])):
            path = tmp_path / f"{name}{pair}.json"
            procs.append(subprocess.Popen(
                [str(tool("tierprobe")), "--dir", str(target), "--json", str(path), *probe,
                 "--pair", str(pair), "--arm", arm, "--seed", str(pair), *extra],
                stderr=subprocess.PIPE, text=True))
            arms[name].append(path)
        for p in procs:
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
    _, summary = report(arms["a"], arms["slow"], tmp_path / "out", "--max-p99-ratio", "1.10")
    assert summary["method"] == "pairs"
    row = p99_all(summary)
    assert row["a_ns"] > 0 and row["lo"] <= row["ratio"] <= row["hi"], row
    assert row["b_ns"] >= 0.9 * DELAY_NS  # 3% of operations took at least 5 ms
    assert (tmp_path / "out" / "report.html").is_file()
