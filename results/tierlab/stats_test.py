"""Bootstrap comparisons: the right resampling unit is chosen, intervals cover the
true ratio at about their nominal rate, and real differences are significant."""

from __future__ import annotations

import numpy as np

from tierlab.hist import Histogram
from tierlab.stats import choose_method, compare_quantiles, compare_values


def test_choose_method() -> None:
    assert choose_method([0, 1, 2], [2, 1, 0]) == "pairs"
    assert choose_method([0, 1], [0, 2]) == "runs"  # pairs do not line up
    assert choose_method([None, None], [None, None]) == "runs"
    assert choose_method([0, 0], [0, 0]) == "runs"  # duplicate pair ids are not pairs
    assert choose_method([None], [None, None]) == "operations"
    assert choose_method([0], [0]) == "operations"  # one pair is not enough


def test_runs_interval_covers_the_truth_at_nominal_rate() -> None:
    # 200 experiments of 10 runs per arm, per-run p99 lognormal with sigma 0.2,
    # true ratio 1.25: the 95% interval should contain 1.25 in most of them
    # (percentile bootstrap with n=10 under-covers a little; 85% is the floor).
    rng = np.random.default_rng(7)
    hits = 0
    for _ in range(200):
        a = np.exp(rng.normal(0, 0.2, 10))
        b = 1.25 * np.exp(rng.normal(0, 0.2, 10))
        r = compare_values(a, b, "runs")
        hits += r.lo <= 1.25 <= r.hi
    assert hits >= 170, hits


def test_pairs_are_lined_up_by_index_and_cancel_shared_drift() -> None:
    rng = np.random.default_rng(9)
    drift = np.exp(rng.normal(0, 0.5, 8))  # large run-to-run drift shared within a pair
    a = 100 * drift
    b = 110 * drift * np.exp(rng.normal(0, 0.02, 8))
    order = list(range(8))
    paired = compare_values(a, b, "pairs", order, order)
    assert paired.significant and paired.lo < 1.10 < paired.hi
    # The same values with B listed in another order give the same answer.
    perm = rng.permutation(8)
    shuffled = compare_values(a, b[perm], "pairs", order, list(perm))
    assert abs(shuffled.value - paired.value) < 1e-12
    # Unpaired, the drift swamps the 10%: not significant.
    assert not compare_values(a, b, "runs").significant


def test_operations_bootstrap_for_single_runs() -> None:
    rng = np.random.default_rng(11)
    base = [Histogram.from_samples(rng.lognormal(np.log(1e5), 0.5, 20000))]
    same = [Histogram.from_samples(rng.lognormal(np.log(1e5), 0.5, 20000))]
    slow = [Histogram.from_samples(rng.lognormal(np.log(1.3e5), 0.5, 20000))]
    r_same = compare_quantiles(base, same, [0.5, 0.99, 1.0], "operations")
    assert r_same[0.99].lo < 1.0 < r_same[0.99].hi
    assert r_same[1.0].lo is None  # no interval for the maximum
    r_slow = compare_quantiles(base, slow, [0.5, 0.99], "operations")
    assert r_slow[0.99].significant and r_slow[0.99].lo < 1.3 < r_slow[0.99].hi
    assert r_slow[0.5].method == "operations"
