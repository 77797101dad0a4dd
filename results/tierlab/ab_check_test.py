"""The lab checks itself: real tierprobe runs on tmpfs through `tierlab report`.

A/A: both arms run the same probe on the same target. Each pair's two runs go at
the same time (as the lab runs its arms), five pairs, and the report must find a
p99 ratio whose 95% interval contains 1.0. A correctly calibrated 95% interval
still misses 1.0 in one A/A experiment out of twenty by definition, so a miss is
repeated once with fresh runs; two misses in a row (about 1 in 400 if the
interval is honest) fail the test.

Planted slowdown: a third run in every pair adds 5 ms to 3% of its operations
(tierprobe --inject-delay). Its p99 then lies inside the planted tail, and the
report must call the difference significant and fail a 1.10 gate.

Why not one run per arm: the interval would have to come from resampling
operations, which ignores run-to-run drift; measured here, such single-run A/A
comparisons called half of the identical pairs "significant"."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tierlab.testing import run, tool

PAIRS = 5
PROBE = ["--rate", "2000", "--duration", "2s", "--warmup", "0.3s", "--working-set", "4M",
         "--files", "64", "--quiet"]


def run_pairs(d: Path, arms: dict[str, list[str]]) -> dict[str, list[Path]]:
    """PAIRS rounds; in each, one probe per arm, all at once, on one tmpfs."""
    d.mkdir(parents=True, exist_ok=True)
    target = Path("/dev/shm") if Path("/dev/shm").is_dir() else d
    out: dict[str, list[Path]] = {name: [] for name in arms}
    for pair in range(PAIRS):
        procs = []
        for name, extra in arms.items():
            path = d / f"{name}{pair}.json"
            arm = "control" if name == "a" else "active"
            procs.append(subprocess.Popen(
                [str(tool("tierprobe")), "--dir", str(target), "--json", str(path), *PROBE,
                 "--pair", str(pair), "--arm", arm, "--seed", str(pair), *extra],
                stderr=subprocess.PIPE, text=True))
            out[name].append(path)
        for p in procs:
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
    return out


def report(a: list[Path], b: list[Path], out: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    proc = run([tool("tierlab"), "report", "--a", *a, "--b", *b, "-o", out, *extra])
    assert proc.returncode in (0, 1), proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    return proc.returncode, summary


def p99_all(summary: dict[str, Any]) -> dict[str, Any]:
    return next(r for r in summary["table"] if r["op"] == "all" and r["stat"] == "p99")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Path]]:
    d = tmp_path_factory.mktemp("ab")
    return run_pairs(d, {"a": [], "b": [], "slow": ["--inject-delay", "5ms:0.03"]})


def test_aa_interval_contains_one(runs: dict[str, list[Path]], tmp_path: Path) -> None:
    a, b = runs["a"], runs["b"]
    misses = []
    for attempt in range(2):
        _, summary = report(a, b, tmp_path / f"aa{attempt}")
        row = p99_all(summary)
        assert summary["method"] == "pairs"
        if row["lo"] <= 1.0 <= row["hi"]:
            return
        misses.append((row["ratio"], row["lo"], row["hi"]))
        fresh = run_pairs(tmp_path / f"again{attempt}", {"a": [], "b": []})
        a, b = fresh["a"], fresh["b"]
    pytest.fail(f"A/A p99 ratio interval excluded 1.0 twice: {misses}")


def test_planted_slowdown_is_significant(runs: dict[str, list[Path]], tmp_path: Path) -> None:
    code, summary = report(runs["a"], runs["slow"], tmp_path / "ab", "--max-p99-ratio", "1.10")
    row = p99_all(summary)
    # Significant and in the right direction. (A lower bound of 1.5 held on a quiet
    # machine but not under make test-asan on a loaded one, where the control arm's
    # own p99 reached 16 ms; the issue asks for a significant difference.)
    assert row["significant"] and row["lo"] > 1.0, row
    assert row["b_ns"] >= 4.5e6  # p99 of the slowed arm is inside the planted 5 ms tail
    assert code == 1 and summary["gate_passed"] is False
    assert not summary["fell_behind"]
