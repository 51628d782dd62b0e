"""Which kernels a transfer build measures on the new device: a few, spread over what the source predicts.

Why not the scratch build's rounds: those spend the budget where the new device's own regressors are unsure,
and a transfer build has no regressors of its own to be unsure with; what it fits is a per-type log-space
correction of the source's regressors (:mod:`.adapt`: an offset, a slope on the source's predicted latency and
on the kernel's log FLOPs and bytes). A line is pinned by points far apart along it, so each type's kernels are
spread over the source's predicted latency and over those features, and every type gets a few before any type
gets many (a budget that runs out early still corrects every type).

:func:`order_kernels` puts candidate kernels (rows of LETI's kernel table) in the order to measure them: within a
type, pick j sits at quantile v(j) of the source's predicted log latency (v the van der Corput sequence ½, ¼, ¾,
⅛, …: the median first, then the quartiles, then the octiles), and among the candidates near that quantile it is
the one farthest, in standardised (predicted log ms, log FLOPs, log bytes), from those already picked; across
types, the j-th pick of type t comes at j / share_t, share_t half even over the types and half the type's weight
(:func:`source_weights`: its share of the kernels and of the predicted latency of real networks), so the first
picks of every type come first. ``leti kernels build --transfer-from`` measures candidates drawn by the
sampler in that order; ``benchmarks/bench_kernel_transfer.py`` orders a measured device's kernels with the same
function.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from leti.predict.kernels.features import kernel_features
from leti.predict.kernels.predictor import _BASE_IDX

#: the share of the picks spread evenly over the kernel types (the rest follows each type's weight)
EVEN_SHARE = 0.5
#: candidates drawn per expected pick of a type (the chooser's room to spread), and the fewest per type
POOL_FACTOR, MIN_POOL = 4, 30
#: how much more the source's predicted log latency counts than each feature in the farthest-point distance
LATENCY_WEIGHT = 2.0


def van_der_corput(n: int) -> np.ndarray:
    """The first ``n`` points of the base-2 van der Corput sequence: ½, ¼, ¾, ⅛, ⅝, ⅜, ⅞, …"""
    out = np.zeros(n)
    for j in range(n):
        k, denom, x = j + 1, 1.0, 0.0
        while k:
            denom *= 2.0
            x += (k & 1) / denom
            k >>= 1
        out[j] = x
    return out


def order_within_type(log_ms: np.ndarray, features: np.ndarray, rng: np.random.Generator,
                      limit: int | None = None) -> np.ndarray:
    """Indices of one type's candidates in the order to measure (at most ``limit``): quantiles of the predicted
    log latency in van der Corput order, the farthest candidate in feature space near each."""
    n = len(log_ms)
    k = n if limit is None else min(n, limit)
    if k <= 0:
        return np.zeros(0, np.int64)
    z = np.column_stack([log_ms, features]).astype(np.float64)
    z = (z - z.mean(0)) / np.maximum(z.std(0), 1e-9)
    z[:, 0] *= LATENCY_WEIGHT
    by_ms = np.argsort(log_ms, kind="stable")
    taken = np.zeros(n, bool)
    dist = np.full(n, np.inf)  # squared distance to the nearest pick
    picked = []
    for j, q in enumerate(van_der_corput(k)):
        centre, half = int(round(q * (n - 1))), max(1, n // (2 * (j + 2)))
        window = by_ms[max(0, centre - half): centre + half + 1]
        window = window[~taken[window]]
        if not len(window):
            window = np.flatnonzero(~taken)
        score = np.where(np.isinf(dist[window]), 0.0, dist[window]) + 1e-9 * rng.random(len(window))
        i = int(window[np.argmax(score)])
        picked.append(i)
        taken[i] = True
        dist = np.minimum(dist, ((z - z[i]) ** 2).sum(1))
    return np.array(picked, np.int64)


def type_shares(types: list[str], weights: dict[str, float]) -> dict[str, float]:
    """Each type's share of the picks: :data:`EVEN_SHARE` split evenly, the rest by ``weights``."""
    w = np.array([max(weights.get(t, 0.0), 0.0) for t in types])
    w = w / w.sum() if w.sum() > 0 else np.full(len(types), 1.0 / max(len(types), 1))
    return {t: EVEN_SHARE / len(types) + (1 - EVEN_SHARE) * float(v) for t, v in zip(types, w)}


def source_log_ms(regressors, candidates: pd.DataFrame) -> np.ndarray:
    """The source's predicted log latency of each candidate (a type it lacks: its nearest known type)."""
    feats = kernel_features(candidates)
    as_types = regressors.resolve(candidates["kernel_type"], feats, True, "transfer candidates")
    return np.log(regressors.predict(candidates, as_types)[0])


def order_kernels(regressors, candidates: pd.DataFrame, weights: dict[str, float], rng: np.random.Generator,
                  limit: int | None = None) -> np.ndarray:
    """Row positions of ``candidates`` (LETI's kernel table) in the order a transfer build measures them, at most
    ``limit``: every type's first pick first, then by :func:`type_shares`, each type spread by
    :func:`order_within_type` over the source ``regressors``' predicted latency and the kernels' features."""
    if candidates.empty:
        return np.zeros(0, np.int64)
    types = candidates["kernel_type"].astype(str).to_numpy()
    log_ms = source_log_ms(regressors, candidates)
    feats = kernel_features(candidates)[:, _BASE_IDX].astype(np.float64)
    kinds = sorted(set(types), key=lambda t: (-weights.get(t, 0.0), t))
    share = type_shares(kinds, weights)
    keys, rows, rank = [], [], []
    for r, t in enumerate(kinds):
        m = np.flatnonzero(types == t)
        cap = None if limit is None else int(np.ceil(limit * share[t])) + 1
        order = m[order_within_type(log_ms[m], feats[m], rng, cap)]
        rows.append(order)
        keys.append(np.arange(len(order)) / share[t])
        rank.append(np.full(len(order), r))
    keys_, rows_, rank_ = np.concatenate(keys), np.concatenate(rows), np.concatenate(rank)
    out = rows_[np.lexsort((rank_, keys_))]
    return out if limit is None else out[:limit]


def source_weights(sampler, regressors) -> dict[str, float]:
    """The sampler's type weights (:meth:`~leti.predict.kernels.sampler.KernelSampler.type_weights`) with the real
    networks' kernels priced by the source regressors (types it lacks: by FLOPs and bytes)."""
    real = sampler.real
    known = real.kernel_type.isin(list(regressors.kernel_types)).to_numpy()
    ms = np.array(real.flops / 2e7 + (real.bytes_in + real.bytes_out) / 1e7, np.float64)
    if known.any():
        ms[known] = regressors.predict(real[known])[0]
    return sampler.type_weights(ms)


def candidate_pool(sampler, types: list[str], shares: dict[str, float], batch: int, rng: np.random.Generator,
                   known: set[str] = frozenset()):
    """(configs, their expected kernel rows) drawn by ``sampler``: per type :data:`POOL_FACTOR` × its expected
    picks of a ``batch`` (at least :data:`MIN_POOL`), names in ``known`` left out."""
    from leti.models.kernel_models import expected_row
    from leti.predict.kernels.schema import normalize

    configs = []
    for t in types:
        n = max(MIN_POOL, int(np.ceil(POOL_FACTOR * batch * shares.get(t, 0.0))))
        drawn = {c.name: c for c in sampler.draw(t, n, rng) if c.name not in known}
        configs += list(drawn.values())
    rows = pd.DataFrame([expected_row(c) for c in configs])
    rows["model"] = [c.name for c in configs]
    rows["kernel_index"] = 0
    return configs, normalize(rows, "transfer candidates")
