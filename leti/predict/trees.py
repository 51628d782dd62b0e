"""Compiled tree ensembles: XGBoost, LightGBM and CatBoost models evaluated by numba kernels.

The libraries' own predictors are general (missing values, categories, many objectives) and pay for it:
on this project's feature vectors XGBoost predicts ~60-90k rows/s and LightGBM ~14k rows/s on one core,
and each call costs about a millisecond of set-up. A latency predictor only needs "sum of leaf values
over numeric axis-aligned splits", so the trained model is *compiled* once into flat arrays and a small
branch-free kernel walks it:

* every tree is padded to a **complete binary tree** of the ensemble's largest depth ``D``: a leaf
  found at depth ``d < D`` becomes a chain of dummy splits (threshold ``+inf``, always "left") whose
  leaves all carry its value, so walking a tree is ``D`` steps of
  ``node = 2·node + 1 + (x[feature[node]] >= threshold[node])`` with no branch to mispredict;
* rows are processed in blocks, tree by tree, so a tree's arrays stay in L1 while a block of rows walks
  it; blocks run in parallel (``numba.prange``) over ``n_jobs`` threads.

Features and thresholds are float32, compared as order-preserving int32 (:func:`_sortable`);
split semantics are normalised to "right when ``x >= threshold``". XGBoost already splits that way (``x < t`` goes left)
on float32 features. LightGBM goes left when ``x <= t`` with a float64 ``t``; for a float32 ``x`` that is
"right when ``x >= v``" with ``v`` the smallest float32 above ``t`` — exact, which is why the boosting
predictors round their features to float32 before training as well as before predicting. Features must
be finite (the feature builders guarantee it; :meth:`TreeEnsemble.predict` checks). Results equal the
libraries' up to float summation order (tests compare them).

CatBoost's trees are *oblivious* (one split per level), so :class:`ObliviousEnsemble` computes the leaf
index from ``D`` independent comparisons; CatBoost's own evaluator is as fast in batch, but costs
~0.8 ms per call, which the compiled form does not.

The compiled form is derived state: predictors save the library's native file and recompile on load.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numba
import numpy as np

from leti.errors import CorruptModelError, DatasetError

_BLOCK = 256  # rows per block: a block's features stay in L1/L2 while it walks all trees


@dataclass(frozen=True)
class TreeEnsemble:
    """``T`` complete trees of depth ``D``: ``feature (T, 2^D - 1)`` int32, ``threshold (T, 2^D - 1)``
    float32 ("go right when x >= threshold"), ``leaf (T, 2^D)`` float64, plus a constant ``base``."""

    feature: np.ndarray
    threshold: np.ndarray
    leaf: np.ndarray
    base: float
    depth: int
    num_features: int

    def __post_init__(self) -> None:
        # What the kernel reads: feature indices as uint32 and thresholds as order-preserving int32.
        # Unsigned indices matter: numba wraps negative signed indices, and that check on every
        # dependent load made the walk ~1.7x slower (benchmarks/bench_predict_api.py).
        object.__setattr__(self, "feat_u32", np.ascontiguousarray(self.feature, np.uint32))
        object.__setattr__(self, "thr_i32", np.ascontiguousarray(_sortable(self.threshold)))

    def predict(self, x: np.ndarray, n_jobs: int = 1) -> np.ndarray:
        xs = _sortable_features(x, self.num_features)
        out = np.empty(len(xs))
        if len(xs) == 0:
            return out
        xflat = xs.ravel()
        if len(xs) <= _BLOCK or n_jobs <= 1:
            _walk(xflat, xs.shape[1], self.feat_u32, self.thr_i32, self.leaf, self.depth, self.base, out)
        else:
            with _numba_threads(n_jobs):
                _walk_parallel(xflat, xs.shape[1], self.feat_u32, self.thr_i32, self.leaf, self.depth, self.base,
                               out)
        return out


def _sortable(a: np.ndarray) -> np.ndarray:
    """float32 -> int32 with the same order (``a >= b`` iff ``f(a) >= f(b)``; -0.0 is made +0.0 first):
    non-negative floats keep their bits, negative ones get their magnitude bits flipped."""
    bits = (np.asarray(a, np.float32) + np.float32(0.0)).view(np.int32)
    return np.where(bits < 0, bits ^ np.int32(0x7FFFFFFF), bits)


def _sortable_features(x: np.ndarray, num_features: int) -> np.ndarray:
    """:func:`_check_features` then :func:`_sortable`, in one compiled pass over the batch."""
    x = _check_shape(x, num_features)
    if x.dtype != np.float32:
        x = x.astype(np.float32)
    out = np.empty(x.shape, np.int32)
    if not _sortable_kernel(np.ascontiguousarray(x).ravel(), out.ravel()):
        raise DatasetError("features must be finite for a compiled tree ensemble")
    return out


@numba.njit(cache=True, nogil=True)
def _sortable_kernel(x, out):
    finite = True
    for i in range(x.shape[0]):
        v = x[i]
        finite &= np.isfinite(v)
        b = np.float32(v + np.float32(0.0)).view(np.int32)
        out[i] = b ^ np.int32(0x7FFFFFFF) if b < 0 else b
    return finite


# ---- kernels ------------------------------------------------------------------------------------
@numba.njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _block(xflat, nf, feat, thr, leaf, depth, base, out, lo, hi, node, acc):
    # Level by level over the block's rows: the rows' walks are independent, so the CPU overlaps
    # their loads instead of waiting on one row's chain of dependent loads (about 2x faster than
    # walking one row at a time). Every index is unsigned (uint32/uint64) so that numba emits plain
    # loads without its negative-index wraparound.
    first_leaf = np.uint32((1 << depth) - 1)
    m = hi - lo
    one, two = np.uint32(1), np.uint32(2)
    for i in range(m):
        acc[i] = base
    for t in range(feat.shape[0]):
        pf = feat[t]
        pt = thr[t]
        lv = leaf[t]
        for i in range(m):
            node[i] = 0
        for _ in range(depth):
            for i in range(m):
                k = node[i]
                row = np.uint64((lo + i) * nf)
                node[i] = two * k + one + np.uint32(xflat[row + np.uint64(pf[k])] >= pt[k])
        for i in range(m):
            acc[i] += lv[node[i] - first_leaf]
    for i in range(m):
        out[lo + i] = acc[i]


@numba.njit(cache=True, nogil=True)
def _walk(xflat, nf, feat, thr, leaf, depth, base, out):
    n = out.shape[0]
    node, acc = np.empty(_BLOCK, np.uint32), np.empty(_BLOCK)
    for lo in range(0, n, _BLOCK):
        _block(xflat, nf, feat, thr, leaf, depth, base, out, lo, min(lo + _BLOCK, n), node, acc)


@numba.njit(cache=True, nogil=True, parallel=True)
def _walk_parallel(xflat, nf, feat, thr, leaf, depth, base, out):
    n = out.shape[0]
    nb = (n + _BLOCK - 1) // _BLOCK
    for b in numba.prange(nb):
        lo = b * _BLOCK
        node, acc = np.empty(_BLOCK, np.uint32), np.empty(_BLOCK)
        _block(xflat, nf, feat, thr, leaf, depth, base, out, lo, min(lo + _BLOCK, n), node, acc)


# ---- building complete trees ----------------------------------------------------------------------
def _complete(trees: list[tuple[list[int], list[int], list[int], list[float], list[float]]], base: float,
              num_features: int) -> TreeEnsemble:
    """Pad trees given as (left, right, feature, threshold, value) node lists (root 0, leaf: left -1)."""

    def depth_of(tree) -> int:
        left, right = tree[0], tree[1]
        best, stack = 0, [(0, 0)]
        while stack:
            node, d = stack.pop()
            if left[node] < 0:
                best = max(best, d)
            else:
                stack += [(left[node], d + 1), (right[node], d + 1)]
        return best

    depth = max([depth_of(t) for t in trees] + [1])
    n_int, n_leaf = (1 << depth) - 1, 1 << depth
    feature = np.zeros((len(trees), n_int), np.int32)
    threshold = np.full((len(trees), n_int), np.inf, np.float32)
    leaf = np.zeros((len(trees), n_leaf))
    for t, (left, right, feat, thr, val) in enumerate(trees):
        stack = [(0, 0)]  # (source node, complete-tree position)
        while stack:
            node, pos = stack.pop()
            d = int(math.floor(math.log2(pos + 1)))
            if left[node] < 0:  # a leaf: fill every complete-tree leaf below pos
                span = 1 << (depth - d)
                first = (pos + 1) * span - 1 - n_int
                leaf[t, first:first + span] = val[node]
                continue
            feature[t, pos] = feat[node]
            threshold[t, pos] = thr[node]
            stack += [(left[node], 2 * pos + 1), (right[node], 2 * pos + 2)]
    return TreeEnsemble(feature, threshold, leaf, float(base), depth, int(num_features))


def compile_xgboost(booster) -> TreeEnsemble:
    """A trained ``xgboost.Booster`` (``reg:squarederror``, numeric splits) as a :class:`TreeEnsemble`."""
    model = json.loads(booster.save_raw("json"))
    learner = model["learner"]
    if learner["objective"]["name"] != "reg:squarederror":
        raise CorruptModelError(f"cannot compile an XGBoost model with objective {learner['objective']['name']}")
    param = learner["learner_model_param"]
    base = float(str(param["base_score"]).strip("[]"))
    gb = learner["gradient_booster"]
    if gb.get("name", "gbtree") != "gbtree":
        raise CorruptModelError(f"cannot compile an XGBoost {gb.get('name')} model")
    trees = []
    for tr in gb["model"]["trees"]:
        if any(tr["split_type"]):
            raise CorruptModelError("cannot compile an XGBoost model with categorical splits")
        left, right = tr["left_children"], tr["right_children"]
        cond = tr["split_conditions"]  # threshold at a split, leaf value at a leaf
        trees.append((left, right, tr["split_indices"], cond, [float(c) for c in cond]))
    return _complete(trees, base, int(param["num_feature"]))


def compile_lightgbm(booster) -> TreeEnsemble:
    """A trained ``lightgbm.Booster`` (regression, numeric ``<=`` splits) as a :class:`TreeEnsemble`."""
    dump = booster.dump_model()
    if dump.get("num_class", 1) != 1:
        raise CorruptModelError("cannot compile a multi-class LightGBM model")
    trees = []
    for info in dump["tree_info"]:
        left: list[int] = []
        right: list[int] = []
        feat: list[int] = []
        thr: list[float] = []
        val: list[float] = []

        def add(node: dict) -> int:
            i = len(left)
            left.append(-1), right.append(-1), feat.append(0), thr.append(0.0), val.append(0.0)
            if "leaf_value" in node or "split_feature" not in node:
                val[i] = float(node.get("leaf_value", 0.0))
                return i
            if node.get("decision_type", "<=") != "<=":
                raise CorruptModelError("cannot compile a LightGBM model with categorical splits")
            feat[i] = int(node["split_feature"])
            thr[i] = _float32_above(float(node["threshold"]))  # x <= t goes left
            a = add(node["left_child"])
            b = add(node["right_child"])
            left[i], right[i] = a, b
            return i

        add(info["tree_structure"])
        trees.append((left, right, feat, thr, val))
    return _complete(trees, 0.0, int(dump["max_feature_idx"]) + 1)


@dataclass(frozen=True)
class ObliviousEnsemble:
    """``T`` oblivious (symmetric) trees of depth ``D``, CatBoost's kind: level ``d`` of tree ``t``
    splits every node on ``feature[t, d]``; the leaf index has bit ``d`` set when
    ``x[feature[t, d]] >= threshold[t, d]``. Prediction ``= base + scale · Σ leaf``."""

    feature: np.ndarray  # (T, D) int32
    threshold: np.ndarray  # (T, D) float32
    leaf: np.ndarray  # (T, 2^D) float64
    base: float
    scale: float
    num_features: int

    def predict(self, x: np.ndarray, n_jobs: int = 1) -> np.ndarray:
        x = _check_features(x, self.num_features)
        out = np.empty(len(x))
        if len(x):
            with _numba_threads(n_jobs if len(x) > _BLOCK else 1):
                _oblivious(np.ascontiguousarray(x.T), self.feature, self.threshold, self.leaf, self.base,
                           self.scale, out)
        return out


@numba.njit(cache=True, nogil=True, parallel=True)
def _oblivious(xt, feature, threshold, leaf, base, scale, out):
    # xt is (features, rows): a level's comparison reads one contiguous feature column, so the loop
    # over the block's rows vectorises; only the final leaf lookup is a gather.
    n = xt.shape[1]
    nb = (n + _BLOCK - 1) // _BLOCK
    depth = feature.shape[1]
    for b in numba.prange(nb):
        lo = b * _BLOCK
        m = min(lo + _BLOCK, n) - lo
        acc = np.zeros(m)
        idx = np.empty(m, np.int32)
        for t in range(feature.shape[0]):
            lv = leaf[t]
            idx[:] = 0
            for d in range(depth):
                col = xt[feature[t, d]]
                th = threshold[t, d]
                for i in range(m):
                    idx[i] |= np.int32(col[lo + i] >= th) << d
            for i in range(m):
                acc[i] += lv[idx[i]]
        for i in range(m):
            out[lo + i] = base + scale * acc[i]


def compile_catboost(model) -> ObliviousEnsemble:
    """A trained ``catboost.CatBoostRegressor`` (float features, symmetric trees) as an
    :class:`ObliviousEnsemble` (read from CatBoost's own JSON export)."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.json"
        model.save_model(str(path), format="json")
        dump = json.loads(path.read_text())
    trees = dump["oblivious_trees"]
    depth = max([len(t["splits"]) for t in trees] + [1])
    feature = np.zeros((len(trees), depth), np.int32)
    threshold = np.full((len(trees), depth), np.inf, np.float32)  # padding levels: bit never set
    leaf = np.zeros((len(trees), 1 << depth))
    for i, t in enumerate(trees):
        for d, sp in enumerate(t["splits"]):
            if sp.get("split_type") != "FloatFeature":
                raise CorruptModelError(f"cannot compile a CatBoost model with {sp.get('split_type')} splits")
            feature[i, d] = int(sp["float_feature_index"])
            threshold[i, d] = _float32_above(float(sp["border"]))  # x > border sets the bit
        values = t["leaf_values"]
        leaf[i, :len(values)] = values
    scale, bias = dump.get("scale_and_bias", [1.0, [0.0]])
    bias = bias[0] if isinstance(bias, list) else bias
    n_feat = len(dump["features_info"].get("float_features", []))
    return ObliviousEnsemble(feature, threshold, leaf, float(bias), float(scale), n_feat)


def _check_shape(x: np.ndarray, num_features: int) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim != 2 or x.shape[1] != num_features:
        raise DatasetError(f"the model reads {num_features} features, got an array of shape {x.shape}")
    return x


def _check_features(x: np.ndarray, num_features: int) -> np.ndarray:
    x = np.ascontiguousarray(_check_shape(x, num_features), np.float32)
    if not np.isfinite(x).all():
        raise DatasetError("features must be finite for a compiled tree ensemble")
    return x


class _numba_threads:
    """``with _numba_threads(n):`` run numba parallel loops on ``n`` threads, then restore."""

    def __init__(self, n: int) -> None:
        self.n = max(1, min(int(n), numba.config.NUMBA_NUM_THREADS))

    def __enter__(self) -> None:
        self.old = numba.get_num_threads()
        numba.set_num_threads(self.n)

    def __exit__(self, *exc) -> None:
        numba.set_num_threads(self.old)


def _float32_above(t: float) -> float:
    """The smallest float32 strictly greater than ``t``: for a float32 ``x``, ``x > t`` iff ``x >= it``."""
    v = np.float32(t)
    if float(v) <= t:
        v = np.nextafter(v, np.float32(np.inf))
    return float(v)
