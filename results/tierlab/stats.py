"""Comparing two arms of runs: ratios B/A with bootstrap 95% confidence intervals.

The unit of replication is the run, not the operation: operations within one run
share the machine's state of the moment (the host disk drifts on a scale of
seconds), so resampling operations understates the real uncertainty. Hence:

- pairs: when every run names a pair index and both arms have the same pairs
  (the lab's paired runner), the statistic is the geometric mean of the per-pair
  ratios, resampled over pairs -- the gate's definition (DESIGN.md);
- runs: with two or more runs per arm but no pairing, the ratio of the arms'
  geometric means, each arm's runs resampled independently;
- operations: with a single run in an arm there is nothing else to resample, so
  each run's histogram is resampled (Poisson bootstrap over its buckets); the CI then
  covers sampling noise only, and the report says so.

Intervals are *expanded* percentile-bootstrap intervals (Hesterberg): a plain
percentile interval is too narrow with few units (with 3 runs it is roughly the
range of a handful of values), so the percentiles taken are widened to the ones a
t distribution with n-1 degrees of freedom calls for: alpha'/2 =
Phi(-sqrt(n/(n-1)) * t(0.975, n-1)). With many units it is the ordinary 95%
interval. Seeded, so a report is reproducible."""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Callable, Sequence

import numpy as np

from tierlab.hist import Histogram, resampled_quantiles

ROUNDS = 2000
SEED = 12345


@dataclass
class Ratio:
    value: float
    lo: float | None
    hi: float | None
    method: str  # "pairs", "runs", "operations" or "none"

    @property
    def significant(self) -> bool:
        """The interval excludes 1.0: the arms differ beyond the noise measured."""
        return self.lo is not None and self.hi is not None and (self.lo > 1.0 or self.hi < 1.0)


def geomean(values: Sequence[float] | np.ndarray, axis: int = -1) -> np.ndarray | float:
    v = np.maximum(np.asarray(values, dtype=np.float64), 1e-9)
    return np.exp(np.mean(np.log(v), axis=axis))


def t_quantile(p: float, df: int) -> float:
    """Student t quantile: exact for 1 and 2 degrees of freedom, Cornish-Fisher
    expansion (error well below 1%) above."""
    if df == 1:
        return math.tan(math.pi * (p - 0.5))
    if df == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    z = NormalDist().inv_cdf(p)
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    return z + g1 / df + g2 / df**2 + g3 / df**3 + g4 / df**4


def expanded_tail(n: int, level: float = 0.95) -> float:
    """Lower percentile (0..100) of the expanded percentile interval for n units."""
    if n < 2:
        return 100 * (1 - level) / 2
    z = math.sqrt(n / (n - 1)) * t_quantile(1 - (1 - level) / 2, n - 1)
    return 100 * NormalDist().cdf(-z)


def _interval(samples: np.ndarray, units: int | None = None,
              level: float = 0.95) -> tuple[float, float]:
    tail = expanded_tail(units, level) if units else 100 * (1 - level) / 2
    lo, hi = np.percentile(samples, [tail, 100 - tail])
    return float(lo), float(hi)


def choose_method(pairs_a: Sequence[int | None], pairs_b: Sequence[int | None]) -> str:
    if (len(pairs_a) >= 2 and None not in pairs_a and None not in pairs_b
            and sorted(pairs_a) == sorted(pairs_b) and len(set(pairs_a)) == len(pairs_a)):
        return "pairs"
    if len(pairs_a) >= 2 and len(pairs_b) >= 2:
        return "runs"
    return "operations"


def _paired(a: np.ndarray, b: np.ndarray, rng: np.random.Generator,
            level: float = 0.95) -> Ratio:
    ratios = np.maximum(b, 1e-9) / np.maximum(a, 1e-9)
    idx = rng.integers(0, len(ratios), size=(ROUNDS, len(ratios)))
    boot = geomean(ratios[idx], axis=1)
    return Ratio(float(geomean(ratios)), *_interval(boot, len(ratios), level), "pairs")


def _unpaired(a: np.ndarray, b: np.ndarray, rng: np.random.Generator,
              level: float = 0.95) -> Ratio:
    ia = rng.integers(0, len(a), size=(ROUNDS, len(a)))
    ib = rng.integers(0, len(b), size=(ROUNDS, len(b)))
    boot = geomean(b[ib], axis=1) / geomean(a[ia], axis=1)
    return Ratio(float(geomean(b) / geomean(a)), *_interval(boot, min(len(a), len(b)), level),
                 "runs")


def compare_values(a: Sequence[float], b: Sequence[float], method: str,
                   order_a: Sequence[int | None] = (), order_b: Sequence[int | None] = (),
                   level: float = 0.95) -> Ratio:
    """Ratio B/A of per-run values (e.g. p99 or throughput) by the given method.
    For "pairs", order_a/order_b are the pair indices used to line the runs up.
    `level` is the interval's coverage (0.95; higher for a family of comparisons)."""
    rng = np.random.default_rng(SEED)
    va, vb = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    point = float(geomean(vb) / geomean(va))
    if method == "pairs":
        pos_b = {p: i for i, p in enumerate(order_b)}
        return _paired(va, vb[[pos_b[p] for p in order_a]], rng, level)
    if method == "runs":
        return _unpaired(va, vb, rng, level)
    return Ratio(point, None, None, "none")


def log_ratio_sigma(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Standard deviation of log(b_i / a_i) over pairs (None below 2 pairs): the
    noise of the per-pair ratio that the lab measures on itself."""
    if len(a) < 2:
        return None
    r = np.log(np.maximum(np.asarray(b, float), 1e-9) / np.maximum(np.asarray(a, float), 1e-9))
    return float(np.std(r, ddof=1))


def pairs_needed(sigma: float, bound: float) -> int:
    """Pairs for the interval's half-width (about 2 sigma / sqrt(n) on the log
    scale) to shrink to log(bound): enough to tell a ratio of `bound` from 1."""
    if bound <= 1.0:
        bound = 1.0 / bound
    if sigma <= 0:
        return 2
    return max(2, math.ceil((2 * sigma / math.log(bound)) ** 2))


def compare_quantiles(hists_a: Sequence[Histogram], hists_b: Sequence[Histogram],
                      qs: Sequence[float], method: str, order_a: Sequence[int | None] = (),
                      order_b: Sequence[int | None] = (), level: float = 0.95,
                      ) -> dict[float, Ratio]:
    """Ratio B/A of each quantile q in `qs` (1.0 = max) of every run's histogram."""
    def value(h: Histogram, q: float) -> float:
        return float(h.max) if q >= 1 else float(h.quantile(q))

    out: dict[float, Ratio] = {}
    for q in qs:
        a = [value(h, q) for h in hists_a]
        b = [value(h, q) for h in hists_b]
        if method != "operations":
            out[q] = compare_values(a, b, method, order_a, order_b, level)
        else:  # filled below; the maximum of a resample says nothing about the maximum
            out[q] = Ratio(float(geomean(b) / geomean(a)), None, None, "none")
    if method == "operations":
        rng = np.random.default_rng(SEED)
        inner = [q for q in qs if q < 1]
        boot_a = [resampled_quantiles(h, inner, ROUNDS, rng) for h in hists_a]
        boot_b = [resampled_quantiles(h, inner, ROUNDS, rng) for h in hists_b]
        for q in inner:
            ga = geomean(np.stack([r[q] for r in boot_a]), axis=0)
            gb = geomean(np.stack([r[q] for r in boot_b]), axis=0)
            out[q] = Ratio(out[q].value,
                           *_interval(np.asarray(gb) / np.maximum(ga, 1e-9), None, level),
                           "operations")
    return out
