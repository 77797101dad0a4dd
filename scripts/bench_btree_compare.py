#!/usr/bin/python3
"""Side-by-side ops/s of `tierfs bench btree` and the kvbench peers (shared/kvbench).

    scripts/bench_btree_compare.py [--markdown] [--target PHASE=OPS ...] FILE.json...

Each FILE is either a `tierfs bench btree --json` document or a kvbench `--json`
document; any mix and any number. Results are grouped by engine and key count N
(tierfs runs with --cache-mb are their own engine, "tierfs cache=64M"), and several
runs of the same (engine, N, phase, threads) are shown as their median ("x3": of 3). One table per
thread count; the peers run their seq_* phases single-threaded only, so their seq
cells in the other tables are empty. --target adds a column of targets to the
one-thread table. Called by scripts/bench-btree-compare; also used to generate the
tables in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PHASES = ["seq_insert", "seq_lookup", "seq_delete", "rand_insert", "rand_lookup", "rand_mixed"]


@dataclass
class Column:
    """One engine at one N: ops/s per (phase, threads), one value per run."""

    engine: str
    n: int
    runs: dict[int, int] = field(default_factory=dict)  # per thread count
    rates: dict[tuple[str, int], list[float]] = field(default_factory=dict)

    def add(self, phase: str, threads: int, ops_per_sec: float) -> None:
        self.rates.setdefault((phase, threads), []).append(ops_per_sec)
        self.runs[threads] = max(self.runs.get(threads, 0), len(self.rates[(phase, threads)]))

    def title(self, threads: int) -> str:
        runs = self.runs.get(threads, 0)
        return f"{self.engine} {count(self.n)}" + (f" x{runs}" if runs > 1 else "")


def count(n: float) -> str:
    """10000000 -> '10M', 2000000 -> '2M', 20000 -> '20k'."""
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            v = n / div
            return f"{v:.0f}{unit}" if v == int(v) else f"{v:.3g}{unit}"
    return f"{n:.0f}"


def rate(v: float | None) -> str:
    if v is None:
        return "-"
    if v >= 1e6:
        return f"{v / 1e6:.2f}M"
    if v >= 1e4:
        return f"{v / 1e3:.0f}k"
    return f"{v:.0f}"


def parse_rate(text: str) -> float:
    """'2M' -> 2e6, '450k' -> 4.5e5, '1200' -> 1200."""
    mult = {"k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9}.get(text[-1:], 1.0)
    return float(text[:-1] if mult != 1.0 else text) * mult


def load(paths: list[Path]) -> list[Column]:
    columns: dict[tuple[str, int], Column] = {}

    def column(engine: str, n: int) -> Column:
        return columns.setdefault((engine, n), Column(engine, n))

    for path in paths:
        try:
            doc: Any = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise SystemExit(f"bench_btree_compare: {path}: {e}")
        if not isinstance(doc, dict):
            raise SystemExit(f"bench_btree_compare: {path}: not a benchmark document")
        if doc.get("benchmark") == "btree":
            cfg = doc["config"]
            engine = "tierfs" if not cfg.get("cache_mb_option") else f"tierfs cache={cfg['cache_mb_option']}M"
            col = column(engine, int(cfg["n"]))
            for p in doc["phases"]:
                col.add(p["phase"], int(p["threads"]), float(p["ops_per_sec"]))
        elif doc.get("tool") == "kvbench":
            for e in doc["engines"]:
                if not e.get("ok"):
                    continue
                col = column(e["name"], int(doc["n"]))
                for p in e["phases"]:
                    col.add(p["phase"], int(p["threads"]), float(p["ops_per_s"]))
        else:
            raise SystemExit(f"bench_btree_compare: {path}: neither a tierfs btree nor a kvbench document")
    tierfs_first = sorted(columns.values(), key=lambda c: (not c.engine.startswith("tierfs"), c.engine, c.n))
    return tierfs_first


def median(values: list[float] | None) -> float | None:
    return statistics.median(values) if values else None


def cell(c: Column, phase: str, threads: int) -> str:
    """Median ops/s; '(xK)' when fewer runs than the column title says."""
    values = c.rates.get((phase, threads))
    text = rate(median(values))
    if values and len(values) != c.runs.get(threads, 0):
        text += f" (x{len(values)})"
    return text


def tables(columns: list[Column], targets: dict[str, float], markdown: bool) -> str:
    thread_counts = sorted({t for c in columns for (_, t) in c.rates})
    out: list[str] = []
    for threads in thread_counts:
        header = ["phase"] + [c.title(threads) for c in columns]
        with_targets = bool(targets) and threads == 1
        if with_targets:
            header.append("target")
        rows = []
        for phase in PHASES:
            cells = [cell(c, phase, threads) for c in columns]
            if all(x == "-" for x in cells):
                continue
            row = [phase] + cells
            if with_targets:
                row.append(rate(targets[phase]) if phase in targets else "-")
            rows.append(row)
        if not rows:
            continue
        several = any(c.runs.get(threads, 0) > 1 for c in columns)
        out.append(f"{threads} thread{'s' if threads > 1 else ''} (ops/s{', xR: median of R runs' if several else ''}):")
        if markdown:
            out.append("")
            out.append("| " + " | ".join(header) + " |")
            out.append("|" + "---|" * len(header))
            out.extend("| " + " | ".join(r) + " |" for r in rows)
        else:
            widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
            for r in [header] + rows:
                out.append("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(r, widths))))
        out.append("")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description="tierfs btree vs kvbench peers, side by side")
    ap.add_argument("files", nargs="+", type=Path, help="tierfs bench btree and kvbench JSON files")
    ap.add_argument("--markdown", action="store_true", help="Markdown tables (for docs/benchmarks.md)")
    ap.add_argument("--target", action="append", default=[], metavar="PHASE=OPS",
                    help="a one-thread target column, e.g. seq_insert=2M (repeatable)")
    args = ap.parse_args(argv)
    targets: dict[str, float] = {}
    for t in args.target:
        phase, _, value = t.partition("=")
        try:
            if phase not in PHASES:
                raise ValueError(phase)
            targets[phase] = parse_rate(value)
        except ValueError:
            ap.error(f"bad --target '{t}' (PHASE=OPS, e.g. seq_insert=2M)")
    print(tables(load(args.files), targets, args.markdown), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
