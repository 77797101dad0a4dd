"""The report's figures, rendered with matplotlib's Agg backend to PNG bytes (so
they can be both files beside report.md and base64 inside report.html).

- cdf: per op, the latency CDF of each arm (all runs of the arm merged), log x;
  the y axis is logit-scaled so the median and the 99.9th percentile are equally
  readable.
- p99_runs: every run's p99 per op as a dot, per arm, with the arm's geometric
  mean as a bar: the spread between runs is the noise the CI is made of.
- timeseries: p99, p99.9 and max per second of every run that has a series."""

from __future__ import annotations

import io
from typing import Any, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import ticker  # noqa: E402
import numpy as np  # noqa: E402

from tierlab.hist import Histogram  # noqa: E402

COLORS = ("tab:blue", "tab:orange")
CDF_TICKS = (0.01, 0.1, 0.5, 0.9, 0.99, 0.999, 0.9999)


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _grid(n: int) -> tuple[Any, list[Any]]:
    cols = min(3, n)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.4 * rows), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def cdf(ops: Sequence[str], arms: Sequence[tuple[str, dict[str, Histogram]]]) -> bytes:
    fig, axes = _grid(len(ops))
    for ax, op in zip(axes, ops):
        for (label, merged), color in zip(arms, COLORS):
            h = merged[op]
            if h.count == 0:
                continue
            x, y = h.cdf()
            y = np.clip(y, 1e-6, 1 - 1e-6)
            ax.step(np.maximum(x, 1) / 1e3, y, where="post", color=color,
                    label=f"{label} (n={h.count})")
        ax.set_xscale("log")
        ax.set_yscale("logit")
        # Fixed ticks: the logit scale's automatic minor ticks cost seconds per figure.
        ax.yaxis.set_major_locator(ticker.FixedLocator(CDF_TICKS))
        ax.yaxis.set_major_formatter(ticker.FixedFormatter([f"{t:g}" for t in CDF_TICKS]))
        ax.yaxis.set_minor_locator(ticker.NullLocator())
        ax.set_ylim(0.005, 0.99995)
        ax.set_title(op)
        ax.set_xlabel("latency (µs)")
        ax.set_ylabel("fraction ≤ latency")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle("Latency CDF per op (all runs of each arm merged)")
    return _png(fig)


def p99_runs(ops: Sequence[str], arms: Sequence[tuple[str, dict[str, list[float]]]]) -> bytes:
    fig, ax = plt.subplots(figsize=(max(5.0, 1.3 * len(ops) + 2), 3.8))
    rng = np.random.default_rng(0)
    for k, ((label, per_op), color) in enumerate(zip(arms, COLORS)):
        for i, op in enumerate(ops):
            vals = np.asarray(per_op[op], dtype=np.float64) / 1e3
            x = i + (k - 0.5) * 0.35 + rng.uniform(-0.06, 0.06, size=len(vals))
            ax.scatter(x, np.maximum(vals, 1e-3), s=18, color=color, alpha=0.8,
                       label=label if i == 0 else None)
            g = float(np.exp(np.mean(np.log(np.maximum(vals, 1e-3)))))
            ax.hlines(g, i + (k - 0.5) * 0.35 - 0.13, i + (k - 0.5) * 0.35 + 0.13, color=color)
    ax.set_xticks(range(len(ops)))
    ax.set_xticklabels(ops, rotation=20)
    ax.set_yscale("log")
    ax.set_ylabel("p99 latency (µs)")
    ax.set_title("p99 of every run (bar: geometric mean of the arm)")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return _png(fig)


def timeseries(arms: Sequence[tuple[str, list[dict[str, Any]]]]) -> bytes:
    fig, axes = plt.subplots(3, 1, figsize=(9, 7.5), sharex=True)
    for (label, series_list), color in zip(arms, COLORS):
        for j, ts in enumerate(series_list):
            pts = ts["points"]
            t = [p["t"] * ts["interval_s"] for p in pts]
            for ax, key in zip(axes, ("p99_ns", "p999_ns", "max_ns")):
                v = np.array([max(p[key], 1) for p in pts], dtype=np.float64) / 1e3
                ax.plot(t, v, color=color, alpha=0.6, lw=1, label=label if j == 0 else None)
    for ax, name in zip(axes, ("p99", "p99.9", "max")):
        ax.set_yscale("log")
        ax.set_ylabel(f"{name} (µs)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    axes[0].set_title("Latency per second (operations placed at their intended start)")
    axes[-1].set_xlabel("time since start (s)")
    return _png(fig)


def event_windows(windows: Sequence[tuple[str, dict[str, Any], list[tuple[float, int]]]]) -> bytes:
    """One panel per distinct fault event (member + command): the per-second p99 of
    every run around it, time 0 at the event, the event's duration shaded."""
    keys: list[str] = []
    for _run, e, _pts in windows:
        k = f"{e['member']} {e['command']} at {e['at_s']:g} s"
        if k not in keys:
            keys.append(k)
    fig, axes = _grid(len(keys))
    for ax, k in zip(axes, keys):
        labelled: set[str] = set()
        for run, e, pts in windows:
            if f"{e['member']} {e['command']} at {e['at_s']:g} s" != k or not pts:
                continue
            color = COLORS[0] if run.split()[0] in ("control", "baseline") else COLORS[1]
            xs = [t for t, _v in pts]
            ys = [max(v, 1) / 1e6 for _t, v in pts]
            arm = run.split()[0]
            ax.plot(xs, ys, marker=".", lw=1, color=color, alpha=0.7,
                    label=arm if arm not in labelled else None)
            labelled.add(arm)
            if e.get("duration_s"):
                ax.axvspan(0, e["duration_s"], color="0.9", zorder=0)
        ax.axvline(0, color="0.4", lw=0.8)
        ax.set_yscale("log")
        ax.set_title(k, fontsize=9)
        ax.set_xlabel("s from the event")
        ax.set_ylabel("p99 per second (ms)")
        handles, labels = ax.get_legend_handles_labels()
        uniq = dict(zip(labels, handles))
        ax.legend(uniq.values(), uniq.keys(), fontsize=8)
    return _png(fig)
