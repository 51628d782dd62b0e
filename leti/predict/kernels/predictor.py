"""One regressor per kernel type: the kernel-level half of LETI's any-model latency predictor.

Why per type: a convolution, a depthwise convolution and a concat run different GPU/CPU kernels
whose cost follows different laws, and nn-Meter/LitePred showed that separate regressors on kernel
features beat one model over all of them. Each type gets

* a **log-linear base** — ridge least squares of log ms on log FLOPs and log bytes in/out/weights — which
  extrapolates sensibly to kernels larger or smaller than any seen (for convolutions, depthwise convolutions and
  dense layers the FLOPs of padded GEMM tiles may stand in for the FLOPs: :data:`BASE_FLOPS`), and
* a **bagged boosting ensemble** from LETI's own families (:mod:`leti.predict.boosting`, through its
  ``fit_features``/``predict_features`` on feature matrices) fitted to the log *ratio* of the measured
  latency to the base. The members' spread is the kernel's uncertainty.

Saved without pickle: the boosters' native files (XGBoost JSON, LightGBM text) under ``types/<type>/``,
everything else in the caller's JSON manifest (:meth:`KernelRegressors.state`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from leti.errors import CorruptModelError, DatasetError, LetiError
from leti.predict.kernels.features import FEATURES, check_names, features_for, kernel_features

#: features of the log-linear base (indices into FEATURES)
BASE_FEATURES = ("log_flops", "log_bytes_in", "log_bytes_out", "log_bytes_weights")
_BASE_IDX = [FEATURES.index(f) for f in BASE_FEATURES]
#: when a type the predictor lacks is allowed, which known type stands in for it (first one known)
NEAREST = {
    "grouped_conv2d": ("conv2d", "depthwise_conv2d"), "depthwise_conv2d": ("grouped_conv2d", "conv2d"),
    "conv2d": ("grouped_conv2d", "dense"), "dense": ("conv2d",), "avg_pool": ("max_pool", "mean"),
    "max_pool": ("avg_pool", "mean"), "mean": ("avg_pool", "max_pool"), "concat": ("add", "mean"),
    "add": ("mul", "concat"), "mul": ("add", "concat"), "hard_swish": ("sigmoid", "relu", "add"),
    "sigmoid": ("hard_swish", "relu", "add"), "relu": ("hard_swish", "add"),
}


#: the FLOPs measures the base of a weighted kernel type may take in place of ``log_flops``. Why: XNNPACK (and
#: LETI's engine) compute a convolution in GEMM tiles, so 11 output channels cost about what 16 do; trees cannot
#: learn that where the samples are sparse (3×3 convolutions of 8-24 channels: NB101's small networks, whose
#: such convolutions were predicted ~35 % low). Each type takes the measure whose base alone has the lowest
#: cross-validated error (:func:`choose_base`): on the local CPU's 3,971 kernels, the 7×16 tiles for all four
#: types (conv2d base log RMS 0.80 → 0.57; boosted 4-fold wMAPE 11.9 % → 10.1 %, dense 13.1 → 9.8, depthwise
#: 14.1 → 9.2).
#: The per-group tiles and the engine's 6×16 tiles (``features.TILING_V2``) joined the candidates in session 14;
#: for kernels other than grouped convolutions the per-group measures equal the plain tiled ones, and a tie keeps
#: the earlier measure, so those types choose as before.
BASE_FLOPS = ("log_flops", "log_flops_tile4x8", "log_flops_tile7x16", "log_flops_gtile4x8", "log_flops_gtile7x16",
              "log_flops_tile6x16")
#: the kernel types whose base may take a tiled FLOPs measure (the GEMM-shaped ones)
TILED_TYPES = frozenset({"conv2d", "depthwise_conv2d", "grouped_conv2d", "dense"})
#: folds, and the fewest rows, of the base's choice
BASE_FOLDS, BASE_MIN_ROWS = 4, 40


def _base_design(x: np.ndarray, names: tuple[str, ...] | list[str] = BASE_FEATURES,
                 features: tuple[str, ...] = FEATURES) -> np.ndarray:
    """The base's design matrix: a column of ones and the ``names`` columns of ``x`` (laid out as ``features``)."""
    idx = _BASE_IDX if tuple(names) == BASE_FEATURES else [features.index(n) for n in names]
    return np.column_stack([np.ones(len(x)), x[:, idx].astype(np.float64)])


def choose_base(x: np.ndarray, z: np.ndarray, kernel_type: str, features: tuple[str, ...]) -> tuple[str, ...]:
    """The base features of ``kernel_type``: :data:`BASE_FEATURES` with the FLOPs measure of
    :data:`BASE_FLOPS` (those ``features`` has) whose ridge base has the lowest ``BASE_FOLDS``-fold error on
    ``(x, z)`` (log ms)."""
    candidates = [f for f in BASE_FLOPS if f in features]
    if kernel_type not in TILED_TYPES or len(z) < BASE_MIN_ROWS or len(candidates) < 2:
        return BASE_FEATURES
    fold = np.random.default_rng(0).permutation(len(z)) % BASE_FOLDS
    best, best_err = BASE_FEATURES, np.inf
    for flops in candidates:
        names = (flops, *BASE_FEATURES[1:])
        a = _base_design(x, names, features)
        err = 0.0
        for k in range(BASE_FOLDS):
            coef = _ridge(a[fold != k], z[fold != k])
            err += float(np.sum(np.square(a[fold == k] @ coef - z[fold == k])))
        if err < best_err - 1e-12:
            best, best_err = names, err
    return best


#: ridge strength of the base. Element-wise kernels have nearly collinear log FLOPs and log bytes in/out; with a
#: weak ridge (1e-3) the slopes grew opposite and large, and a kernel off that line (a broadcast operand, an
#: add of a constant) was predicted 10^7x too slow in cross-validation on measured local-CPU kernels.
RIDGE = 10.0


def _ridge(a: np.ndarray, z: np.ndarray, lam: float = RIDGE, weight: np.ndarray | None = None) -> np.ndarray:
    """Ridge least squares with the slopes held non-negative (the intercept free).

    Why the sign constraint: a kernel never gets faster with more work or more bytes, and with free signs
    even a strong ridge (10) left an add's slopes opposite and large enough that a broadcast add (one full
    operand, one small) read as 790 ms instead of 0.07 ms, which sank whole-model predictions of unseen
    models. Non-negative slopes keep any off-line kernel between the laws of its neighbours."""
    from scipy.optimize import lsq_linear

    if weight is not None:  # weighted least squares: each row scaled by the root of its weight
        r = np.sqrt(np.asarray(weight, np.float64))
        a, z = a * r[:, None], z * r
    k = a.shape[1]
    reg = np.sqrt(lam) * np.eye(k)
    reg[0, 0] = 0.0
    lower = np.r_[-np.inf, np.zeros(k - 1)]
    return lsq_linear(np.vstack([a, reg]), np.r_[z, np.zeros(k)], bounds=(lower, np.full(k, np.inf))).x


class KernelRegressors:
    """``fit(table)`` on a kernel table (LETI's schema) with ``latency_ms``; ``predict(table)`` gives
    (ms, log-space std) per row. ``family``: a boosting family of :mod:`leti.predict.boosting`; ``coverage``: each
    kernel weighs its closeness to real networks' kernels in its type's fit (:mod:`.coverage`; the kernel build's
    fits)."""

    def __init__(self, family: str = "xgboost", n_members: int = 5, n_estimators: int = 300,
                 learning_rate: float = 0.05, max_depth: int = 5, base: bool = True, random_state: int = 0,
                 n_jobs: int = 1, coverage: bool = False) -> None:
        self.params = {"family": family, "n_members": int(n_members), "n_estimators": int(n_estimators),
                       "learning_rate": float(learning_rate), "max_depth": int(max_depth), "base": bool(base),
                       "random_state": int(random_state), "n_jobs": int(n_jobs), "coverage": bool(coverage)}
        self.types_: dict[str, dict] = {}
        self.boosters_: dict[str, object] = {}
        #: the feature list of the fit (an older predictor's prefix of FEATURES when loaded)
        self.features_: tuple[str, ...] = FEATURES

    # ---- fitting -------------------------------------------------------------------------------
    def _booster(self):
        from leti.predict.base import make_predictor

        p = self.params
        return make_predictor(p["family"], target="log", n_members=p["n_members"], n_estimators=p["n_estimators"],
                              learning_rate=p["learning_rate"], max_depth=p["max_depth"],
                              random_state=p["random_state"], n_jobs=p["n_jobs"])

    def fit(self, table: pd.DataFrame, weight: np.ndarray | None = None) -> KernelRegressors:
        """``weight``: the rows' :mod:`.coverage` weights when already computed (a cross-validation computes them
        once on the whole table; else they are computed here when ``coverage`` is on)."""
        y = table["latency_ms"].to_numpy(np.float64)
        if "runtime" in table and self.features_ == FEATURES:  # the default list: the engine's takes its schemes
            self.features_ = features_for(table["runtime"].astype(str).unique())
        x = kernel_features(table, self.features_)
        types = table["kernel_type"].to_numpy()
        if not self.params.get("coverage"):
            weight = None
        elif weight is None:
            from leti.predict.kernels.coverage import coverage_weights

            weight = coverage_weights(table, seed=self.params["random_state"])
        for t in sorted(set(types)):
            m = types == t
            xt, zt = x[m], np.log(y[m])
            wt = None if weight is None else weight[m]
            names = choose_base(xt, zt, t, self.features_) if self.params["base"] else BASE_FEATURES
            if self.params["base"] and m.sum() >= 2 * len(_BASE_IDX):
                coef = _ridge(_base_design(xt, names, self.features_), zt, weight=wt)
            else:  # too few rows for a slope: the mean log latency
                coef = np.r_[zt.mean(), np.zeros(len(_BASE_IDX))]
            base = _base_design(xt, names, self.features_) @ coef
            booster = self._booster().fit_features(xt, np.exp(zt - base), weight=wt)
            self.boosters_[t] = booster
            centre = np.median(xt[:, _BASE_IDX], axis=0)
            self.types_[t] = {"rows": int(m.sum()), "base": coef.tolist(), "centre": centre.tolist()}
            if names != BASE_FEATURES:  # a predictor saved before the choice existed reads as BASE_FEATURES
                self.types_[t]["base_features"] = list(names)
        return self

    # ---- prediction ----------------------------------------------------------------------------
    @property
    def kernel_types(self) -> list[str]:
        return sorted(self.types_)

    def resolve(self, types: pd.Series, features: np.ndarray, allow_unknown: bool, where: str) -> np.ndarray:
        """The known type each row is predicted with; unknown types are refused unless ``allow_unknown``
        (then :data:`NEAREST`'s first known type, else the known type nearest in log FLOPs/bytes)."""
        types = types.astype(str).to_numpy()
        unknown = sorted(set(types) - set(self.types_))
        if not unknown:
            return types
        if not allow_unknown:
            counts = ", ".join(f"{u} ({int((types == u).sum())} rows)" for u in unknown)
            raise DatasetError(f"{where}: kernel type(s) the predictor was not fitted on: {counts}; it knows "
                               f"{', '.join(self.kernel_types)} (--allow-unknown predicts them with the nearest type)")
        out = types.copy()
        for u in unknown:
            m = types == u
            near = next((k for k in NEAREST.get(u, ()) if k in self.types_), None)
            if near is None:
                centre = features[m][:, _BASE_IDX].mean(axis=0)
                near = min(self.types_, key=lambda k: float(np.sum((np.array(self.types_[k]["centre"]) - centre) ** 2)))
            out[m] = near
        return out

    def predict(self, table: pd.DataFrame, as_types: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(latency ms, std of log latency) per row; ``as_types`` from :meth:`resolve`."""
        if not self.types_:
            raise LetiError("the kernel predictor is not fitted")
        x = kernel_features(table, self.features_)
        types = table["kernel_type"].astype(str).to_numpy() if as_types is None else as_types
        ms, log_std = np.zeros(len(x)), np.zeros(len(x))
        for t in sorted(set(types)):
            m = types == t
            booster = self.boosters_[t]
            raw = booster._member_raw(np.ascontiguousarray(x[m], np.float32))  # (members, n) log ratios
            names = tuple(self.types_[t].get("base_features", BASE_FEATURES))
            base = _base_design(x[m], names, self.features_) @ np.asarray(self.types_[t]["base"])
            ms[m] = np.exp(base + raw.mean(axis=0))
            log_std[m] = raw.std(axis=0) if len(raw) > 1 else 0.0
        return ms, log_std

    # ---- persistence (pickle-free) ---------------------------------------------------------------
    def state(self) -> dict:
        return {"params": self.params, "features": list(self.features_), "types": self.types_}

    def save_files(self, folder: Path) -> None:
        for t, booster in self.boosters_.items():
            sub = folder / "types" / t
            sub.mkdir(parents=True, exist_ok=True)
            booster._save_files(sub)

    @classmethod
    def from_state(cls, state: dict, folder: Path) -> KernelRegressors:
        features = check_names(state.get("features", []), str(folder))
        self = cls(**state["params"])
        self.features_ = features
        self.types_ = dict(state["types"])
        for t in self.types_:
            booster = self._booster()
            booster._set_state({"members": self.params["n_members"]})
            sub = folder / "types" / t
            if not sub.is_dir():
                raise CorruptModelError(f"{folder}: missing the model files of kernel type {t!r} ({sub})")
            names = self.types_[t].get("base_features", BASE_FEATURES)
            if (len(names) != len(BASE_FEATURES) or not set(names) <= set(features)
                    or len(self.types_[t].get("base", ())) != len(names) + 1):
                raise CorruptModelError(f"{folder}: kernel type {t!r} has a base this LETI does not compute ({names})")
            booster._load_files(sub)
            self.boosters_[t] = booster
        return self
