"""Intervals and exact tests for comparing methods on the same examples.

A verdict "method A beats method B" is a statement about a difference measured on a *sample* of examples
(needles, questions, text windows). Run the same methods on another sample of the same kind and the difference
moves. The functions here say how far, so that a verdict is only written when the sample could not plausibly
have produced the opposite sign (kvlab's claims ledger, :mod:`kvlab.experiments.claims`, applies them to every claim).

- :func:`paired_bootstrap`: the mean of the per-example differences ``a[i] - b[i]`` and a 95 % percentile
  bootstrap interval. Resampling draws ``n`` examples with replacement (the *pairs* stay together, so the
  interval accounts for examples that are hard for both methods), recomputes the mean difference, and repeats
  this ``resamples`` times; the interval holds the middle 95 % of those means. Read it as: "if the examples we
  have are representative of the task, a new sample of ``n`` examples would give a mean difference in this
  range about 95 times in 100". When it excludes 0, the sign of the difference is resolved at this sample size.
- :func:`proportion_interval`: an interval for one proportion (accuracy on ``n`` questions), Wilson's score
  interval or the exact Clopper-Pearson one.
- :func:`sign_test`: the exact two-sided sign test on paired outcomes; for 0/1 outcomes (correct / wrong) it is
  McNemar's exact test: only the discordant pairs (one method right, the other wrong) carry information, and
  under "no difference" each is equally likely to go either way.

Everything is deterministic (a fixed seed) and needs only numpy and the standard library.

Example (what a notebook cell does by hand)::

    d = a - b                                              # per-example differences
    rng = np.random.default_rng(0)
    means = [d[rng.integers(0, n, n)].mean() for _ in range(10_000)]
    low, high = np.quantile(means, [0.025, 0.975])         # ~ paired_bootstrap(a, b)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["Interval", "SignTest", "paired_bootstrap", "proportion_interval", "sign_test", "mcnemar_exact"]

_Z95 = 1.959963984540054  # the 97.5 % point of the standard normal


@dataclass(frozen=True)
class Interval:
    """An estimate with its interval: ``low <= estimate <= high`` (for a bootstrap, up to ties), over ``n``
    examples, at ``confidence`` (0.95 = a 95 % interval)."""

    estimate: float
    low: float
    high: float
    n: int
    confidence: float = 0.95
    method: str = ""

    def excludes(self, value: float = 0.0) -> bool:
        """True when ``value`` lies outside ``[low, high]`` (the interval resolves a difference from it)."""
        return value < self.low or value > self.high

    def __str__(self) -> str:
        return f"{self.estimate:+.4g} [{self.low:+.4g}, {self.high:+.4g}] (n={self.n})"


@dataclass(frozen=True)
class SignTest:
    """Exact two-sided sign test: ``wins`` pairs with ``a > b``, ``losses`` with ``a < b``, ``ties`` dropped;
    ``p`` = the probability, if wins and losses were equally likely, of a split at least this uneven."""

    wins: int
    losses: int
    ties: int
    p: float


def _vector(x, name: str) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D sequence of numbers (one per example), got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must hold finite numbers; drop or fix the NaN/inf entries first")
    return arr


def _check_confidence(confidence: float) -> None:
    if not (isinstance(confidence, (int, float)) and 0.0 < confidence < 1.0):
        raise ValueError(f"confidence must be a number in (0, 1), e.g. 0.95, got {confidence!r}")


def paired_bootstrap(a: Sequence[float], b: Sequence[float] | None = None, *, resamples: int = 10_000,
                     seed: int = 0, confidence: float = 0.95) -> Interval:
    """Mean paired difference ``mean(a - b)`` with a percentile bootstrap interval.

    Args:
        a: per-example outcomes of method A, shape ``(n,)`` (0/1 correctness, F1, NLL, a window's log-ppl ...).
        b: per-example outcomes of method B on the *same* examples in the same order, shape ``(n,)``;
            ``None`` bootstraps the mean of ``a`` alone.
        resamples: bootstrap resamples (10,000: the interval's ends move by well under 1 % of its width
            between seeds).
        seed: the generator's seed; the same inputs and seed always give the same interval.
        confidence: 0.95 for a 95 % interval.

    Returns:
        ``Interval(estimate=mean(a - b), low, high, n)``. Swapping ``a`` and ``b`` negates and mirrors it;
        a constant difference gives ``low == estimate == high``.

    Algorithm::

        d = a - b
        for r in 1..R: draw n indices with replacement; m[r] = mean(d[indices])
        low, high = quantile(m, (1 - confidence) / 2), quantile(m, (1 + confidence) / 2)
    """
    _check_confidence(confidence)
    if not isinstance(resamples, int) or resamples < 100:
        raise ValueError(f"resamples must be an int >= 100 (10_000 is the default), got {resamples!r}")
    a = _vector(a, "a")
    if b is not None:
        b = _vector(b, "b")
        if b.shape != a.shape:
            raise ValueError(f"a and b must pair up example by example: got {a.size} and {b.size} values; "
                             "pass the outcomes of both methods on the same examples, in the same order")
        with np.errstate(over="ignore", invalid="ignore"):
            d = a - b
    else:
        d = a
    n = d.size
    if n == 0:
        raise ValueError("a must hold at least one example, got none")
    with np.errstate(over="ignore", invalid="ignore"):
        total = d.sum()
    if not (np.all(np.isfinite(d)) and np.isfinite(total)):
        raise ValueError("a - b (or its sum) is not finite: the values are so large that the difference overflows "
                         "float64; rescale both (e.g. divide by a common unit) before comparing them")
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    block = max(1, min(resamples, 4_000_000 // n))  # bound the index matrix to ~32 MB
    for start in range(0, resamples, block):
        stop = min(resamples, start + block)
        idx = rng.integers(0, n, size=(stop - start, n))
        means[start:stop] = d[idx].mean(axis=1)
    alpha = (1.0 - confidence) / 2.0
    estimate = float(d.mean())
    if np.all(d == d[0]):  # a constant difference: every resample has the same mean
        return Interval(estimate, estimate, estimate, n, confidence, "paired bootstrap")
    # Quantiles of the sorted means read from both ends the same way, so swapping a and b mirrors exactly.
    means.sort()
    low = float(np.quantile(means, alpha))
    high = float(-np.quantile(-means, alpha))
    return Interval(estimate, min(low, estimate), max(high, estimate), n, confidence, "paired bootstrap")


def _binom_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p), summed in log space (exact up to float rounding).

    Only the terms within ~40 standard deviations of the larger end of the sum are added: every other term is
    below exp(-800) times the largest and vanishes in float64 anyway, so a million trials cost thousands of
    terms, not a million."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 0.0
    lp, lq = math.log(p), math.log1p(-p)
    width = int(40 * math.sqrt(n * p * (1 - p))) + 100
    mode = int(n * p)
    if k > mode + width:  # the sum holds the whole mass but for terms below exp(-800)
        return 1.0
    start = max(0, min(k, mode) - width)
    logs = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq
            for i in range(start, k + 1)]
    top = max(logs)
    return min(1.0, math.exp(top) * sum(math.exp(v - top) for v in logs))


def _bisect(f, lo: float, hi: float) -> float:
    for _ in range(200):
        mid = (lo + hi) / 2
        if mid in (lo, hi):  # converged to float precision
            break
        if f(mid):
            hi = mid
        else:
            lo = mid
    return (lo + hi) / 2


def proportion_interval(successes: int, n: int, *, confidence: float = 0.95, method: str = "wilson") -> Interval:
    """An interval for one proportion ``successes / n`` (e.g. accuracy on ``n`` questions).

    ``method="wilson"``: Wilson's score interval, the set of proportions ``p`` whose normal test would not reject
    the observed count; good coverage even for small ``n`` or ``p`` near 0 or 1.
    ``method="exact"``: Clopper-Pearson, from the binomial distribution itself: ``low`` is the ``p`` at which
    seeing ``successes`` or more has probability ``(1 - confidence) / 2``, ``high`` likewise from below; it
    covers at least ``confidence`` for every ``p`` (so it is wider).
    """
    _check_confidence(confidence)
    if not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be an int >= 1 (the number of trials), got {n!r}")
    if not isinstance(successes, (int, np.integer)) or not 0 <= successes <= n:
        raise ValueError(f"successes must be an int in [0, n={n}], got {successes!r}")
    n, successes = int(n), int(successes)
    phat = successes / n
    alpha = 1.0 - confidence
    if method == "wilson":
        z = _Z95 if confidence == 0.95 else _normal_quantile(1 - alpha / 2)
        centre = (phat + z * z / (2 * n)) / (1 + z * z / n)
        half = z / (1 + z * z / n) * math.sqrt(phat * (1 - phat) / n + z * z / (4 * n * n))
        low, high = max(0.0, centre - half), min(1.0, centre + half)
    elif method == "exact":
        low = 0.0 if successes == 0 else _bisect(
            lambda p: 1.0 - _binom_cdf(successes - 1, n, p) >= alpha / 2, 0.0, 1.0)
        high = 1.0 if successes == n else _bisect(lambda p: _binom_cdf(successes, n, p) <= alpha / 2, 0.0, 1.0)
    else:
        raise ValueError(f"method must be 'wilson' or 'exact', got {method!r}")
    return Interval(phat, min(low, phat), max(high, phat), n, confidence, method)


def _normal_quantile(q: float) -> float:
    return _bisect(lambda x: 0.5 * math.erfc(-x / math.sqrt(2)) >= q, -40.0, 40.0)


def sign_test(a: Sequence[float], b: Sequence[float]) -> SignTest:
    """Exact two-sided sign test of "A and B are equally likely to win a pair".

    Counts the pairs where ``a > b`` (wins) and ``a < b`` (losses), drops ties, and returns
    ``p = min(1, 2 * P(X <= min(wins, losses)))`` for ``X ~ Binomial(wins + losses, 1/2)``. On 0/1 outcomes this
    is McNemar's exact test (:func:`mcnemar_exact`). It uses only the signs, so it holds whatever the
    distribution of the differences; with pairs but none informative (all ties), ``p = 1``. No pairs at all is
    refused: there is nothing to test, and ``p = 1`` would read as a measured "no difference".
    """
    a, b = _vector(a, "a"), _vector(b, "b")
    if a.shape != b.shape:
        raise ValueError(f"a and b must pair up example by example: got {a.size} and {b.size} values")
    if a.size == 0:
        raise ValueError("sign_test needs at least one pair (a[i], b[i]), got none: pass the per-example outcomes "
                         "of both methods")
    wins, losses = int(np.sum(a > b)), int(np.sum(a < b))
    ties = int(a.size - wins - losses)
    m = wins + losses
    p = 1.0 if m == 0 else min(1.0, 2.0 * _binom_cdf(min(wins, losses), m, 0.5))
    return SignTest(wins, losses, ties, p)


def mcnemar_exact(a: Sequence[float], b: Sequence[float]) -> SignTest:
    """McNemar's exact test for paired 0/1 outcomes (A right and B wrong vs A wrong and B right); the
    :func:`sign_test` restricted to 0/1 values."""
    av, bv = _vector(a, "a"), _vector(b, "b")
    for name, v in (("a", av), ("b", bv)):
        if not np.all((v == 0) | (v == 1)):
            raise ValueError(f"{name} must hold 0/1 outcomes for McNemar's test; use sign_test for other values")
    return sign_test(av, bv)
