"""The guest's memory in a VM lab run (docs/lab/vmlab.md, "Memory and swap
pressure"): what vmlab/guest/profile-run leaves about memory, turned into
run.json's keys by vmpair.collect, and the per-arm numbers the report's "Guest
memory" section shows (labgate.build_report).

- `vmstat`: /proc/vmstat (and a few /proc/meminfo lines) as the guest
  snapshotted them at each edge (start, measure, end, idle; every counter, as
  the kernel names it), and the measured phase's deltas (measure -> end) of the
  reclaim and swap counters in DELTAS, with swap-in/out per second over the
  phase's own length (the guest's uptime at each snapshot); and the tierfs
  daemon's own page faults and resident/swapped/locked sizes at each edge
  (`daemon`), with its major faults over the measured phase
  (`daemon_majflt`: swap-ins of its heap or reads of its binary, which the
  guest's tmpfs root makes swappable too). A family such as
  `allocstall_*` is summed over what this kernel has; a counter it lacks is 0.
- `oom`: the guest's OOM kills, from its dmesg (the init saves it) and the
  `oom_kill` counter; any is a run error -- a run whose daemon, probe or hog
  the kernel killed did not measure the profile.
- `hog`: the memory hog's own progress (passes over its tmpfs, chunks
  rewritten, how long the fill took; the runner fills it before the workload
  starts), its exit status, and whether it was still running when the runner
  stopped it after the workload (one that ended on its own is an error: it did
  not press on the whole measured phase).
- `liveness`: whether the probe kept making progress: its maximum latency and
  wake-up lag, operations done against scheduled, the backlog at its end.

Pure functions of saved files and documents: the report and the tests use
them without a guest."""

from __future__ import annotations

import re
import statistics
from pathlib import Path
from typing import Any

EDGES = ("start", "measure", "end", "idle")
# Measured-phase deltas: name -> the counters summed ("x_*": every counter
# starting with "x_").
DELTAS: dict[str, tuple[str, ...]] = {
    "pswpin": ("pswpin",), "pswpout": ("pswpout",),
    "pgscan_kswapd": ("pgscan_kswapd",), "pgscan_direct": ("pgscan_direct",),
    "pgsteal_kswapd": ("pgsteal_kswapd",), "pgsteal_direct": ("pgsteal_direct",),
    "allocstall": ("allocstall_*",), "pgmajfault": ("pgmajfault",),
    "workingset_refault": ("workingset_refault_*",), "oom_kill": ("oom_kill",),
}
MEMINFO = ("MemTotal", "MemFree", "MemAvailable", "Shmem", "AnonPages", "SwapCached",
           "SwapTotal", "SwapFree")
UPTIME_KEY = "uptime_ms"   # the guest's uptime, appended to each vmstat snapshot
PAGE = 4096                # pswpin/pswpout count pages (x86-64)
OOM_LINE = re.compile(r"(Out of memory|oom-kill|Killed process|invoked oom-killer)")


def parse_counters(text: str) -> dict[str, int]:
    """`NAME VALUE` lines (/proc/vmstat) -> {name: value}; other lines skipped."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo -> {NAME_kB: value} for the lines in MEMINFO."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if name in MEMINFO and parts and parts[0].isdigit():
            out[f"{name}_kB"] = int(parts[0])
    return out


def counter(c: dict[str, int], names: tuple[str, ...]) -> int:
    n = 0
    for name in names:
        if name.endswith("*"):
            n += sum(v for k, v in c.items() if k.startswith(name[:-1]))
        else:
            n += c.get(name, 0)
    return n


def deltas(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: counter(after, names) - counter(before, names) for k, names in DELTAS.items()}


def vmstat(res: Path) -> dict[str, Any] | None:
    """run.json's `vmstat` from the guest's results directory; None when the
    guest took no snapshot (an older runner, or a job that ended before start)."""
    edges: dict[str, dict[str, int]] = {}
    uptime: dict[str, float] = {}
    meminfo: dict[str, dict[str, int]] = {}
    daemon: dict[str, dict[str, int]] = {}
    for edge in EDGES:
        try:
            daemon[edge] = parse_counters((res / f"daemon-{edge}.txt").read_text())
        except OSError:
            pass
        try:
            c = parse_counters((res / f"vmstat-{edge}.txt").read_text())
        except OSError:
            continue
        if UPTIME_KEY in c:
            uptime[edge] = c.pop(UPTIME_KEY) / 1000.0
        edges[edge] = c
        try:
            meminfo[edge] = parse_meminfo((res / f"meminfo-{edge}.txt").read_text())
        except OSError:
            pass
    if not edges:
        return None
    out: dict[str, Any] = {"edges": edges, "uptime_s": uptime, "meminfo": meminfo,
                           "daemon": daemon, "measured": None}
    if "measure" in edges and "end" in edges:
        m = dict(deltas(edges["measure"], edges["end"]))
        secs = uptime.get("end", 0.0) - uptime.get("measure", 0.0)
        out["measured"] = {**m, "seconds": round(secs, 3),
                           "pswpin_per_s": round(m["pswpin"] / secs, 1) if secs > 0 else None,
                           "pswpout_per_s": round(m["pswpout"] / secs, 1) if secs > 0 else None}
        if "majflt" in daemon.get("measure", {}) and "majflt" in daemon.get("end", {}):
            out["measured"]["daemon_majflt"] = daemon["end"]["majflt"] - daemon["measure"]["majflt"]
    return out


def oom(res: Path, vm: dict[str, Any] | None) -> dict[str, Any] | None:
    """The guest's OOM kills: dmesg's lines about them, and the oom_kill counter
    at the last snapshot (it counts from boot). None when there were none."""
    try:
        text = (res / "dmesg.txt").read_text(errors="replace")
    except OSError:
        text = ""
    lines = [re.sub(r"^\[\s*[0-9.]+\]\s*", "", ln).strip()[:300] for ln in text.splitlines()
             if OOM_LINE.search(ln)]
    killed = [ln for ln in lines if "Killed process" in ln]
    count = 0
    if vm:
        last = [e for e in EDGES if e in vm["edges"]][-1]
        count = vm["edges"][last].get("oom_kill", 0)
    n = max(len(killed), count)
    if not n and not lines:
        return None
    return {"kills": n, "lines": lines[:20]}


def oom_error(o: dict[str, Any]) -> str:
    what = next((ln for ln in o["lines"] if "Killed process" in ln),
                o["lines"][0] if o["lines"] else "see dmesg.txt")
    return f"guest out of memory: the OOM killer killed {o['kills']} process(es) ({what})"


def hog(res: Path, size: int) -> dict[str, Any] | None:
    """The hog's progress file (`passes=N chunks=N filled_s=S`, or `error=...`,
    or `filling` while it fills) and hog.rc (`STATUS running|exited`: its exit
    status, `?` when even SIGKILL left it running, and whether it was running
    when stopped) -> run.json's `hog`; None without a hog. No progress file
    means the runner never got to the hog (`started` false): the run's own
    error says why, this adds none. `ran_to_end` is None when it cannot be
    told: never filled, or no state in hog.rc (an older runner)."""
    if not size:
        return None
    out: dict[str, Any] = {"bytes": size, "started": True, "filled": False, "passes": 0,
                           "chunks": 0, "fill_s": None, "error": None, "rc": None,
                           "ran_to_end": None}
    try:
        text = (res / "hog.progress").read_text().strip()
    except OSError:
        out["started"] = False
        return out
    kv = dict(item.partition("=")[::2] for item in text.split() if "=" in item)
    if "error" in kv:
        out["error"] = text.split("error=", 1)[1][:300]
    elif "passes" in kv:
        try:
            out.update(filled=True, passes=int(kv["passes"]), chunks=int(kv.get("chunks", 0)),
                       fill_s=float(kv["filled_s"]) if kv.get("filled_s") else None)
        except ValueError:
            out["error"] = f"unreadable progress file: {text[:100]!r}"
    try:
        rc, _, state = (res / "hog.rc").read_text().strip().partition(" ")
    except OSError:
        return out
    if rc == "?":
        out["error"] = out["error"] or "it was still running after SIGKILL (stuck in the kernel)"
    else:
        try:
            out["rc"] = int(rc)
        except ValueError:
            out["error"] = out["error"] or f"unreadable hog.rc: {rc[:40]!r}"
    if out["filled"] and state in ("running", "exited"):
        out["ran_to_end"] = state == "running"
        if not out["ran_to_end"] and out["error"] is None:
            out["error"] = f"it exited on its own (status {out['rc']}) before the workload's end"
    return out


def liveness(doc: dict[str, Any], measure_s: float) -> dict[str, Any]:
    """From tierprobe's document: did the probe keep making progress?"""
    meas = doc.get("measurements", {})
    c = meas.get("counters", {})
    t = meas.get("throughput", {})
    lat = (meas.get("ops", {}).get("all") or {}).get("latency") or {}
    scheduled = int(round(float(t.get("target_ops_per_s", 0)) * measure_s))
    out: dict[str, Any] = {"max_latency_s": round(int(lat.get("max", 0)) / 1e9, 3),
           "max_lag_s": round(int(c.get("max_lag_ns", 0)) / 1e9, 3),
           "ops_measured": int(c.get("ops_measured", t.get("ops", 0))),
           "ops_scheduled": scheduled, "late_ops": int(c.get("late_ops", 0)),
           "backlog_at_end": int(c.get("backlog_at_end", 0)),
           "fell_behind": bool(c.get("fell_behind", 0))}
    out["text"] = (f"probe: {out['ops_measured']} of ~{scheduled} scheduled ops, max latency "
                   f"{out['max_latency_s']:g} s, max lag {out['max_lag_s']:g} s"
                   + (", fell behind" if out["fell_behind"] else ""))
    return out


def guest_step(res: Path, console: Path) -> str:
    """The step the guest's runner was in last: its `step` file, or (when the
    host killed the guest and no results came back) its last `tierlab-step:`
    console line."""
    try:
        s = (res / "step").read_text().strip()
        if s:
            return s
    except OSError:
        pass
    step = ""
    try:
        with open(console, errors="replace") as f:
            for line in f:
                _, sep, rest = line.partition("tierlab-step: ")
                if sep:
                    step = rest.strip()
    except OSError:
        pass
    return step


# ------------------------------------------------------------------ the report

# The measured-phase numbers an arm's summary takes the median of, in the
# report's order, with the report's label for each.
ROWS = (("pswpin", "pages swapped in"), ("pswpout", "pages swapped out"),
        ("pswpin_per_s", "swap-in pages/s"), ("pswpout_per_s", "swap-out pages/s"),
        ("pgscan_kswapd", "pgscan_kswapd"), ("pgscan_direct", "pgscan_direct"),
        ("pgsteal_kswapd", "pgsteal_kswapd"), ("pgsteal_direct", "pgsteal_direct"),
        ("allocstall", "allocstall (all zones)"), ("pgmajfault", "pgmajfault"),
        ("workingset_refault", "workingset_refault (anon + file)"),
        ("oom_kill", "oom_kill"), ("daemon_majflt", "tierfs daemon's major faults"))


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def arm_summary(infos: list[dict[str, Any]]) -> dict[str, Any]:
    """Per arm: the median over its runs of each measured-phase delta (runs
    whose run.json has them), the hog's median passes and chunks rewritten, and
    the run count."""
    measured = [(i.get("vmstat") or {}).get("measured") for i in infos]
    ms = [m for m in measured if m]
    out: dict[str, Any] = {"runs": len(ms)}
    for k, _label in ROWS:
        out[k] = median([float(m[k]) for m in ms if m.get(k) is not None])
    hogs = [i["hog"] for i in infos if i.get("hog")]
    out["hog_passes"] = median([float(h["passes"]) for h in hogs]) if hogs else None
    out["hog_chunks"] = median([float(h["chunks"]) for h in hogs]) if hogs else None
    return out


def swap_used_kib(info: dict[str, Any], edge: str = "end") -> int | None:
    mi = ((info.get("vmstat") or {}).get("meminfo") or {}).get(edge) or {}
    if "SwapTotal_kB" not in mi or "SwapFree_kB" not in mi:
        return None
    return mi["SwapTotal_kB"] - mi["SwapFree_kB"]
