"""The additive-cost model of ``transfer-ridge``: latency in milliseconds as a sum of op costs, with the
source devices' op costs as the prior.

A cell's latency is, to first order, the sum of what its ops cost on that device: linear in the op
counts, the ops still live on an input→output path (runtimes that prune dead branches) and the FLOPs
per op type — in milliseconds, not in log space (least squares on the five op counts of ten random
gold_6226 cells ranks the other cells at Spearman 0.983 in ms, 0.957 in log ms, mean of 10 seeds; fitted
on all 15,625 cells, these columns rank it at 0.9888). What differs between devices is the cost vector. So every source device s gets
its cost vector w_s by least squares on all the cells it measured (its latencies divided by their mean),
and the target's is drawn around them:

    y / ȳ = a·φ·w̄ + φ·(Σ_k b_k e_k) + c·1 + φ̃·d + ε,

where φ are the additive columns, w̄ the mean source cost vector, e_k the principal directions of the
source cost vectors (scaled by their spread: where devices are seen to differ), φ̃ the standardised
columns (differences no source shows: eyeriss is nearly additive in op counts but correlates ~0.5 with
every source). a, b, c, d have one prior variance per group, chosen with σ² by the evidence
(:mod:`.bayes`) — a Gaussian process over devices with a linear kernel per group. On the HELP split at
N = 10 (10 seeds) this model alone ranks pixel2 at 0.882, raspi4 0.910, titan_rtx_1 0.954, gold_6226
0.984, eyeriss 0.993 (``transfer-ridge`` before it: 0.868, 0.881, 0.947, 0.961, 0.984 on 3 seeds).
Relative (multiplicative) noise weights were tried and not kept: raspi4's 0.4 ms cells then dominate.
"""

from __future__ import annotations

import numpy as np

from leti.predict.transfer.bayes import fit_evidence, predictive

PREFIXES = ("count_", "live_", "mflops_")
SCALE = 3.0  # the prior-mean column is scaled so that its amplitude starts near the others'
FLOOR = 1e-4  # predicted latency / ȳ below this is clipped (log of a non-positive prediction)
BOUNDS = (-14.0, 8.0)


def additive_columns(names: list[str], std: np.ndarray) -> np.ndarray:
    """Indices of the additive columns among the ``rich`` features: op counts, live op counts and FLOPs per
    op type (not per vertex), those that vary."""
    return np.array([i for i, n in enumerate(names) if n.startswith(PREFIXES) and not n.startswith("mflops_v")
                     and np.isfinite(std[i])], np.int64)


def source_costs(a: np.ndarray, log_ms: np.ndarray) -> np.ndarray:
    """Every source device's cost vector over [1, columns], ``(D, F + 1)``.

    ``a``: (M, F) standardised additive columns of the source cells; ``log_ms``: (M, D) their log
    latencies (NaN = not measured). Each source's latencies are divided by their mean before the fit."""
    phi = np.concatenate([np.ones((len(a), 1)), a], 1)
    costs = []
    for j in range(log_ms.shape[1]):
        ok = np.isfinite(log_ms[:, j])
        ms = np.exp(log_ms[ok, j])
        costs.append(np.linalg.lstsq(phi[ok], ms / ms.mean(), rcond=None)[0])
    return np.array(costs)


def prior(costs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The mean source cost vector and the principal directions of their spread, scaled by it."""
    if len(costs) < 2:
        return costs.mean(0), np.zeros((costs.shape[1], 0))
    val, vec = np.linalg.eigh(np.cov(costs.T))
    keep = val > 1e-9 * max(float(val.max()), 1e-300)
    return costs.mean(0), vec[:, keep] * np.sqrt(val[keep])


def design(a: np.ndarray, costs: np.ndarray, own: bool = True, centre: int | None = None) -> tuple[np.ndarray, list[int]]:
    """Columns [φ·w̄, φ·basis, 1, φ̃] of the cells with standardised additive columns ``a`` (φ̃ only with
    ``own``: costs no source shows); group sizes. ``centre``: the prior's centre is that source's cost vector
    instead of the mean one (the spread around it stays that of all sources)."""
    phi = np.concatenate([np.ones((len(a), 1)), a], 1)
    mean, basis = prior(costs)
    if centre is not None:
        mean = costs[centre]
    blocks = [SCALE * (phi @ mean)[:, None], phi @ basis, np.full((len(a), 1), SCALE), a if own else a[:, :0]]
    blocks = [b for b in blocks if b.shape[1]]
    return np.concatenate(blocks, 1), [b.shape[1] for b in blocks]


def fit(x: np.ndarray, sizes: list[int], y_ms: np.ndarray) -> dict:
    """The model on the target's N latencies; its ``nll`` is that of the log-latencies (the Jacobian
    of y ↦ log y added) so that it weighs against the log-space variants."""
    scale = float(y_ms.mean())
    v = y_ms / scale
    m = fit_evidence(x, v, sizes, 0, BOUNDS)
    m["scale"] = scale
    m["nll"] -= float(np.log(v).sum())
    return m


def log_predict(x: np.ndarray, m: dict) -> tuple[np.ndarray, np.ndarray]:
    """Log-latency mean and standard deviation of the cells: the log-normal of the same mean and variance
    (not the delta method, whose std explodes where the predicted latency nears zero)."""
    mu, var = predictive(x, m)
    mu = np.maximum(mu, FLOOR)
    return np.log(mu * m["scale"]), np.sqrt(np.log1p(var / mu ** 2))
