#!/usr/bin/python3
"""Summarize interleaved bench btree rounds: {prefix}-{arm}-rN.json in a folder.

    summarize.py [DIR] [--prefix btree] [--base base] [--cand cand]

Prints per phase the median ops/s of each arm (range), the ratio of the medians and
the median per-round ratio (cand/base; above 1: the candidate arm is faster)."""
import argparse, glob, json, os, re, statistics as st

ap = argparse.ArgumentParser()
ap.add_argument("dir", nargs="?", default=os.path.dirname(os.path.abspath(__file__)))
ap.add_argument("--prefix", default="btree")
ap.add_argument("--base", default="base")
ap.add_argument("--cand", default="cand")
a = ap.parse_args()
pat = re.compile(rf"/{re.escape(a.prefix)}-{re.escape(a.base)}-r(\d+)\.json$")
rounds = sorted(int(m.group(1)) for p in glob.glob(f"{a.dir}/{a.prefix}-{a.base}-r*.json") if (m := pat.search(p)))
if not rounds:
    raise SystemExit(f"summarize.py: no {a.prefix}-{a.base}-rN.json in {a.dir}")


def ops(arm, r):
    with open(f"{a.dir}/{a.prefix}-{arm}-r{r}.json") as f:
        return {p["phase"]: p["ops_per_sec"] for p in json.load(f)["phases"]}


base = {r: ops(a.base, r) for r in rounds}
cand = {r: ops(a.cand, r) for r in rounds}


def fmt(x):
    return f"{x / 1e6:.2f}M" if x >= 1e6 else f"{x / 1e3:.0f}k"


print(f"{a.cand} against {a.base}, {len(rounds)} rounds")
for ph in base[rounds[0]]:
    b = [base[r][ph] for r in rounds]
    c = [cand[r][ph] for r in rounds]
    ratios = [cand[r][ph] / base[r][ph] for r in rounds]
    below = sum(1 for x in ratios if x < 1)
    print(f"{ph:12s} {fmt(st.median(b))} ({fmt(min(b))}-{fmt(max(b))})  {fmt(st.median(c))} ({fmt(min(c))}-{fmt(max(c))})"
          f"  ratio of medians {st.median(c) / st.median(b):.2f}  median per-round {st.median(ratios):.2f}"
          f" ({below} of {len(rounds)} below 1)")
