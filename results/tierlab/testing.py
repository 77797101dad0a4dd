"""Helpers for the lab's tests: where the built tools are, synthetic results
documents with known content, and running a command to check its one-line errors.
Not used outside tests."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from tierlab import REPO_ROOT
from tierlab.hist import Histogram


def build_dir() -> Path:
    return Path(os.environ.get("TIERFS_BUILD", REPO_ROOT / "build"))


def tool(name: str) -> Path:
    """A built tool in build/bin; fails the test (not skips) when it is missing."""
    import pytest

    p = build_dir() / "bin" / name
    if not p.exists():
        pytest.fail(f"{p} is missing: build first (make), or set TIERFS_BUILD")
    return p


def run(cmd: Sequence[str | Path], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)


def assert_one_line_error(proc: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def synthetic_run(*, seed: int, arm: str = "other", pair: int | None = None, scale: float = 1.0,
                  ops: Sequence[str] = ("read", "write"), n: int = 5000, seconds: int = 5,
                  rate: float | None = None, fell_behind: bool = False,
                  with_series: bool = True, tail: tuple[float, float] | None = None) -> dict[str, Any]:
    """A valid results document whose latencies are lognormal (median 100 us x
    `scale`), so tests know what a report must find. `tail` = (delay_ns,
    fraction) adds delay_ns to a seeded `fraction` of each op's samples, as
    tierprobe --inject-delay plants a slowdown."""
    rng = np.random.default_rng(seed)
    hists = {}
    every = []
    for op in ops:
        samples = rng.lognormal(np.log(100e3 * scale), 0.6, size=n)
        if tail is not None:
            delay_ns, fraction = tail
            samples = samples + np.where(rng.random(n) < fraction, delay_ns, 0.0)
        hists[op] = Histogram.from_samples(samples)
        every.extend(samples)
    all_h = Histogram.from_samples(every)
    points = []
    chunk = np.array_split(np.asarray(every), seconds)
    for t, part in enumerate(chunk):
        h = Histogram.from_samples(part)
        points.append({"t": t, "phase": "measure", "count": h.count, "p50_ns": h.quantile(0.5),
                       "p99_ns": h.quantile(0.99), "p999_ns": h.quantile(0.999), "max_ns": h.max})
    total = all_h.count
    meas: dict[str, Any] = {
        "ops": {op: {"latency": h.to_json(), "service": h.to_json()}
                for op, h in {**hists, "all": all_h}.items()},
        "throughput": {"ops": total, "seconds": seconds, "ops_per_s": total / seconds,
                       "target_ops_per_s": rate if rate is not None else total / seconds},
        "counters": {"fell_behind": 1 if fell_behind else 0},
    }
    if with_series:
        meas["timeseries"] = {"interval_s": 1, "of": "latency", "points": points}
    return {
        "format": "tierfs-results", "version": 1,
        "manifest": {
            "producer": "synthetic", "workload": "tierprobe", "tool_versions": {"synthetic": "1"},
            "git_commit": "unknown", "host": {"hostname": "h", "cpus": 2, "memory_bytes": 1},
            "kernel": {"release": "6.1", "version": "#1", "machine": "x86_64"},
            "filesystem": {"path": "/mnt", "mount_point": "/mnt", "type": "tmpfs",
                           "source": "tmpfs", "options": "rw"},
            "device_layout": None, "fault_profile": "none", "seed": seed,
            "start": "2026-01-01T00:00:00.000Z", "end": "2026-01-01T00:00:05.000Z",
            "arm": arm, "pair": pair, "boot": None},
        "measurements": meas,
    }
