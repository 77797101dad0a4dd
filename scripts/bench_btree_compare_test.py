"""bench_btree_compare: grouping, medians and tables from tierfs and kvbench JSON."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent / "bench_btree_compare.py"


def tierfs_doc(n: int, threads: int, rates: dict[str, float], cache_mb: int = 0) -> dict:
    return {"benchmark": "btree", "config": {"n": n, "threads": threads, "cache_mb_option": cache_mb},
            "phases": [{"phase": p, "threads": threads, "ops_per_sec": r} for p, r in rates.items()]}


def kvbench_doc(n: int) -> dict:
    phases = [{"phase": "seq_insert", "threads": 1, "ops_per_s": 4.0e6},
              {"phase": "seq_get", "threads": 1, "ops_per_s": 1.0e6},
              {"phase": "rand_lookup", "threads": 1, "ops_per_s": 1.0e6},
              {"phase": "rand_lookup", "threads": 2, "ops_per_s": 2.5e6}]
    return {"tool": "kvbench", "n": n, "engines": [
        {"name": "lmdb", "ok": True, "phases": phases},
        {"name": "broken", "ok": False, "phases": phases}]}


def run(tmp_path: Path, docs: list[dict], *args: str) -> subprocess.CompletedProcess[str]:
    files = []
    for i, d in enumerate(docs):
        f = tmp_path / f"{i}.json"
        f.write_text(json.dumps(d))
        files.append(str(f))
    return subprocess.run(["/usr/bin/python3", str(SCRIPT), *args, *files], capture_output=True, text=True)


def test_medians_and_columns(tmp_path: Path) -> None:
    docs = [tierfs_doc(10_000_000, 1, {"seq_insert": r, "rand_lookup": 1.5e6}) for r in (1e6, 3e6, 2e6)]
    docs.append(tierfs_doc(10_000_000, 2, {"seq_insert": 5e5, "rand_lookup": 3e6}))
    docs.append(tierfs_doc(10_000_000, 1, {"seq_insert": 9e5}, cache_mb=64))
    docs.append(kvbench_doc(2_000_000))
    proc = run(tmp_path, docs, "--target", "seq_insert=2M")
    assert proc.returncode == 0, proc.stderr
    one, two = proc.stdout.split("2 threads")
    head = one.splitlines()[1].split()
    assert head[:4] == ["phase", "tierfs", "10M", "x3"]  # 3 one-thread runs
    assert "lmdb" in head and "2M" in head and "broken" not in one and head[-1] == "target"
    seq = next(line.split() for line in one.splitlines() if line.startswith("seq_insert"))
    assert seq[1] == "2.00M" and seq[-1] == "2.00M"  # median of 1M, 3M, 2M; the target
    assert "900k" in seq and "4.00M" in seq
    assert "seq_get" not in proc.stdout  # not a tierfs phase
    lookup = next(line for line in one.splitlines() if line.startswith("rand_lookup"))
    assert "1.50M" in lookup and "(x" not in lookup
    docs.append(tierfs_doc(10_000_000, 1, {"seq_insert": 2e6}))  # a 4th run of one phase only
    proc = run(tmp_path, docs)
    lookup = next(line for line in proc.stdout.splitlines() if line.startswith("rand_lookup"))
    assert "1.50M (x3)" in lookup and " x4" in proc.stdout
    seq2 = next(line.split() for line in two.splitlines() if line.startswith("seq_insert"))
    assert seq2 == ["seq_insert", "500k", "-", "-"]  # peers run seq phases with one thread only
    assert "target" not in two and "x3" not in two  # one two-thread run


def test_markdown(tmp_path: Path) -> None:
    proc = run(tmp_path, [tierfs_doc(20000, 1, {"seq_insert": 1.0e6})], "--markdown")
    assert proc.returncode == 0, proc.stderr
    assert "| phase | tierfs 20k |" in proc.stdout and "| seq_insert | 1.00M |" in proc.stdout


def test_bad_input(tmp_path: Path) -> None:
    proc = run(tmp_path, [{"something": "else"}])
    assert proc.returncode != 0 and "neither a tierfs btree nor a kvbench document" in proc.stderr
    proc = run(tmp_path, [tierfs_doc(1, 1, {})], "--target", "seq_frob=1M")
    assert proc.returncode != 0 and "bad --target" in proc.stderr
