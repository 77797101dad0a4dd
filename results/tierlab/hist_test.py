"""The Python histogram must be tfs::Histogram to the bucket: same layout, same
quantile rule, <=1% error against exact percentiles from 1 us to 100 s."""

from __future__ import annotations

import numpy as np

from tierlab import hist
from tierlab.hist import Histogram, resampled_quantiles


def exact(sorted_samples: np.ndarray, num: int, den: int) -> int:
    rank = max(1, (len(sorted_samples) * num + den - 1) // den)
    return int(sorted_samples[rank - 1])


def test_buckets_tile_the_range_and_are_narrow() -> None:
    for i in range(hist.BUCKETS - 1):
        assert hist.bucket_high(i) + 1 == hist.bucket_low(i + 1)
        assert hist.bucket_index(hist.bucket_low(i)) == i
        assert hist.bucket_index(hist.bucket_high(i)) == i
        if i >= hist.SUB:
            width = hist.bucket_high(i) - hist.bucket_low(i) + 1
            assert width / hist.bucket_low(i) <= 1 / 64 + 1e-12
    assert hist.bucket_index(2**63) == hist.BUCKETS - 1


def test_quantiles_within_one_percent_from_1us_to_100s() -> None:
    rng = np.random.default_rng(3)
    samples = np.sort((10 ** rng.uniform(3, 11, size=100_000)).astype(np.int64))
    h = Histogram.from_samples(samples)
    for num, den in ((1, 1000), (1, 100), (1, 2), (9, 10), (99, 100), (999, 1000), (9999, 10000)):
        e = exact(samples, num, den)
        got = h.quantile(f"{num / den}")
        assert abs(got - e) / e <= 0.01, (num, den, got, e)
    assert h.min == samples[0] and h.max == samples[-1]
    assert h.quantile(1) == samples[-1]
    assert h.count == len(samples)


def test_json_round_trip_and_merge() -> None:
    a = Histogram.from_samples([5, 1000, 1_000_000, 3_000_000_000])
    b = Histogram.from_json(a.to_json())
    assert b == a
    b.merge(Histogram.from_samples([7]))
    assert (b.count, b.min, b.max) == (5, 5, 3_000_000_000)
    assert Histogram.merged([a, Histogram()]).count == 4
    assert Histogram().quantile(0.99) == 0


def test_cdf_ends_at_one_and_is_monotonic() -> None:
    h = Histogram.from_samples(np.random.default_rng(1).lognormal(10, 1, 5000))
    x, y = h.cdf()
    assert np.all(np.diff(x) > 0) and np.all(np.diff(y) >= 0)
    assert y[-1] == 1.0


def test_resampled_quantiles_center_on_the_quantile_and_narrow_with_n() -> None:
    rng = np.random.default_rng(5)
    widths = []
    for n in (1000, 100_000):
        h = Histogram.from_samples(rng.lognormal(np.log(1e5), 0.5, size=n))
        boot = resampled_quantiles(h, [0.5, 0.99], 1000, rng)
        p99 = h.quantile(0.99)
        assert abs(np.median(boot[0.99]) - p99) / p99 < 0.05
        lo, hi = np.percentile(boot[0.99], [2.5, 97.5])
        assert lo <= p99 <= hi
        widths.append((hi - lo) / p99)
    assert widths[1] < widths[0] / 3  # ~sqrt(100) narrower with 100x the operations


def test_count_above_counts_whole_buckets_above_the_value() -> None:
    h = Histogram.from_samples([1_000_000] * 5 + [49_000_000] * 3 + [52_000_000] * 2 + [3_000_000_000])
    assert h.count_above(50_000_000) == 3
    assert h.count_above(10_000_000) == 6
    assert h.count_above(5_000_000_000) == 0
