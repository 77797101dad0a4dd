"""The gate and the report of a `tierlab pair` directory (docs/lab/pair.md).

    tierlab gate DIR [--set gate.KEY=VALUE]...      # exit 0 pass, 1 fail, 2 bad input
    tierlab report DIR [-o OUT] [--set ...]         # DIR/report/ by default; same exit

Arm A is the reference (control, or the baseline build), arm B the one judged
(active, or the candidate); ratios are B/A. The gate decides only on this fixed
set of criteria (every profile the same; a profile sets only the bounds), each
computed per pair or per run:

- runs completed: every run of every pair finished (a hung or failed run fails);
- p99 ratio: geometric mean over pairs of p99(B)/p99(A) of the gate op, with a
  bootstrap interval over pairs; passes when the point estimate <= bound;
- throughput ratio: the same over achieved ops/s; passes when >= bound;
- max latency: no operation of the gate op in any run of B above the bound (arm
  A's maximum is shown beside it, not gated);
- background work: the least any run of B wrote to slow members from the
  profile's background origins >= background_min_bytes;
- edge inventory: during the foreground phases (ctl snapshots `start` -> `end`)
  slow members saw I/O only from allowlisted origins, in every run of B; the
  table lists every other origin with ops and bytes, for both arms;
- spill (only with spill_min_bytes > 0, the spill profile's condition): every
  completed run of both arms wrote at least that much user data
  (foreground_write) to slow members during the measured phase -- a run in
  which the fast tier never filled measured something else;
- fsck clean on every run of both arms;
- quiescence: every run of B reached a quiet window within quiesce_max_s (arm
  A's shown, not gated);
- foreground errors: no probe operation failed in any run of B (arm A's shown,
  not gated);
- rate kept: no probe of either arm fell behind its schedule.

Baseline against candidate (`--baseline/--candidate`) the gate judges a change:
an absolute criterion of B (max latency, background work, edge inventory,
quiescence, foreground errors) that the baseline fails as badly is marked
"pre-existing" and does not fail the gate -- the change did not cause it, and
the same filesystem failing it in both arms must not block every change until
it is fixed. "As badly" needs A to fail the criterion too, and: no more runs
of B fail it than of A, with B's worst at most PREEXISTING_MARGIN (1.5) times
A's worst (max latency: the largest maximum; quiescence: the longest time, not
quiet counting as infinite; foreground errors: the total failed operations);
B's least background bytes at least throughput_ratio_min times A's; B's
non-allowlisted slow-member ops and bytes, summed over its runs, at most
p99_ratio_max times A's (origin names may differ between builds). The verdict
line names every pre-existing failure. With active/control arms (one build)
nothing is pre-existing.

`--set` here takes only gate.* keys (what ran cannot change afterwards); the
overrides are recorded (`overrides`) and printed as "bounds overridden after
the run: ...".

Everything else in the report (the per-op latency table, slot bias, the fault
windows) is for reading, not deciding; the per-op table carries a
multiple-comparison correction (report.py)."""

from __future__ import annotations

import argparse
import base64
import html
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tierlab import LabError, guestmem
from tierlab import gate as gate_mod
from tierlab import profile as profile_mod
from tierlab import report as report_mod
from tierlab import schema
from tierlab.hist import Histogram
from tierlab.report import fmt_ns
from tierlab.stats import compare_quantiles, compare_values, log_ratio_sigma, pairs_needed

A_ARMS = ("control", "baseline")
B_ARMS = ("active", "candidate")
WINDOW_BEFORE_S = 5
PREEXISTING_MARGIN = 1.5  # maxima and error counts of a few runs are noisy
WINDOW_AFTER_S = 10


@dataclass
class LabRun:
    path: Path
    info: dict[str, Any]
    probe: report_mod.Run | None
    ctl: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.info.get("status") == "ok" and self.probe is not None

    @property
    def pair(self) -> int:
        return int(self.info["pair"])

    @property
    def name(self) -> str:
        return self.path.name


@dataclass
class LabDir:
    path: Path
    meta: dict[str, Any]
    prof: profile_mod.Profile
    a_name: str
    b_name: str
    a: list[LabRun]
    b: list[LabRun]
    overrides: list[str] = field(default_factory=list)   # gate.* --set after the run


def _json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise LabError(f"{path}: no such file") from None
    except (OSError, json.JSONDecodeError) as e:
        raise LabError(f"{path}: not readable JSON ({e})") from None


def load(d: Path, sets: list[str]) -> LabDir:
    if not (d / "lab.json").is_file():
        raise LabError(f"{d}: not a tierlab pair directory (no lab.json)")
    meta = _json(d / "lab.json")
    if meta.get("format") != "tierlab-pair":
        raise LabError(f"{d}/lab.json: not a tierlab pair document")
    for s_ in sets:  # what ran is fixed; only the gate's bounds may move afterwards
        if not s_.partition("=")[0].strip().startswith("gate."):
            raise LabError(f"--set {s_}: after the run only gate.* bounds can be changed")
    prof_file = d / "profile.toml"
    # The copy in DIR is what ran; its relative fault paths name workloads/profiles/.
    prof = profile_mod.load(str(prof_file), list(meta.get("sets", [])) + sets)
    prof.name = meta.get("profile", prof.name)
    arms = [a["name"] for a in meta["arms"]]
    a_name = next((n for n in arms if n in A_ARMS), arms[0])
    b_name = next((n for n in arms if n in B_ARMS), arms[-1])
    runs: dict[str, list[LabRun]] = {a_name: [], b_name: []}
    for sub in sorted((d / "runs").glob("p*-*")):
        if not (sub / "run.json").is_file():
            continue
        info = _json(sub / "run.json")
        probe = None
        if (sub / "probe.json").is_file():
            probe = report_mod.Run(str(sub / "probe.json"), schema.load(sub / "probe.json"))
        r = LabRun(sub, info, probe)
        for edge in ("start", "measure", "end", "idle"):
            f = sub / f"ctl-{edge}.json"
            if f.is_file():
                r.ctl[edge] = _json(f)
        if info.get("arm") not in runs:
            raise LabError(f"{sub}/run.json: arm {info.get('arm')!r} is not one of {arms}")
        runs[info["arm"]].append(r)
    if not runs[a_name] and not runs[b_name]:
        raise LabError(f"{d}: no runs (runs/*/run.json)")
    return LabDir(d, meta, prof, a_name, b_name, runs[a_name], runs[b_name], list(sets))


# ------------------------------------------------------------------ counters

def io_delta(before: dict[str, Any], after: dict[str, Any], group: str, view: str = "tierfs",
             ) -> dict[str, dict[str, dict[str, dict[str, int]]]]:
    """member -> origin -> op -> {ops, bytes} between two ctl snapshots, for the
    members of `group`: tierfs's own per-origin counters (view "tierfs", devices[].io)
    or the fault device's count of what reached it (view "device", devices[].fault.io;
    it also sees I/O that goes around tierfs's queue, such as mount's superblocks)."""
    def io(dev: dict[str, Any]) -> dict[str, Any]:
        if view == "device":
            return (dev.get("fault") or {}).get("io") or {}
        return dev.get("io") or {}

    def index(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
        return {dv["label"]: dv for dv in doc.get("devices", []) if dv.get("group") == group}

    b, a = index(before), index(after)
    out: dict[str, dict[str, dict[str, dict[str, int]]]] = {}
    for label, dev in a.items():
        prev = io(b.get(label, {}))
        for origin, ops in io(dev).items():
            if not isinstance(ops, dict):
                continue
            for op, v in ops.items():
                if not isinstance(v, dict):
                    continue
                p = prev.get(origin, {}).get(op, {})
                n = int(v.get("ops", 0)) - int(p.get("ops", 0))
                nb = int(v.get("bytes", 0)) - int(p.get("bytes", 0))
                if n or nb:
                    out.setdefault(label, {}).setdefault(origin, {})[op] = {"ops": n, "bytes": nb}
    return out


def inventory(r: LabRun, prof: profile_mod.Profile, view: str = "tierfs",
              ) -> dict[str, Any] | None:
    """The edge inventory of one run: slow members' I/O during the foreground phases
    (ctl `start` -> `end`), in one view (io_delta)."""
    if "start" not in r.ctl or "end" not in r.ctl:
        return None
    return io_delta(r.ctl["start"], r.ctl["end"], prof.gate["slow_group"], view)


def offending(inv: dict[str, Any], allow: list[str]) -> list[tuple[str, str, str, int, int]]:
    rows = []
    for member, origins in sorted(inv.items()):
        for origin, ops in sorted(origins.items()):
            if origin in allow:
                continue
            for op, v in sorted(ops.items()):
                rows.append((member, origin, op, v["ops"], v["bytes"]))
    return rows


def offending_both(r: LabRun, prof: profile_mod.Profile) -> list[tuple[str, str, str, int, int]] | None:
    """Non-allowlisted slow-member I/O in either view (None without snapshots)."""
    inv = inventory(r, prof)
    if inv is None:
        return None
    rows = offending(inv, prof.gate["allowlist"])
    seen = {(m, o, op) for m, o, op, _, _ in rows}
    dev = inventory(r, prof, "device") or {}
    rows += [x for x in offending(dev, prof.gate["allowlist"]) if x[:3] not in seen]
    return rows


def background_bytes(r: LabRun, prof: profile_mod.Profile) -> int | None:
    """Bytes written to slow members by the background origins over the whole run."""
    if "start" not in r.ctl or "idle" not in r.ctl:
        return None
    d = io_delta(r.ctl["start"], r.ctl["idle"], prof.gate["slow_group"])
    return sum(v.get("write", {}).get("bytes", 0) for origins in d.values()
               for o, v in origins.items() if o in prof.gate["background_origins"])


def spill_bytes(r: LabRun, prof: profile_mod.Profile) -> int | None:
    """User data (foreground_write) written to slow members during the measured
    phase (ctl `measure` -> `end`): the spill profile's condition."""
    if "measure" not in r.ctl or "end" not in r.ctl:
        return None
    d = io_delta(r.ctl["measure"], r.ctl["end"], prof.gate["slow_group"])
    return sum(origins.get("foreground_write", {}).get("write", {}).get("bytes", 0)
               for origins in d.values())


# ------------------------------------------------------------------ the gate

def _paired(ld: LabDir) -> list[tuple[LabRun, LabRun]]:
    a = {r.pair: r for r in ld.a if r.ok}
    b = {r.pair: r for r in ld.b if r.ok}
    return [(a[p], b[p]) for p in sorted(set(a) & set(b))]


def evaluate(ld: LabDir) -> dict[str, Any]:
    g, prof = ld.prof.gate, ld.prof
    op = g["op"]
    crit: list[dict[str, Any]] = []

    def add(name: str, passed: bool, text: str, gating: bool = True) -> None:
        crit.append({"criterion": name, "passed": passed, "text": text, "gating": gating})

    # How badly each arm failed the absolute criteria, for "pre-existing" (see the
    # module docstring): criterion of B -> (B's measure, A's measure).
    worse: dict[str, list[Any]] = {}

    every = ld.a + ld.b
    failed = [r for r in every if not r.ok]
    want = ld.meta.get("pairs", 0) * 2
    add("runs completed", not failed and len(every) >= want,
        f"{len(every) - len(failed)} of {max(want, len(every))} runs completed" +
        ("" if not failed else "; failed: " + "; ".join(
            f"{r.name}: {r.info.get('error') or 'no probe document'}" for r in failed)))

    pairs = _paired(ld)
    sigma = None
    if not pairs:
        add("p99 ratio", False, "no pair with both runs completed: nothing to compare")
        add("throughput ratio", False, "no pair with both runs completed")
    else:
        for r in (x for pr in pairs for x in pr):
            if op not in r.probe.meas["ops"]:
                raise LabError(f"{r.probe.path}: no op '{op}' (gate.op)")
        pa = [float(a.probe.hist(op).quantile(0.99)) for a, _ in pairs]
        pb = [float(b.probe.hist(op).quantile(0.99)) for _, b in pairs]
        idx = [a.pair for a, _ in pairs]
        method = "pairs" if len(pairs) >= 2 else "none"
        rr = compare_values(pa, pb, method, idx, idx)
        ci = f", 95% CI [{rr.lo:.3f}, {rr.hi:.3f}]" if rr.lo is not None else " (one pair: no interval)"
        add("p99 ratio", rr.value <= g["p99_ratio_max"],
            f"{op} p99 {ld.b_name}/{ld.a_name}: geometric mean of {len(pairs)} per-pair ratios = "
            f"{rr.value:.3f}{ci}; bound <= {g['p99_ratio_max']:.2f}")
        sigma = log_ratio_sigma(pa, pb)
        ta = [float(a.probe.meas["throughput"]["ops_per_s"]) for a, _ in pairs]
        tb = [float(b.probe.meas["throughput"]["ops_per_s"]) for _, b in pairs]
        tr = compare_values(ta, tb, method, idx, idx)
        ci = f", 95% CI [{tr.lo:.3f}, {tr.hi:.3f}]" if tr.lo is not None else ""
        add("throughput ratio", tr.value >= g["throughput_ratio_min"],
            f"ops/s {ld.b_name}/{ld.a_name} = {tr.value:.3f}{ci} "
            f"(mean {np.mean(tb):.1f} vs {np.mean(ta):.1f}); bound >= {g['throughput_ratio_min']:.2f}")

    bound_ns = g["max_latency_s"] * 1e9
    for arm, runs, gating in ((ld.b_name, ld.b, True), (ld.a_name, ld.a, False)):
        ok = [r for r in runs if r.ok]
        if not ok:
            add(f"max latency ({arm})", False, f"no completed run of {arm}", gating)
            continue
        over = [r for r in ok if r.probe.hist(op).max > bound_ns]
        worst = max(ok, key=lambda r: r.probe.hist(op).max)
        worse.setdefault("max latency", [None, None])[0 if gating else 1] = (
            len(over), float(worst.probe.hist(op).max))
        add(f"max latency ({arm})", not over,
            f"{op} max over {len(ok)} runs = {fmt_ns(worst.probe.hist(op).max)} ({worst.name}); "
            f"{len(over)} of {len(ok)} runs above the bound {fmt_ns(bound_ns)}" +
            (": " + ", ".join(f"{r.name} {fmt_ns(r.probe.hist(op).max)}" for r in over)
             if over else "") + ("" if gating else " (reference arm: shown, not gated)"), gating)

    def least_background(runs: list[LabRun]) -> tuple[list[Any], list[Any]]:
        bg = [(r, background_bytes(r, prof)) for r in runs if r.ok]
        return bg, [(r, n) for r, n in bg if n is not None]

    a_bg, a_known = least_background(ld.a)
    if a_known and len(a_known) == len(a_bg):
        worse["background work"] = [None, min(n for _, n in a_known)]
    bg, known = least_background(ld.b)
    if not known:
        add("background work", False, f"no completed run of {ld.b_name} with ctl snapshots")
    else:
        least = min(known, key=lambda x: x[1])
        if len(known) == len(bg):
            worse.setdefault("background work", [None, None])[0] = least[1]
        add("background work", least[1] >= g["background_min_bytes"] and len(known) == len(bg),
            f"least written to {g['slow_group']} members by {'/'.join(g['background_origins'])} "
            f"in a run of {ld.b_name}: {profile_mod.size_text(least[1]) if least[1] else '0 B'} "
            f"({least[0].name}); bound >= {profile_mod.size_text(g['background_min_bytes'])}")

    allow = g["allowlist"]

    def not_allowed(runs: list[LabRun]) -> tuple[list[Any], tuple[int, int] | None]:
        """The runs with slow-member I/O not allowlisted (or no snapshots), and
        that I/O's ops and bytes summed over the runs (None if a run has none)."""
        bad, ops, nbytes, known_all = [], 0, 0, True
        for r in runs:
            rows = offending_both(r, prof) if r.ok else None
            if rows is None or rows:
                bad.append((r, rows))
            if rows is None:
                known_all = known_all and not r.ok
                continue
            ops += sum(x[3] for x in rows)
            nbytes += sum(x[4] for x in rows)
        return bad, (ops, nbytes) if known_all else None

    bad_runs, b_volume = not_allowed(ld.b)
    worse["edge inventory"] = [b_volume, not_allowed(ld.a)[1]]
    names = sorted({f"{o} {op_}" for _, rows in bad_runs if rows for _, o, op_, _, _ in rows})
    add("edge inventory", not bad_runs,
        f"{g['slow_group']} members saw only {', '.join(allow)} during foreground phases in every "
        f"run of {ld.b_name}" if not bad_runs else
        f"{len(bad_runs)} of {len(ld.b)} runs of {ld.b_name} saw other origins on "
        f"{g['slow_group']} members during foreground phases: {', '.join(names) or 'no snapshots'}"
        " (table below)")

    if g["spill_min_bytes"] > 0:
        spilled = [(r, spill_bytes(r, prof)) for r in every if r.ok]
        short = [(r, n) for r, n in spilled if n is None or n < g["spill_min_bytes"]]

        def amount(n: int | None) -> str:
            return "no snapshots" if n is None else profile_mod.size_text(n) if n else "0 B"
        least = min(spilled, key=lambda x: -1 if x[1] is None else x[1]) if spilled else None
        add("spill", bool(spilled) and not short,
            ("no completed run" if least is None else
             f"least user data written to {g['slow_group']} members during the measured phase: "
             f"{amount(least[1])} ({least[0].name})") +
            f"; bound >= {profile_mod.size_text(g['spill_min_bytes'])} in every run of both arms" +
            ("" if not short else "; the condition did not happen in: " +
             ", ".join(f"{r.name} {amount(n)}" for r, n in short)))

    dirty = [r for r in every if not (r.info.get("fsck") or {}).get("clean")]
    add("fsck clean", not dirty,
        f"fsck -n clean after all {len(every)} runs" if not dirty else
        f"{len(dirty)} of {len(every)} runs not clean: " + ", ".join(
            f"{r.name} ({(r.info.get('fsck') or {}).get('last', 'not run')})" for r in dirty))

    qb = g["quiesce_max_s"]
    for arm, runs, gating in ((ld.b_name, ld.b, True), (ld.a_name, ld.a, False)):
        vals = [(r, r.info.get("quiescence_s")) for r in runs if r.ok]
        late = [(r, v) for r, v in vals if v is None or v > qb]
        worse.setdefault("quiescence", [None, None])[0 if gating else 1] = (
            (len(late), max(math.inf if v is None else v for _, v in vals)) if vals else None)
        text = ", ".join(f"{r.name} " + (f"{v:.1f} s" if v is not None else
                                         f"not quiet within {prof.quiesce['max_s']:g} s")
                         for r, v in vals)
        add(f"quiescence ({arm})", bool(vals) and not late,
            f"time from the end of the workload to the first {prof.quiesce['window_s']:g} s "
            f"without device writes: {text or 'no completed run'}; bound <= {qb:g} s" +
            ("" if gating else " (reference arm: shown, not gated)"), gating)

    # A foreground op that failed (tierprobe --keep-going counts them) is never
    # noise: on healthy fast-tier data, EUCLEAN or EIO is a broken promise.
    # Gated on arm B like max latency; arm A is shown beside it.
    for arm, runs, gating in ((ld.b_name, ld.b, True), (ld.a_name, ld.a, False)):
        ok = [r for r in runs if r.ok]
        erred = [(r, int(r.probe.meas["counters"].get("errors", 0))) for r in ok]
        erred = [(r, n) for r, n in erred if n > 0]
        worse.setdefault("foreground errors", [None, None])[0 if gating else 1] = (
            (len(erred), sum(n for _, n in erred)) if ok else None)
        text = (f"no completed run of {arm}" if not ok else
                f"no probe operation failed in {len(ok)} runs" if not erred else
                f"{len(erred)} of {len(ok)} runs had failed probe operations: " + ", ".join(
                    f"{r.name} {n} ({', '.join(k[7:] + ' ' + str(int(v)) for k, v in r.probe.meas['counters'].items() if k.startswith('errors_') and v)})"
                    for r, n in erred))
        add(f"foreground errors ({arm})", bool(ok) and not erred,
            text + ("" if gating else " (reference arm: shown, not gated)"), gating)

    behind = [r for r in every if r.ok and r.probe.fell_behind]
    add("rate kept", not behind,
        "every probe kept its schedule" if not behind else
        f"{len(behind)} run(s) fell behind (closed-loop, hides stalls): " +
        ", ".join(r.name for r in behind))

    if ld.a_name == "baseline":
        for c in crit:
            base = c["criterion"].replace(f" ({ld.b_name})", "")
            if c["passed"] or not c["gating"] or base not in worse:
                continue
            why = _as_badly(base, *worse[base], g)
            if why is not None:
                c["preexisting"] = True
                c["text"] += f"; pre-existing: the {ld.a_name} fails it as badly ({why})"

    gating = [c for c in crit if c["gating"]]
    noise = None
    if sigma is not None:
        noise = {"sigma": sigma, "pairs": len(pairs),
                 "pairs_needed": pairs_needed(sigma, g["p99_ratio_max"]),
                 "bound": g["p99_ratio_max"]}
    return {"criteria": crit, "passed": all(c["passed"] or c.get("preexisting") for c in gating),
            "preexisting": [c["criterion"] for c in gating if not c["passed"] and c.get("preexisting")],
            "noise": noise,
            "a": ld.a_name, "b": ld.b_name, "op": op, "overrides": list(ld.overrides)}


def _as_badly(base: str, b: Any, a: Any, g: dict[str, Any]) -> str | None:
    """Why the reference arm fails criterion `base` at least as badly as B (B's
    and A's measures from evaluate), or None if it does not (or passes it)."""
    if a is None or b is None:
        return None
    if base == "background work":
        ok = a < g["background_min_bytes"] and b >= a * g["throughput_ratio_min"]
        return (f"least {profile_mod.size_text(a) if a else '0 B'} against "
                f"{profile_mod.size_text(b) if b else '0 B'}") if ok else None
    if base == "edge inventory":
        (bo, bb), (ao, ab) = b, a
        lim = g["p99_ratio_max"]
        ok = (ao, ab) != (0, 0) and bo <= ao * lim and bb <= ab * lim
        return f"{ao} ops, {ab} bytes not allowed against {bo} ops, {bb} bytes" if ok else None
    (bn, bw), (an, aw) = b, a
    ok = an > 0 and bn <= an and bw <= aw * PREEXISTING_MARGIN
    if not ok:
        return None
    worst = {"max latency": lambda v: f"worst {fmt_ns(v)}",
             "quiescence": lambda v: "worst not quiet" if v == math.inf else f"worst {v:.1f} s",
             "foreground errors": lambda v: f"{v} failed operations in all"}[base]
    return f"{an} runs failing, {worst(aw)}, against {bn}, {worst(bw)}"


def verdict_line(res: dict[str, Any]) -> str:
    pre = res.get("preexisting") or []
    tail = ("" if not pre else f" (no regression; failing in the baseline as badly: {', '.join(pre)})"
            if res["passed"] else f" (besides the regression, failing in the baseline as badly: {', '.join(pre)})")
    return f"gate: {'PASS' if res['passed'] else 'FAIL'}{tail}"


def _mark(c: dict[str, Any]) -> str:
    return "PASS" if c["passed"] else "FAIL (pre-existing)" if c.get("preexisting") else "FAIL"


def overrides_line(res: dict[str, Any]) -> str | None:
    ov = res.get("overrides") or []
    return f"bounds overridden after the run: {', '.join(ov)}" if ov else None


def noise_line(noise: dict[str, Any] | None) -> str:
    if noise is None:
        return "noise: fewer than 2 complete pairs, no sigma"
    return (f"noise: sigma(log per-pair p99 ratio) = {noise['sigma']:.3f} over {noise['pairs']} "
            f"pairs; resolving a ratio of {noise['bound']:.2f} takes about "
            f"{noise['pairs_needed']} pairs (half-width 2 sigma/sqrt(n) <= log {noise['bound']:.2f})")


def print_gate(res: dict[str, Any]) -> None:
    if overrides_line(res):
        print(f"  {overrides_line(res)}")
    for c in res["criteria"]:
        mark = _mark(c)
        print(f"  {mark if c['gating'] else mark.lower() + ' (info)'} {c['criterion']}: {c['text']}")
    print(f"  {noise_line(res['noise'])}")
    print(verdict_line(res))


# ------------------------------------------------------------------ the report

class Doc:
    """The report as sections of paragraphs, tables and images; written as both
    markdown and self-contained HTML."""

    def __init__(self) -> None:
        self.parts: list[tuple[str, Any]] = []

    def h(self, text: str, level: int = 2) -> None:
        self.parts.append(("h", (level, text)))

    def p(self, text: str) -> None:
        self.parts.append(("p", text))

    def ul(self, items: list[str]) -> None:
        self.parts.append(("ul", items))

    def table(self, header: list[str], rows: list[list[Any]]) -> None:
        self.parts.append(("table", (header, [[str(c) for c in r] for r in rows])))

    def img(self, name: str, title: str, data: bytes) -> None:
        self.parts.append(("img", (name, title, data)))

    def markdown(self) -> str:
        out = []
        for kind, v in self.parts:
            if kind == "h":
                out.append("#" * v[0] + " " + v[1])
            elif kind == "p":
                out.append(v)
            elif kind == "ul":
                out.append("\n".join(f"- {x}" for x in v))
            elif kind == "table":
                header, rows = v
                lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
                out.append("\n".join(lines))
            elif kind == "img":
                out.append(f"![{v[1]}]({v[0]}.png)")
        return "\n\n".join(out) + "\n"

    def html(self, title: str) -> str:
        e = html.escape
        out = [f"<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\" />\n"
               f"<title>{e(title)}</title>\n<style>\nbody {{ font-family: sans-serif; "
               "max-width: 80em; margin: 1em auto; padding: 0 1em; color: #222; }\n"
               "table { border-collapse: collapse; margin: 0.5em 0 1.5em; }\n"
               "th, td { border: 1px solid #ccc; padding: 0.2em 0.6em; font-size: 0.9em; }\n"
               "img { max-width: 100%; }\n</style>\n</head>\n<body>"]
        for kind, v in self.parts:
            if kind == "h":
                out.append(f"<h{v[0]}>{e(v[1])}</h{v[0]}>")
            elif kind == "p":
                out.append(f"<p>{e(v)}</p>")
            elif kind == "ul":
                out.append("<ul>" + "".join(f"<li>{e(x)}</li>" for x in v) + "</ul>")
            elif kind == "table":
                header, rows = v
                out.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in header) + "</tr>" +
                           "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>"
                                   for r in rows) + "</table>")
            elif kind == "img":
                b64 = base64.b64encode(v[2]).decode("ascii")
                out.append(f"<p><img id=\"plot-{e(v[0])}\" alt=\"{e(v[1])}\" "
                           f"src=\"data:image/png;base64,{b64}\" /></p>")
        out.append("</body>\n</html>\n")
        return "\n".join(out)


def _ci_text(lo: float | None, hi: float | None) -> str:
    return f"[{lo:.3f}, {hi:.3f}]" if lo is not None and hi is not None else "n/a"


def engines_working(ld: LabDir) -> bool | None:
    """Whether any run's start snapshot shows a background engine with a
    thread (state other than `off`: docs/usage.md, `engines`); None when no
    start snapshot has engines to look at (an older build, a run without
    its snapshot)."""
    seen = False
    for r in ld.a + ld.b:
        engines = (r.ctl.get("start") or {}).get("engines")
        if not isinstance(engines, dict):
            continue
        for e in engines.values():
            if isinstance(e, dict):
                seen = True
                if e.get("state", "off") != "off":
                    return True
    return False if seen else None


def build_report(ld: LabDir, res: dict[str, Any]) -> tuple[Doc, dict[str, Any]]:
    from tierlab import plots

    prof, op = ld.prof, res["op"]
    d = Doc()
    d.h(f"Lab report: profile {prof.name}", 1)
    arms = ", ".join(f"{a['name']} ({a['build']}" + (", background paused" if a.get("pause") else "")
                     + ")" for a in ld.meta["arms"])
    d.p(f"{prof.description}. Arms: {arms}. {ld.meta.get('pairs')} pairs, seed "
        f"{ld.meta.get('seed')}, both arms of a pair at the same time in two slots, slots "
        f"swapped every pair. A = {ld.a_name}, B = {ld.b_name}; ratios are B/A. Wall time "
        f"{ld.meta.get('wall_s', '?')} s.")
    pause = [r.info.get("pause") for r in ld.a + ld.b if r.info.get("pause")]
    if pause and any(p_["rc"] != 0 for p_ in pause):
        d.p(f"Note: `tierfs ctl MNT pause all` is not available in this build "
            f"(\"{pause[0]['reply']}\"): the control arm ran the profile's background workload "
            "unpaused, so active and control are the same configuration (an A/A comparison).")
    elif pause and engines_working(ld) is False:
        d.p("Note: the control arm paused the background engines, but no engine has work in "
            "this build (every engine's state was `off` at the start edge), so active and "
            "control are the same configuration (an A/A comparison).")
    d.h(verdict_line(res).replace("gate: ", "Gate: ", 1))
    if overrides_line(res):
        d.p(f"**{overrides_line(res)}** (the profile that ran had other bounds).")
    d.ul([f"{_mark(c)}{'' if c['gating'] else ' (not gated)'} "
          f"{c['criterion']}: {c['text']}" for c in res["criteria"]])
    d.p(noise_line(res["noise"]) + ".")

    pairs = _paired(ld)
    summary: dict[str, Any] = {"gate": res, "overrides": res.get("overrides", []), "pairs": []}
    if pairs:
        d.h(f"Per pair: {op} p99")
        d.p("Each arm's p99 with a 95% interval from resampling its own operations (sampling "
            "noise only, not the run-to-run drift the pairs show); the ratio's interval likewise.")
        rows = []
        for a, b in pairs:
            ha, hb = a.probe.hist(op), b.probe.hist(op)
            rq = compare_quantiles([ha], [hb], [0.99], "operations")[0.99]
            ia = _own_ci(ha)
            ib = _own_ci(hb)
            rows.append([a.pair, f"{a.info['slot']}/{b.info['slot']}",
                         f"{fmt_ns(ha.quantile(0.99))} {ia}", f"{fmt_ns(hb.quantile(0.99))} {ib}",
                         f"{rq.value:.3f} {_ci_text(rq.lo, rq.hi)}", fmt_ns(ha.max), fmt_ns(hb.max),
                         f"{a.probe.meas['throughput']['ops_per_s']:.1f} / "
                         f"{b.probe.meas['throughput']['ops_per_s']:.1f}"])
            summary["pairs"].append({"pair": a.pair, "slot_a": a.info["slot"],
                                     "slot_b": b.info["slot"], "p99_a_ns": ha.quantile(0.99),
                                     "p99_b_ns": hb.quantile(0.99), "ratio": rq.value,
                                     "max_a_ns": ha.max, "max_b_ns": hb.max})
        d.table(["pair", f"slot {ld.a_name}/{ld.b_name}", f"p99 {ld.a_name}", f"p99 {ld.b_name}",
                 "B/A", f"max {ld.a_name}", f"max {ld.b_name}", "ops/s A / B"], rows)
        # slot bias: slot 1 over slot 0, whatever the arm
        s_ratio = []
        for a, b in pairs:
            by_slot = {a.info["slot"]: a, b.info["slot"]: b}
            if set(by_slot) == {0, 1}:
                s_ratio.append(by_slot[1].probe.hist(op).quantile(0.99) /
                               max(1, by_slot[0].probe.hist(op).quantile(0.99)))
        if s_ratio:
            gm = float(np.exp(np.mean(np.log(np.maximum(s_ratio, 1e-9)))))
            d.p(f"Slot bias: p99 of slot 1 / slot 0, whatever arm ran there, geometric mean "
                f"{gm:.3f} over {len(s_ratio)} pairs (the arms swap slots each pair, so this "
                "cancels from the arm ratio when the pairs are even).")
            summary["slot_bias"] = gm

    # per run: the latency distribution and the slow operations, per op
    slow_ns = int(prof.gate.get("slow_op_s", 0.05) * 1e9)
    runs = [r for r in ld.a + ld.b if r.probe]
    if runs:
        d.h(f"Per run: {op} latency and operations above {fmt_ns(slow_ns)}")
        d.p(f"Every run of both arms (`[gate] slow_op`; counted by histogram bucket, so an "
            f"operation within ~3% of {fmt_ns(slow_ns)} may be left out). Not gated: the "
            "absolute bound is max latency above.")
        rows = []
        summary["runs_slow"] = []
        for r in runs:
            h = r.probe.hist(op)
            per = {o: r.probe.hist(o).count_above(slow_ns) for o in r.probe.ops() if o != "all"}
            per = {o: n for o, n in per.items() if n}
            n_slow = h.count_above(slow_ns)
            rows.append([r.name, h.count, fmt_ns(h.quantile(0.5)), fmt_ns(h.quantile(0.99)),
                         fmt_ns(h.quantile(0.999)), fmt_ns(h.max), n_slow,
                         ", ".join(f"{o} {n}" for o, n in per.items()) or "-"])
            summary["runs_slow"].append({"run": r.name, "ops": h.count, "slow_ns": slow_ns,
                                         "slow": n_slow, "slow_by_op": per})
        d.table(["run", "ops", "p50", "p99", "p99.9", "max", f"> {fmt_ns(slow_ns)}", "by op"], rows)

    # edge inventory
    d.h("Edge inventory")
    d.p(f"I/O on {prof.gate['slow_group']} members during the foreground phases (ctl snapshots "
        f"start -> end: probe setup, warm-up, measured phase): ops and bytes by tierfs's own "
        f"per-origin counters, and as the member's fault device counted what reached it (which "
        f"includes I/O that goes around tierfs's queue). Allowed: "
        f"{', '.join(prof.gate['allowlist'])}; every other origin is listed, per run.")
    inv_rows = []
    for r in ld.a + ld.b:
        inv, dev = inventory(r, prof), inventory(r, prof, "device")
        if inv is None:
            inv_rows.append([r.info["arm"], r.name, "-", "(no snapshots)", "", "", "", "", "", ""])
            continue
        keys = sorted({(m, o, op_) for view in (inv, dev or {}) for m, origins in view.items()
                       for o, ops in origins.items() for op_ in ops})
        for m, o, op_ in keys:
            t = inv.get(m, {}).get(o, {}).get(op_, {"ops": 0, "bytes": 0})
            v = (dev or {}).get(m, {}).get(o, {}).get(op_)
            inv_rows.append([r.info["arm"], r.name, m, o, op_, t["ops"], t["bytes"],
                             v["ops"] if v else "-", v["bytes"] if v else "-",
                             "allowed" if o in prof.gate["allowlist"] else "NOT ALLOWED"])
        if not keys:
            inv_rows.append([r.info["arm"], r.name, "-", "(no I/O)", "", 0, 0, "-", "-", ""])
    d.table(["arm", "run", "member", "origin", "op", "ops", "bytes", "device ops", "device bytes",
             ""], inv_rows)
    summary["edge_inventory"] = {r.name: {"tierfs": inventory(r, prof),
                                          "device": inventory(r, prof, "device")}
                                 for r in ld.a + ld.b}

    # fault events
    events = [(r, e) for r in ld.a + ld.b if r.ok for e in r.info.get("events", [])]
    if events:
        d.h("Around each fault event")
        d.p(f"Per-second {op}-latency p99 of the probe (operations in the second they were meant "
            f"to start) from {WINDOW_BEFORE_S} s before each event to {WINDOW_AFTER_S} s after "
            "it ends; 'before' and 'during/after' are the largest per-second p99 on each side.")
        rows = []
        windows = []
        for r, e in events:
            pts = (r.probe.meas.get("timeseries") or {}).get("points", [])
            t = e["probe_t"]
            lo, hi = t - WINDOW_BEFORE_S, t + e.get("duration_s", 0) + WINDOW_AFTER_S
            win = [p_ for p_ in pts if lo <= p_["t"] <= hi]
            before = max((p_["p99_ns"] for p_ in win if p_["t"] < t), default=0)
            after = max((p_["p99_ns"] for p_ in win if p_["t"] >= int(t)), default=0)
            worst = max(win, key=lambda p_: p_["max_ns"], default=None)
            rows.append([r.info["arm"], r.name, f"{e['member']} {e['command']}",
                         f"{t:.1f} s", e["reply"], fmt_ns(before), fmt_ns(after),
                         fmt_ns(worst["max_ns"]) if worst else "-"])
            windows.append((f"{r.info['arm']} {r.name}", e, [(p_["t"] - t, p_["p99_ns"])
                                                               for p_ in win]))
        d.table(["arm", "run", "event", "probe time", "reply", "p99/s before", "p99/s during+after",
                 "max in window"], rows)
        img = plots.event_windows(windows)
        d.img("events", "Per-second p99 around fault events", img)

    if any(r.info.get("vmstat") for r in ld.a + ld.b):   # VM lab runs only
        summary["guest_memory"] = _guest_memory(d, ld, op)

    # quiescence and fsck per run
    d.h("Runs")
    rows = []
    for r in ld.a + ld.b:
        q = r.info.get("quiescence_s")
        fs = r.info.get("fsck") or {}
        m = r.probe.hist(op).max if r.probe else None
        rows.append([r.info["arm"], r.name, r.info.get("slot"), r.info.get("status"),
                     r.info.get("wall_s"), "-" if q is None else f"{q:.1f} s",
                     "clean" if fs.get("clean") else f"NOT CLEAN ({fs.get('last', 'not run')})",
                     fmt_ns(m) if m is not None else "-",
                     "yes" if (r.probe and r.probe.fell_behind) else "no",
                     r.info.get("error") or ""])
    d.table(["arm", "run", "slot", "status", "wall s", "quiescence", "fsck", f"{op} max",
             "fell behind", "error"], rows)

    # the full latency table (report.py), multiple-comparison corrected
    # only complete pairs, as the gate's ratios: an unpaired run would tilt one arm
    ra = [a.probe for a, _ in pairs]
    rb = [b.probe for _, b in pairs]
    if ra and rb:
        cmp = report_mod.compare(ra, rb, gate_mod.Gate(op=op))
        summary["latency"] = cmp
        d.h("Latency by op (for reading, not gating)")
        d.p(f"Per op and statistic: each arm's geometric mean over runs, B/A, its 95% interval "
            f"({report_mod.METHOD_TEXT[cmp['method']]}) and a Bonferroni interval for the family "
            f"of {cmp['family']} rows ({100 * cmp['corrected_level']:.2f}%). Only the corrected "
            "interval marks a row significant, and only with at least "
            f"{cmp['units_needed']} pairs (a bootstrap over n pairs is never surer than all n on "
            "one side, which chance gives with probability 2/2^n); the gate above decides on its "
            "own criteria.")
        if not cmp["concurrency"]["concurrent"]:
            d.p(f"Warning: {cmp['concurrency']['text']}.")
        d.table(["op", "stat", ld.a_name, ld.b_name, "B/A", "95% CI", "corrected CI", ""],
                [[row["op"], row["stat"], fmt_ns(row["a_ns"]), fmt_ns(row["b_ns"]),
                  f"{row['ratio']:.3f}", _ci_text(row["lo"], row["hi"]),
                  _ci_text(row["lo_corrected"], row["hi_corrected"]),
                  "significant" if row["significant_corrected"] else ""]
                 for row in cmp["table"]])
        t = cmp["throughput"]
        d.p(f"Throughput: {t['a']:.1f} vs {t['b']:.1f} ops/s, B/A {t['ratio']:.3f} "
            f"{_ci_text(t['lo'], t['hi'])}.")
        images = report_mod.make_images(cmp, ra, rb, (ld.a_name, ld.b_name))
        for name, title, data in report_mod.images_list(images):
            d.img(name, title, data)
    return d, summary


def _guest_memory(d: Doc, ld: LabDir, op: str) -> dict[str, Any]:
    """The "Guest memory" section (VM lab runs): per arm the median of the
    measured phase's reclaim and swap deltas beside the arm's p99, then per run."""
    def num(v: Any) -> str:
        if v is None:
            return "-"
        return f"{v:.1f}" if isinstance(v, float) and v != int(v) and abs(v) < 100 else f"{v:.0f}"

    d.h("Guest memory")
    d.p(f"The guest's /proc/vmstat over the measured phase (its snapshots at the measure and "
        f"end edges): per arm the median over its runs, beside the median of the runs' {op} "
        "p99 and the largest maximum. Swap counts are 4 KiB pages, per second over the "
        "phase's own length (the guest's uptime); allocstall and workingset_refault are "
        "summed over their zones and kinds; the tierfs daemon's major faults are its own "
        "(/proc/PID/stat: a swap-in of its memory or a read of its binary, which the "
        "guest's tmpfs root makes swappable too). Not gated: the gate's max latency and "
        "runs completed (an OOM kill in a guest fails its run) decide.")
    out: dict[str, Any] = {}
    cols = []
    for name, runs in ((ld.a_name, ld.a), (ld.b_name, ld.b)):
        summ = guestmem.arm_summary([r.info for r in runs])
        p99s = [r.probe.hist(op).quantile(0.99) for r in runs if r.probe]
        maxes = [r.probe.hist(op).max for r in runs if r.probe]
        summ["p99_ns"] = guestmem.median([float(x) for x in p99s])
        summ["max_ns"] = max(maxes) if maxes else None
        out[name] = summ
        cols.append(summ)
    rows: list[list[Any]] = [
        ["runs with counters", *[c["runs"] for c in cols]],
        [f"{op} p99 (median)", *[fmt_ns(c["p99_ns"]) if c["p99_ns"] is not None else "-"
                                 for c in cols]],
        [f"{op} max (largest)", *[fmt_ns(c["max_ns"]) if c["max_ns"] is not None else "-"
                                  for c in cols]]]
    rows += [[label, *[num(c[key]) for c in cols]] for key, label in guestmem.ROWS]
    if any(c["hog_passes"] is not None for c in cols):
        rows.append(["hog passes", *[num(c["hog_passes"]) for c in cols]])
        rows.append(["hog chunks rewritten", *[num(c["hog_chunks"]) for c in cols]])
    d.table(["measured phase, median", ld.a_name, ld.b_name], rows)
    per = []
    out["runs"] = {}
    for r in ld.a + ld.b:
        m = (r.info.get("vmstat") or {}).get("measured") or {}
        h = r.info.get("hog") or {}
        o = r.info.get("oom") or {}
        used = guestmem.swap_used_kib(r.info)
        hog = ("-" if not h else f"error: {h['error']}" if h.get("error") else
               f"{h['passes']} passes, {h['chunks']} chunks, " + (
                   f"filled in {h['fill_s']:g} s" if h.get("filled") else "never filled"))
        per.append([r.info["arm"], r.name,
                    fmt_ns(r.probe.hist(op).quantile(0.99)) if r.probe else "-",
                    fmt_ns(r.probe.hist(op).max) if r.probe else "-",
                    num(m.get("pswpin_per_s")), num(m.get("pswpout_per_s")),
                    num(m.get("pgscan_direct")), num(m.get("allocstall")),
                    num(m.get("daemon_majflt")),
                    "-" if used is None else f"{used >> 10} MiB", hog, o.get("kills", 0)])
        out["runs"][r.name] = {"measured": m or None, "hog": h or None, "oom": o or None,
                               "swap_used_end_kib": used, "liveness": r.info.get("liveness")}
    d.table(["arm", "run", f"{op} p99", f"{op} max", "swap in/s", "swap out/s", "pgscan_direct",
             "allocstall", "daemon majflt", "swap used at end", "hog", "OOM kills"], per)
    return out


def _own_ci(h: Histogram) -> str:
    from tierlab.hist import resampled_quantiles

    boot = resampled_quantiles(h, [0.99], 1000, np.random.default_rng(1))[0.99]
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return f"[{fmt_ns(lo)}, {fmt_ns(hi)}]"


def report_dir(d: Path, out: Path, sets: list[str]) -> int:
    ld = load(d, sets)
    res = evaluate(ld)
    doc, summary = build_report(ld, res)
    try:
        out.mkdir(parents=True, exist_ok=True)
        for kind, v in doc.parts:
            if kind == "img":
                (out / f"{v[0]}.png").write_bytes(v[2])
        (out / "report.md").write_text(doc.markdown())
        (out / "report.html").write_text(doc.html(f"Lab report: {ld.prof.name}"))
        (out / "summary.json").write_text(json.dumps(summary, indent=1, default=_plain) + "\n")
    except OSError as e:
        raise LabError(f"{out}: {e.strerror}") from None
    print(f"tierlab report: {d} -> {out / 'report.html'}")
    print_gate(res)
    return 0 if res["passed"] else 1


def _plain(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, float) and math.isnan(o):
        return None
    return str(o)


def gate_main(args: argparse.Namespace) -> int:
    ld = load(Path(args.dir), args.set)
    res = evaluate(ld)
    print(f"tierlab gate: {args.dir}: profile {ld.prof.name}, {ld.b_name} against {ld.a_name}")
    print_gate(res)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1, default=_plain) + "\n")
    return 0 if res["passed"] else 1
