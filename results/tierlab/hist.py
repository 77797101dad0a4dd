"""Histograms in the results format, with exactly tfs::Histogram's bucket layout
(fs/util/histogram.h): values below 64 have a bucket each; above, every power of two
is split into 64 equal buckets, so a bucket is at most 1/64 of its value wide.

Documents store only non-empty buckets as [low, high, count] in ns. Quantiles use
the C++ rule -- the smallest bucket whose cumulative count reaches
ceil(count * num / den), reported as its midpoint clamped to [min, max] -- so a
quantile computed here from a document equals the one tierprobe printed. Python
producers (fio, metadata-storm, ...) bucket their samples with from_samples() so
every producer's histograms merge and compare bucket for bucket."""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Iterable, Sequence

import numpy as np

SUB_BITS = 6
SUB = 1 << SUB_BITS
MAX_BITS = 40
BUCKETS = SUB + (MAX_BITS - SUB_BITS) * SUB


def bucket_index(value: int) -> int:
    if value < SUB:
        return int(value)
    b = int(value).bit_length() - 1
    if b >= MAX_BITS:
        return BUCKETS - 1
    shift = b - SUB_BITS
    return (shift + 1) * SUB + (int(value) >> shift) - SUB


def bucket_low(index: int) -> int:
    if index < SUB:
        return index
    shift = index // SUB - 1
    return ((index % SUB) + SUB) << shift


def bucket_high(index: int) -> int:
    if index < SUB:
        return index
    shift = index // SUB - 1
    return bucket_low(index) + (1 << shift) - 1


def as_fraction(q: float | Fraction) -> tuple[int, int]:
    """0.99 -> (99, 100); 0.999 -> (999, 1000). Exact for decimal quantiles."""
    f = Fraction(str(q)) if not isinstance(q, Fraction) else q
    return f.numerator, f.denominator


@dataclass
class Histogram:
    """Sparse histogram: bucket index -> count, plus exact count/min/max/sum."""

    counts: dict[int, int] = field(default_factory=dict)
    count: int = 0
    min: int = 0
    max: int = 0
    sum: int = 0

    @classmethod
    def from_samples(cls, samples_ns: Iterable[int | float]) -> "Histogram":
        h = cls()
        for s in samples_ns:
            h.record(int(round(s)))
        return h

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> "Histogram":
        h = cls(count=int(doc["count"]), min=int(doc["min"]), max=int(doc["max"]),
                sum=int(doc["sum"]))
        for low, _high, n in doc["buckets"]:
            idx = bucket_index(int(low))
            h.counts[idx] = h.counts.get(idx, 0) + int(n)
        return h

    def record(self, value: int, n: int = 1) -> None:
        if n <= 0:
            return
        value = max(0, int(value))
        idx = bucket_index(value)
        self.counts[idx] = self.counts.get(idx, 0) + n
        self.min = value if self.count == 0 else min(self.min, value)
        self.max = max(self.max, value)
        self.count += n
        self.sum += value * n

    def merge(self, other: "Histogram") -> None:
        if other.count == 0:
            return
        for idx, n in other.counts.items():
            self.counts[idx] = self.counts.get(idx, 0) + n
        self.min = other.min if self.count == 0 else min(self.min, other.min)
        self.max = max(self.max, other.max)
        self.count += other.count
        self.sum += other.sum

    @staticmethod
    def merged(hists: Iterable["Histogram"]) -> "Histogram":
        out = Histogram()
        for h in hists:
            out.merge(h)
        return out

    def quantile(self, q: float | Fraction) -> int:
        """Value at quantile q (0.99 = p99), same rule and result as the C++ class."""
        if self.count == 0:
            return 0
        num, den = as_fraction(q)
        if num >= den:
            return self.max
        rank = max(1, (self.count * num + den - 1) // den)
        seen = 0
        for idx in sorted(self.counts):
            seen += self.counts[idx]
            if seen >= rank:
                return self._midpoint(idx)
        return self.max

    def count_above(self, value_ns: int) -> int:
        """Operations in buckets wholly above value_ns (bucket resolution: the
        bucket holding value_ns itself is not counted)."""
        return sum(n for idx, n in self.counts.items() if bucket_low(idx) > value_ns)

    def _midpoint(self, idx: int) -> int:
        lo, hi = bucket_low(idx), bucket_high(idx)
        return min(max(lo + (hi - lo) // 2, self.min), self.max)

    def mean(self) -> float:
        return self.sum / self.count if self.count else 0.0

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(bucket midpoints clamped to [min, max], counts), sorted by value."""
        idx = sorted(self.counts)
        mids = np.array([self._midpoint(i) for i in idx], dtype=np.float64)
        return mids, np.array([self.counts[i] for i in idx], dtype=np.int64)

    def cdf(self) -> tuple[np.ndarray, np.ndarray]:
        """Points (value, fraction of operations <= value) at each bucket's upper end."""
        idx = sorted(self.counts)
        highs = np.array([min(bucket_high(i), self.max) for i in idx], dtype=np.float64)
        cum = np.cumsum([self.counts[i] for i in idx]) / max(self.count, 1)
        return highs, cum

    def to_json(self) -> dict[str, Any]:
        return {
            "unit": "ns", "count": self.count, "min": self.min if self.count else 0,
            "max": self.max, "sum": self.sum,
            "p50": self.quantile("0.5"), "p90": self.quantile("0.9"),
            "p99": self.quantile("0.99"), "p999": self.quantile("0.999"),
            "buckets": [[bucket_low(i), bucket_high(i), self.counts[i]]
                        for i in sorted(self.counts)],
        }


def resampled_quantiles(h: Histogram, qs: Sequence[float], rounds: int,
                        rng: np.random.Generator) -> dict[float, np.ndarray]:
    """Bootstrap over operations: `rounds` Poisson-bootstrap resamples of the
    histogram (each bucket's count redrawn as Poisson(count), the standard fast
    stand-in for a multinomial resample) and, for each q in `qs`, the quantile of
    every resample by the same rank rule on bucket midpoints. Works on buckets, not
    samples, so it is as fast for a billion operations as for a thousand."""
    mids, counts = h.arrays()
    if h.count == 0:
        return {q: np.zeros(rounds) for q in qs}
    draws = rng.poisson(counts.astype(np.float64), size=(rounds, len(counts)))
    cum = np.cumsum(draws, axis=1)
    total = cum[:, -1]
    out = {}
    for q in qs:
        num, den = as_fraction(q)
        rank = np.maximum(1, (total * num + den - 1) // den) if num < den else total
        out[q] = mids[np.argmax(cum >= rank[:, None], axis=1)]
    return out
