"""Which cells to measure first on a new device: a budget of N spread over the source-latency space.

A transfer model reads the target as a function of the sources' latencies; ten random cells bunch up
in the middle of that space and pin its slope badly. ``stratified`` sorts the candidates by their mean
standardised source log-latency (the mean source profile), cuts that order into ``budget`` strata of equal
size and draws one cell at random from each: the N cells cover fast to slow evenly and are still a random
sample within each stratum. ``design`` (the default) keeps the strata and, within each, takes the one of
:data:`DESIGN_CANDIDATES` random candidates with the highest leverage on the design so far (greedy D-optimal
over every source's own profile, not only their mean): a new device is read from where the sources disagree,
and mean-profile strata alone leave those directions to chance. Chosen on the sources only (each NB201
source in turn the target of the other three, ``benchmarks/bench_transfer.py --parts chooseloso``): mean
Spearman at N = 10 0.9508 against 0.9456 stratified and 0.9448 random, at N = 20 0.9542 / 0.9497 / 0.9535
(ridge and candidates picked among 0.01/1/10 and 8/24 the same way). ``kmeans`` (medoids of k-means over the
source profile plus a few architecture principal components), ``kcenter`` (greedy farthest point) and
``random`` are there to compare: on the HELP split at N = 10 the clustering choices picked central, typical
cells and lost to random on titan_rtx_1 and raspi4 (``docs/transfer.md``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from leti.errors import DatasetError, LetiError
from leti.predict.features import features
from leti.predict.transfer.base import source_profile
from leti.predict.transfer.data import Sources
from leti.spaces.search_space import as_table

METHODS = ("design", "stratified", "kmeans", "kcenter", "random")
#: candidates drawn from each stratum for ``design`` (the rest of the stratum is not looked at: the choice
#: stays a random sample, only steered among these)
DESIGN_CANDIDATES = 24
#: the design's ridge (prior precision on its coefficients): small lets the first picks go to the extremes
DESIGN_RIDGE = 10.0


def embed(sources: Sources, cells: Any, arch_weight: float = 0.5, arch_dims: int = 4) -> np.ndarray:
    """The space cells are spread over: source profile plus a few architecture principal components."""
    table = as_table(cells, sources.space)
    z = source_profile(sources, table)
    if arch_weight <= 0:
        return z
    f = features(table, "rich")
    f = f[:, f.std(0) > 0]
    f = (f - f.mean(0)) / f.std(0)
    _, s, vt = np.linalg.svd(f - f.mean(0), full_matrices=False)
    pcs = f @ vt[:arch_dims].T
    pcs /= max(float(pcs[:, 0].std()), 1e-12)
    return np.concatenate([z, arch_weight * pcs], 1)


def _design(z: np.ndarray, order: np.ndarray, lo: np.ndarray, hi: np.ndarray, rng) -> np.ndarray:
    """One cell per stratum of the mean source profile, each the candidate of highest leverage on the
    design so far (greedy D-optimal over ``[1, every source's standardised profile]``): the strata cover
    fast to slow as ``stratified`` does, and within them the cells spread along the directions in which
    the sources disagree, which is what a target between them is read from."""
    x = np.concatenate([np.ones((len(z), 1)), (z - z.mean(0)) / np.maximum(z.std(0), 1e-12)], 1)
    m_inv = np.eye(x.shape[1]) / DESIGN_RIDGE  # the prior precision: a strong one keeps the first picks off the extremes
    chosen = []
    for s in rng.permutation(len(lo)):
        cand = order[lo[s]:hi[s]]
        cand = cand[rng.permutation(len(cand))[:DESIGN_CANDIDATES]]
        xc = x[cand]
        lev = np.einsum("ij,jk,ik->i", xc, m_inv, xc)
        best = int(np.argmax(lev))
        v = m_inv @ xc[best]
        m_inv -= np.outer(v, v) / (1.0 + xc[best] @ v)  # Sherman-Morrison
        chosen.append(int(cand[best]))
    return np.array(chosen, np.int64)


def choose(sources: Sources, cells: Any, budget: int, method: str = "design", seed: int = 0) -> np.ndarray:
    """Indices (into ``cells``) of the ``budget`` cells to measure first."""
    table = as_table(cells, sources.space)
    n = len(table)
    if method not in METHODS:
        raise LetiError(f"unknown choice method {method!r}; known: {', '.join(METHODS)}")
    if budget < 1:
        raise DatasetError(f"--budget must be at least 1, got {budget}")
    if budget > n:
        raise DatasetError(f"--budget {budget} is larger than the {n} candidate cells")
    rng = np.random.default_rng(seed)
    if method == "random":
        return rng.permutation(n)[:budget]
    if method in ("stratified", "design"):
        z = source_profile(sources, table)
        order = np.argsort(z.mean(1), kind="stable")
        edges = np.linspace(0, n, budget + 1)
        lo, hi = np.ceil(edges[:-1]).astype(np.int64), np.ceil(edges[1:]).astype(np.int64)
        if method == "stratified":
            return order[np.minimum(lo + (rng.random(budget) * (hi - lo)).astype(np.int64), n - 1)]
        return _design(z, order, lo, hi, rng)  # budget <= n: every stratum holds a cell
    x = embed(sources, table)
    if method == "kcenter":
        first = int(np.argmin(((x - np.median(x, 0)) ** 2).sum(1)))
        chosen, dist = [first], ((x - x[first]) ** 2).sum(1)
        while len(chosen) < budget:
            nxt = int(np.argmax(dist))
            chosen.append(nxt)
            dist = np.minimum(dist, ((x - x[nxt]) ** 2).sum(1))
        return np.array(chosen, np.int64)
    from sklearn.cluster import KMeans

    km = KMeans(budget, n_init=3, random_state=seed).fit(x)
    chosen: list[int] = []
    for c in km.cluster_centers_:
        d = ((x - c) ** 2).sum(1)
        d[chosen] = np.inf
        chosen.append(int(np.argmin(d)))
    return np.array(chosen, np.int64)
