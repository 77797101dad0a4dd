"""`tierlab report`: compare two arms of runs and write report.md, a
self-contained report.html (plots embedded as data: URIs), the plots as PNG
files, and summary.json (every number of the report, for scripts).

    tierlab report --a runs/control/*.json --b runs/active/*.json -o out/ [--gate FILE]

A is the baseline and B the candidate: ratios are B/A, so above 1 means B is
slower (or, for throughput, faster). For the lab's gate pass the control runs as
A and the active runs as B. Per op and statistic (p50, p99, p99.9, max) the table
gives each arm's geometric mean over runs, the ratio and its bootstrap 95% CI
(stats.py says how runs are resampled). With a gate, one pass/fail line per
criterion; the exit status is 1 when any criterion fails, 0 otherwise, 2 on bad
input. Works on histograms only, so runs of millions of operations stay fast."""

from __future__ import annotations

import argparse
import base64
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tierlab import LabError
from tierlab import gate as gate_mod
from tierlab import schema
from tierlab.hist import Histogram
from tierlab.stats import Ratio, choose_method, compare_quantiles, compare_values, geomean

STATS = (("p50", 0.5), ("p99", 0.99), ("p99.9", 0.999), ("max", 1.0))
METHOD_TEXT = {
    "pairs": "bootstrap over pairs (geometric mean of per-pair ratios)",
    "runs": "bootstrap over runs (each arm resampled independently)",
    "operations": "bootstrap over operations (one run in an arm: covers sampling noise only, "
                  "not run-to-run drift)",
}


def register(sub: Any) -> None:
    p = sub.add_parser("report", help="compare runs of two arms (report.md + report.html)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", nargs="?", metavar="PAIR_DIR",
                   help="a `tierlab pair` directory: its lab report (default -o PAIR_DIR/report) "
                   "and gate, bounds from its profile (docs/lab/pair.md)")
    p.add_argument("--a", nargs="+", metavar="RUN.json", help="baseline runs")
    p.add_argument("--b", nargs="+", metavar="RUN.json", help="candidate runs")
    p.add_argument("-o", "--out", metavar="DIR", help="output directory")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="with PAIR_DIR: override a profile key (gate bounds)")
    p.add_argument("--label-a", help="name of arm A (default: its runs' arm, else 'A')")
    p.add_argument("--label-b", help="name of arm B (default: its runs' arm, else 'B')")
    p.add_argument("--gate", metavar="FILE", help="gate bounds file (see gate.py)")
    p.add_argument("--max-p99-ratio", type=float, help="gate: p99 B/A at most this")
    p.add_argument("--max-p999-ratio", type=float, help="gate: p99.9 B/A at most this")
    p.add_argument("--min-throughput-ratio", type=float, help="gate: throughput B/A at least this")
    p.add_argument("--max-latency", help="gate: no op of arm B above this (e.g. 2s)")
    p.add_argument("--gate-op", help="gate: op the latency criteria use (default all)")
    p.set_defaults(run=run)


@dataclass
class Run:
    path: str
    doc: dict[str, Any]

    @property
    def manifest(self) -> dict[str, Any]:
        return self.doc["manifest"]

    @property
    def meas(self) -> dict[str, Any]:
        return self.doc["measurements"]

    def hist(self, op: str) -> Histogram:
        return Histogram.from_json(self.meas["ops"][op]["latency"])

    def ops(self) -> list[str]:
        return list(self.meas["ops"])

    @property
    def fell_behind(self) -> bool:
        return bool(self.meas["counters"].get("fell_behind", 0))


def _load_arm(paths: list[str]) -> list[Run]:
    return [Run(p, schema.load(p)) for p in paths]


def _label(given: str | None, runs: list[Run], default: str) -> str:
    if given:
        return given
    arms = {r.manifest["arm"] for r in runs}
    return arms.pop() if len(arms) == 1 and "other" not in arms else default


def fmt_ns(ns: float) -> str:
    if ns >= 1e9:
        return f"{ns / 1e9:.3g} s"
    if ns >= 1e6:
        return f"{ns / 1e6:.3g} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.3g} µs"
    return f"{ns:.0f} ns"


def fmt_ratio(r: Ratio, corrected: Ratio | None = None) -> dict[str, Any]:
    ci = f"[{r.lo:.3f}, {r.hi:.3f}]" if r.lo is not None else "n/a"
    out = {"value": f"{r.value:.3f}", "ci": ci, "significant": r.significant}
    if corrected is not None:
        out["ci_corrected"] = (f"[{corrected.lo:.3f}, {corrected.hi:.3f}]"
                               if corrected.lo is not None else "n/a")
        out["significant"] = corrected.significant
    return out


def _gate_from_args(args: argparse.Namespace) -> gate_mod.Gate:
    g = gate_mod.load(args.gate)
    for key, val in (("p99_ratio_max", args.max_p99_ratio),
                     ("p999_ratio_max", args.max_p999_ratio),
                     ("throughput_ratio_min", args.min_throughput_ratio),
                     ("max_latency", args.max_latency), ("op", args.gate_op)):
        if val is not None:
            g.set(key, str(val), "command line")
    return g


def _with_data(op: str, runs_a: list[Run], runs_b: list[Run], method: str,
               ) -> tuple[list[Run], list[Run]]:
    """The runs of each arm that hold operations of `op`. A run with none has no
    quantile (0 would make absurd ratios); with pairs, the pair is left out whole."""
    keep_a = [r for r in runs_a if r.hist(op).count > 0]
    keep_b = [r for r in runs_b if r.hist(op).count > 0]
    if method == "pairs":
        both = {r.manifest["pair"] for r in keep_a} & {r.manifest["pair"] for r in keep_b}
        keep_a = [r for r in keep_a if r.manifest["pair"] in both]
        keep_b = [r for r in keep_b if r.manifest["pair"] in both]
    return keep_a, keep_b


def compare(runs_a: list[Run], runs_b: list[Run], g: gate_mod.Gate) -> dict[str, Any]:
    """Every number of the report, as plain data (also written as summary.json)."""
    ops = [op for op in runs_a[0].meas["ops"]
           if all(op in r.meas["ops"] for r in runs_a + runs_b)]
    if not ops:
        raise LabError("the two arms have no op in common: are they runs of the same workload?")
    if g.op not in ops:
        if g.active:
            raise LabError(f"gate op '{g.op}' is not in every run (ops: {', '.join(ops)})")
    pairs_a = [r.manifest["pair"] for r in runs_a]
    pairs_b = [r.manifest["pair"] for r in runs_b]
    method = choose_method(pairs_a, pairs_b)
    table = []
    no_data = []
    kept = []
    for op in ops:
        keep_a, keep_b = _with_data(op, runs_a, runs_b, method)
        if not keep_a or not keep_b:
            if g.active and op == g.op:
                empty = [arm for arm, runs in (("A", runs_a), ("B", runs_b))
                         if all(r.hist(op).count == 0 for r in runs)]
                raise LabError(f"gate op '{op}' has no operations in any run of arm {empty[0]}"
                               if empty else
                               f"gate op '{op}' has operations in both arms of no pair")
            no_data.append(op)
            continue
        kept.append((op, keep_a, keep_b))
    # The table is a family of len(kept) * len(STATS) comparisons: looked at together,
    # 95% intervals call some A/A row "significant" by chance alone (measured: 6 of 36).
    # Each row also gets a Bonferroni interval at 1 - 0.05/m, and only that one marks
    # a row significant in the report; the gate decides on its own pre-declared rows.
    family = max(1, len(kept) * len(STATS))
    corrected_level = 1 - 0.05 / family
    # A bootstrap over n units cannot be surer than all n on one side, which chance
    # alone gives with probability 2/2^n: below the units that make that <= 0.05/m no
    # row can honestly be marked (36 rows: 11 pairs), whatever its interval says.
    units_needed = math.ceil(math.log2(2 * family / 0.05))
    for op, keep_a, keep_b in kept:
        ka = [r.manifest["pair"] for r in keep_a]
        kb = [r.manifest["pair"] for r in keep_b]
        op_method = choose_method(ka, kb)  # fewer runs left may mean a weaker method
        ha, hb = [r.hist(op) for r in keep_a], [r.hist(op) for r in keep_b]
        ratios = compare_quantiles(ha, hb, [q for _n, q in STATS], op_method, ka, kb)
        wide = compare_quantiles(ha, hb, [q for _n, q in STATS], op_method, ka, kb,
                                 level=corrected_level)
        for name, q in STATS:
            va = [float(h.max if q >= 1 else h.quantile(q)) for h in ha]
            vb = [float(h.max if q >= 1 else h.quantile(q)) for h in hb]
            r, w = ratios[q], wide[q]
            units = len(ka) if op_method == "pairs" else min(len(ka), len(kb))
            resolvable = op_method != "operations" and units >= units_needed
            table.append({"op": op, "stat": name, "a_ns": float(geomean(va)),
                          "b_ns": float(geomean(vb)), "ratio": r.value, "lo": r.lo, "hi": r.hi,
                          "method": r.method, "significant": r.significant,
                          "lo_corrected": w.lo, "hi_corrected": w.hi,
                          "significant_corrected": w.significant and resolvable,
                          "resolvable": resolvable,
                          "a_runs": va, "b_runs": vb})
    ops = [op for op in ops if op not in no_data]
    if not ops:
        raise LabError("no op has operations in both arms")
    tp_a = [float(r.meas["throughput"]["ops_per_s"]) for r in runs_a]
    tp_b = [float(r.meas["throughput"]["ops_per_s"]) for r in runs_b]
    tp = compare_values(tp_a, tp_b, method if method != "operations" else "none", pairs_a, pairs_b)
    throughput = {"a": sum(tp_a) / len(tp_a), "b": sum(tp_b) / len(tp_b), "ratio": tp.value,
                  "lo": tp.lo, "hi": tp.hi, "method": tp.method, "significant": tp.significant}
    behind = [r.path for r in runs_a + runs_b if r.fell_behind]
    criteria = _evaluate_gate(g, table, throughput, runs_b, behind) if g.active else []
    return {"ops": ops, "method": method, "table": table, "throughput": throughput,
            "no_data": no_data, "fell_behind": behind, "gate": criteria,
            "gate_passed": all(c["passed"] for c in criteria) if criteria else None,
            "family": family, "corrected_level": corrected_level,
            "units_needed": units_needed,
            "concurrency": concurrency(runs_a, runs_b, method)}


def _span(r: Run) -> tuple[Any, Any]:
    m = r.manifest
    return (schema._instant(m["start"], r.path), schema._instant(m["end"], r.path))


def concurrency(runs_a: list[Run], runs_b: list[Run], method: str) -> dict[str, Any]:
    """Whether the arms ran at the same time: with pairs, every pair's two runs
    overlap in time; otherwise every run of A overlaps some run of B. Arms run one
    after the other share none of the machine's drift, and their ratio carries it."""
    def overlap(x: Run, y: Run) -> bool:
        (s1, e1), (s2, e2) = _span(x), _span(y)
        return s1 < e2 and s2 < e1

    if method == "pairs":
        by_pair = {r.manifest["pair"]: r for r in runs_b}
        apart = [r.manifest["pair"] for r in runs_a if not overlap(r, by_pair[r.manifest["pair"]])]
        return {"concurrent": not apart, "apart": apart,
                "text": "" if not apart else
                f"the arms of {len(apart)} of {len(runs_a)} pairs did not run at the same time "
                f"(pairs {', '.join(map(str, apart))}): drift between their runs lands in the ratios"}
    apart_runs = [r.path for r in runs_a if not any(overlap(r, b) for b in runs_b)]
    return {"concurrent": not apart_runs, "apart": apart_runs,
            "text": "" if not apart_runs else
            f"{len(apart_runs)} of {len(runs_a)} runs of A overlap no run of B: the arms were not "
            "run concurrently, so the machine's drift between them lands in the ratios "
            "(run them at the same time: tierlab pair)"}


def _row(table: list[dict[str, Any]], op: str, stat: str) -> dict[str, Any]:
    return next(r for r in table if r["op"] == op and r["stat"] == stat)


def _ci(lo: float | None, hi: float | None) -> str:
    return f", 95% CI [{lo:.3f}, {hi:.3f}]" if lo is not None else ""


def _evaluate_gate(g: gate_mod.Gate, table: list[dict[str, Any]], throughput: dict[str, Any],
                   runs_b: list[Run], behind: list[str]) -> list[dict[str, Any]]:
    out = []

    def add(name: str, passed: bool, text: str) -> None:
        out.append({"criterion": name, "passed": passed, "text": text})

    for stat, bound in (("p99", g.p99_ratio_max), ("p99.9", g.p999_ratio_max)):
        if bound is not None:
            r = _row(table, g.op, stat)
            add(f"{stat} ratio", r["ratio"] <= bound,
                f"{g.op} {stat} B/A = {r['ratio']:.3f}{_ci(r['lo'], r['hi'])} "
                f"(A {fmt_ns(r['a_ns'])}, B {fmt_ns(r['b_ns'])}); bound ≤ {bound:.3f}")
    if g.throughput_ratio_min is not None:
        t = throughput
        add("throughput ratio", t["ratio"] >= g.throughput_ratio_min,
            f"throughput B/A = {t['ratio']:.3f}{_ci(t['lo'], t['hi'])} "
            f"(A {t['a']:.1f}/s, B {t['b']:.1f}/s); bound ≥ {g.throughput_ratio_min:.3f}")
    if g.max_latency_ns is not None:
        worst = max(runs_b, key=lambda r: r.hist(g.op).max)
        m = worst.hist(g.op).max
        add("max latency", m <= g.max_latency_ns,
            f"{g.op} max of B = {fmt_ns(m)} ({worst.path}); bound ≤ {fmt_ns(g.max_latency_ns)}")
    add("rate kept", not behind,
        "every run kept its schedule" if not behind else
        f"{len(behind)} run(s) fell behind their schedule (closed-loop, hides stalls): "
        + ", ".join(behind))
    return out


def _run_rows(runs: list[Run], op: str) -> list[dict[str, Any]]:
    rows = []
    for r in runs:
        h = r.hist(op) if op in r.meas["ops"] else Histogram()
        tp = r.meas["throughput"]
        target = tp.get("target_ops_per_s")
        rows.append({"path": r.path, "start": r.manifest["start"], "pair": r.manifest["pair"],
                     "fs": f"{r.manifest['filesystem']['type']} {r.manifest['filesystem']['path']}",
                     "ops": h.count, "p99": fmt_ns(h.quantile(0.99)), "max": fmt_ns(h.max),
                     "rate": f"{tp['ops_per_s']:.1f}" + (f" / {target:.1f}" if target else ""),
                     "behind": r.fell_behind})
    return rows


def render(summary: dict[str, Any], runs_a: list[Run], runs_b: list[Run], labels: tuple[str, str],
           images: dict[str, bytes], g: gate_mod.Gate) -> tuple[str, str]:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(Path(__file__).parent / "templates")),
        autoescape=jinja2.select_autoescape(["html"]), trim_blocks=True, lstrip_blocks=True,
        undefined=jinja2.StrictUndefined)
    table = [dict(row, a=fmt_ns(row["a_ns"]), b=fmt_ns(row["b_ns"]),
                  r=dict(fmt_ratio(Ratio(row["ratio"], row["lo"], row["hi"], row["method"]),
                                   Ratio(row["ratio"], row["lo_corrected"], row["hi_corrected"],
                                         row["method"])),
                         significant=row["significant_corrected"]))
             for row in summary["table"]]
    t = summary["throughput"]
    ctx = {
        "label_a": labels[0], "label_b": labels[1], "n_a": len(runs_a), "n_b": len(runs_b),
        "method": METHOD_TEXT[summary["method"]], "table": table,
        "throughput": dict(t, r=fmt_ratio(Ratio(t["ratio"], t["lo"], t["hi"], t["method"]))),
        "gate": summary["gate"], "gate_passed": summary["gate_passed"], "gate_op": g.op,
        "family": summary["family"], "corrected_pct": f"{100 * summary['corrected_level']:.2f}",
        "units_needed": summary["units_needed"],
        "unresolvable": any(not row["resolvable"] for row in summary["table"]),
        "concurrency": summary["concurrency"],
        "fell_behind": summary["fell_behind"], "no_data": summary["no_data"],
        "runs_a": _run_rows(runs_a, g.op if g.op in summary["ops"] else summary["ops"][0]),
        "runs_b": _run_rows(runs_b, g.op if g.op in summary["ops"] else summary["ops"][0]),
        "workload": runs_a[0].manifest["workload"],
        "images": [(name, title, base64.b64encode(data).decode("ascii"))
                   for name, title, data in images_list(images)],
    }
    return env.get_template("report.md.j2").render(ctx), env.get_template("report.html.j2").render(ctx)


TITLES = {"cdf": "Latency CDFs", "p99_runs": "p99 per run", "timeseries": "Latency over time"}


def images_list(images: dict[str, bytes]) -> list[tuple[str, str, bytes]]:
    return [(name, TITLES[name], data) for name, data in images.items()]


def make_images(summary: dict[str, Any], runs_a: list[Run], runs_b: list[Run],
                labels: tuple[str, str]) -> dict[str, bytes]:
    from tierlab import plots

    ops = summary["ops"]
    merged = [(lab, {op: Histogram.merged(r.hist(op) for r in runs) for op in ops})
              for lab, runs in zip(labels, (runs_a, runs_b))]
    p99 = [(lab, {op: _row(summary["table"], op, "p99")[key] for op in ops})
           for lab, key in zip(labels, ("a_runs", "b_runs"))]
    images = {"cdf": plots.cdf(ops, merged), "p99_runs": plots.p99_runs(ops, p99)}
    series = [(lab, [r.meas["timeseries"] for r in runs if r.meas.get("timeseries")])
              for lab, runs in zip(labels, (runs_a, runs_b))]
    if any(s for _lab, s in series):
        images["timeseries"] = plots.timeseries(series)
    return images


def run(args: argparse.Namespace) -> int:
    if args.dir is not None:
        if args.a or args.b:
            raise LabError("give a pair directory or --a/--b runs, not both")
        from tierlab import labgate

        return labgate.report_dir(Path(args.dir), Path(args.out or Path(args.dir) / "report"),
                                  args.set)
    if not args.a or not args.b or not args.out:
        missing = [o for o, v in (("--a", args.a), ("--b", args.b), ("-o", args.out)) if not v]
        raise LabError(f"{', '.join(missing)} required: want --a RUN.json... --b RUN.json... "
                       "-o DIR (or a pair directory)")
    g = _gate_from_args(args)
    runs_a, runs_b = _load_arm(args.a), _load_arm(args.b)
    labels = (_label(args.label_a, runs_a, "A"), _label(args.label_b, runs_b, "B"))
    if labels[0] == labels[1]:
        labels = (f"{labels[0]} (A)", f"{labels[1]} (B)")
    summary = compare(runs_a, runs_b, g)
    images = make_images(summary, runs_a, runs_b, labels)
    md, html = render(summary, runs_a, runs_b, labels, images, g)
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, data in images.items():
            (out / f"{name}.png").write_bytes(data)
        (out / "report.md").write_text(md)
        (out / "report.html").write_text(html)
        (out / "summary.json").write_text(json.dumps(
            dict(summary, labels=list(labels), a=args.a, b=args.b), indent=1) + "\n")
    except OSError as e:
        raise LabError(f"-o {out}: {e.strerror}") from None
    _print_summary(summary, labels, out)
    return 1 if summary["gate_passed"] is False else 0


def _print_summary(summary: dict[str, Any], labels: tuple[str, str], out: Path) -> None:
    op = "all" if "all" in summary["ops"] else summary["ops"][0]
    r = _row(summary["table"], op, "p99")
    print(f"tierlab report: {op} p99 {labels[1]}/{labels[0]} = {r['ratio']:.3f}"
          f"{_ci(r['lo'], r['hi'])}{' (significant)' if r['significant'] else ''} -> "
          f"{out / 'report.html'}")
    if not summary["concurrency"]["concurrent"]:
        print(f"  warning: {summary['concurrency']['text']}")
    for c in summary["gate"]:
        print(f"  {'PASS' if c['passed'] else 'FAIL'} {c['criterion']}: {c['text']}")
    if summary["gate_passed"] is not None:
        print(f"gate: {'PASS' if summary['gate_passed'] else 'FAIL'}")
