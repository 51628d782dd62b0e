"""Accuracy metrics of latency predictions. All take ``(measured, predicted)`` in ms.

* ``acc@k`` — share of cells whose prediction is within ±k of the measured latency,
  ``|p - y| <= k·y`` (BRP-NAS's and the LETI paper's Acc@10% with ``k = 0.10``), a fraction in [0, 1];
* ``r2`` — coefficient of determination ``1 - SS_res / SS_tot`` (can be negative);
* ``rmse`` — root mean squared error, ms; ``rmspe`` — root mean squared relative error
  ``sqrt(mean(((p - y) / y)²))``, a fraction;
* ``spearman``, ``kendall`` — rank correlations (Kendall's tau-b, which handles ties such as
  pixel2's 1 ms quantisation).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy import stats

from leti.errors import DatasetError


def _check(y: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    y = np.asarray(y, np.float64).ravel()
    p = np.asarray(p, np.float64).ravel()
    if y.shape != p.shape:
        raise DatasetError(f"{y.size} measured and {p.size} predicted values")
    if y.size == 0:
        raise DatasetError("no values to score")
    return y, p


def acc_at(y, p, k: float = 0.10) -> float:
    y, p = _check(y, p)
    return float(np.mean(np.abs(p - y) <= k * np.abs(y) + 1e-12))


def r2(y, p) -> float:
    y, p = _check(y, p)
    ss_tot = float(((y - y.mean()) ** 2).sum())
    ss_res = float(((y - p) ** 2).sum())
    return 1.0 - ss_res / ss_tot if ss_tot > 0 else float("nan")


def rmse(y, p) -> float:
    y, p = _check(y, p)
    return float(np.sqrt(np.mean((p - y) ** 2)))


def rmspe(y, p) -> float:
    y, p = _check(y, p)
    return float(np.sqrt(np.mean(((p - y) / y) ** 2)))


def spearman(y, p) -> float:
    y, p = _check(y, p)
    return float(stats.spearmanr(y, p).statistic) if y.size > 1 else float("nan")


def kendall(y, p) -> float:
    y, p = _check(y, p)
    return float(stats.kendalltau(y, p).statistic) if y.size > 1 else float("nan")


METRICS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "acc@5%": lambda y, p: acc_at(y, p, 0.05),
    "acc@10%": lambda y, p: acc_at(y, p, 0.10),
    "r2": r2,
    "rmse": rmse,
    "rmspe": rmspe,
    "spearman": spearman,
    "kendall": kendall,
}


def score_all(y, p) -> dict[str, float]:
    """Every metric of :data:`METRICS`."""
    return {name: fn(y, p) for name, fn in METRICS.items()}
