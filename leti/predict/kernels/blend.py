"""Kernel-level transfer that holds at every budget: the adapted source blended, per type, with the device's own fit.

Why: :class:`~leti.predict.kernels.adapt.AdaptedKernels` (the source's regressors plus a per-type log-space affine
correction) pools what it learns over the kernel types and needs only a few kernels per type, so it wins with a
minute of measurement; but an affine map of the source's latency cannot express that the new device tiles and
prices kernels its own way (LETI's engine against TFLite + XNNPACK: 6×16 against 7×16 GEMM tiles, another
depthwise kernel), and it stopped at 50–62 % zoo Acc@10 while a scratch fit of the same kernels reached 82–91 %
with five to twenty minutes of them. Which of the two a kernel type should trust depends on how many kernels of
it were measured and on how far the devices' laws differ for it; the measured kernels themselves say which, so

    log ms = (1 − w_t) · log ms_adapted + w_t · log ms_own

with ms_own the device's own :class:`~leti.predict.kernels.predictor.KernelRegressors` (the scratch build's
families and features, default settings) and w_t ∈ {0, 0.1, …, 1} the weight of lowest :data:`CV_FOLDS`-fold
cross-validated error on the type's kernels (squared log error, each kernel weighted by √latency: a network's
time is in its big kernels, yet a type measured a dozen times must not hang on its single largest). Both halves
are refitted on every fold (the affine correction on all types' training kernels, as it pools them); the
folds' own regressors have :data:`CV_MEMBERS` member to keep the cost near one more scratch fit. A type with
fewer than :data:`MIN_OWN_ROWS` kernels keeps w = 0 (the affine correction alone); ties go to the smaller w.

The weights are then checked on the build's timed networks (:func:`~.adapt_fit.adapt_to_build`): the weights of
the types measured fewer than :data:`NETWORK_CHECK_ROWS` times are scaled by 0, ½ or 1, whichever makes the
networks' latencies most consistent. With a minute of kernels, cross-validation on 20–60 kernels of a type is
noisy and the networks correct it (local → engine, seed 0, 1 minute: 34 % zoo Acc@10 with the cross-validated
weights, 56 % checked). A type measured :data:`NETWORK_CHECK_ROWS` times or more keeps its cross-validated weight:
its own regressors rest on enough kernels for the cross-validation to be trusted, and eight networks are too few to
overrule hundreds of kernels (checking every type, the networks chose ½ at 5 and 20 minutes, which left half of each
kernel's log latency on the affine source: 72 / 77 % against scratch's 84 / 93 %). So with many kernels the blend
follows the cross-validation alone and converges to the device's own fit.

A blend rather than the source's prediction as a feature of the own trees: a tree is flat between its splits,
so with a dozen kernels it cannot follow the source's latency smoothly over three decades, while the blend
keeps the affine half wherever the own half has not earned its weight.

Saved like :class:`AdaptedKernels` (the source's regressors under ``base/``, the correction in the manifest),
the own regressors under ``own/``, ``kernels.kind = "blended"``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from leti.errors import CorruptModelError
from leti.predict.kernels.adapt import KIND as ADAPTED
from leti.predict.kernels.adapt import AdaptedKernels
from leti.predict.kernels.predictor import KernelRegressors

KIND = "blended"
#: folds of the weights' cross-validation, and the bagged members of each fold's own regressors
CV_FOLDS, CV_MEMBERS = 3, 1
#: the fewest kernels of a type for its own regressors to get any weight
MIN_OWN_ROWS = 20
#: the fewest kernels of a type whose cross-validated weight the timed networks may no longer scale down
NETWORK_CHECK_ROWS = 100
#: the weights tried
WEIGHTS = np.round(np.linspace(0.0, 1.0, 11), 2)


def best_weight(la: np.ndarray, lo: np.ndarray, ly: np.ndarray, w: np.ndarray) -> tuple[float, dict]:
    """(the weight of :data:`WEIGHTS` whose blend of the log predictions ``la`` (adapted) and ``lo`` (own) has the
    lowest ``w``-weighted mean squared error against ``ly``, {"adapted", "own", "blend": those errors})."""
    err = [float(np.sum(w * ((1 - a) * la + a * lo - ly) ** 2) / np.sum(w)) for a in WEIGHTS]
    k = int(np.flatnonzero(np.asarray(err) <= min(err) * (1 + 1e-9) + 1e-15)[0])  # ties (to rounding): smaller w
    return float(WEIGHTS[k]), {"adapted": err[0], "own": err[-1], "blend": err[k]}


class BlendedKernels:
    """:class:`AdaptedKernels` of the source's regressors and the device's own :class:`KernelRegressors`, mixed in
    log space with a per-type weight chosen by cross-validation on the device's kernels (module docstring)."""

    def __init__(self, base: KernelRegressors, source_device: str = "", params: dict | None = None) -> None:
        self.adapted = AdaptedKernels(base, source_device)
        self.own = KernelRegressors(**(params or {}))
        self.weight_: dict[str, float] = {}  # type -> the own regressors' weight (types without one: 0)
        self.cv_: dict[str, dict] = {}  # type -> rows and the CV errors of the adapted, own and blended kernels

    @property
    def base(self) -> KernelRegressors:
        return self.adapted.base

    @property
    def source_device(self) -> str:
        return self.adapted.source_device

    @property
    def params(self) -> dict:
        return self.own.params

    @property
    def kernel_types(self) -> list[str]:
        return self.adapted.kernel_types

    # ---- fitting -------------------------------------------------------------------------------
    def fit(self, table: pd.DataFrame) -> BlendedKernels:
        self.adapted.fit(table)
        types = table["kernel_type"].astype(str).to_numpy()
        counts = pd.Series(types).value_counts()
        cv_types = sorted(counts[counts >= MIN_OWN_ROWS].index)
        self.weight_, self.cv_ = {}, {}
        if cv_types:
            self._cross_validate(table, types, cv_types)
        mine = [t for t, w in self.weight_.items() if w > 0]
        if mine:
            self.own.fit(table[np.isin(types, mine)])
        return self

    def _cross_validate(self, table: pd.DataFrame, types: np.ndarray, cv_types: list[str]) -> None:
        seed = self.own.params["random_state"]
        fold = np.zeros(len(types), np.int64)  # stratified: every type in every fold
        rng = np.random.default_rng(seed)
        for t in cv_types:
            idx = np.flatnonzero(types == t)
            fold[idx] = rng.permutation(len(idx)) % CV_FOLDS
        sub = np.isin(types, cv_types)
        la, lo = np.full(len(types), np.nan), np.full(len(types), np.nan)
        cv_params = {**self.own.params, "n_members": CV_MEMBERS}
        for f in range(CV_FOLDS):
            train, test = fold != f, sub & (fold == f)
            if not test.any():
                continue
            adapted = AdaptedKernels(self.base, self.source_device).fit(table[train])
            la[test] = np.log(adapted.predict(table[test])[0])
            own = KernelRegressors(**cv_params).fit(table[train & sub])
            lo[test] = np.log(own.predict(table[test])[0])
        y = table["latency_ms"].to_numpy(np.float64)
        for t in cv_types:
            m = types == t
            w, err = best_weight(la[m], lo[m], np.log(y[m]), np.sqrt(y[m]))
            self.weight_[t] = w
            self.cv_[t] = {"rows": int(m.sum()), **err}

    def checked_types(self) -> list[str]:
        """The types whose own regressors have a weight the networks may scale down: those measured fewer than
        :data:`NETWORK_CHECK_ROWS` times (module docstring)."""
        return sorted(t for t, w in self.weight_.items() if w > 0 and self.cv_[t]["rows"] < NETWORK_CHECK_ROWS)

    def shrink(self, factor: float) -> None:
        """The weights of :meth:`checked_types` times ``factor`` (the networks' verdict,
        :func:`~.adapt_fit.adapt_to_build`); the others are kept."""
        few = set(self.checked_types())
        self.weight_ = {t: round(w * factor, 2) if t in few else w for t, w in self.weight_.items()}

    # ---- prediction (KernelRegressors' interface) -----------------------------------------------
    def resolve(self, types: pd.Series, features: np.ndarray, allow_unknown: bool, where: str) -> np.ndarray:
        return self.adapted.resolve(types, features, allow_unknown, where)

    def predict(self, table: pd.DataFrame, as_types: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        types = table["kernel_type"].astype(str).to_numpy() if as_types is None else np.asarray(as_types)
        ms, log_std = self.adapted.predict(table, types)
        w = np.array([self.weight_.get(t, 0.0) if t in self.own.types_ else 0.0 for t in types])
        m = w > 0
        if m.any():
            ms_own, std_own = self.own.predict(table[m], types[m])
            ms[m] = np.exp((1 - w[m]) * np.log(ms[m]) + w[m] * np.log(ms_own))
            log_std[m] = (1 - w[m]) * log_std[m] + w[m] * std_own
        return ms, log_std

    def summary(self) -> str:
        """The own regressors' weight per type, e.g. ``conv2d 1.0, add 0.3 (others 0)``."""
        mine = sorted(((t, w) for t, w in self.weight_.items() if w > 0), key=lambda x: (-x[1], x[0]))
        if not mine:
            return "the adapted source's regressors alone (the device's own earned no weight in cross-validation)"
        return ("the device's own regressors weigh " + ", ".join(f"{t} {w:.1f}" for t, w in mine)
                + " (the adapted source's the rest; weights by cross-validation, checked on the timed networks)")

    # ---- persistence ---------------------------------------------------------------------------
    def state(self) -> dict:
        return {"kind": KIND, "source_device": self.source_device, "adapted": self.adapted.state(), "own": self.own.state(), "weights": self.weight_,
                "cv": self.cv_}

    def save_files(self, folder: Path) -> None:
        self.adapted.save_files(folder)  # the source's regressors under base/
        self.own.save_files(folder / "own")

    @classmethod
    def from_state(cls, state: dict, folder: Path) -> BlendedKernels:
        adapted = AdaptedKernels.from_state(state["adapted"], folder,
                                            regressors_from_state(state["adapted"]["base"], folder / "base"))
        own = state["own"]
        self = cls(adapted.base, adapted.source_device, own["params"])
        self.adapted = adapted
        self.weight_ = {str(t): float(w) for t, w in state["weights"].items()}
        self.cv_ = {str(t): dict(v) for t, v in state.get("cv", {}).items()}
        if own["types"]:
            self.own = KernelRegressors.from_state(own, folder / "own")
        missing = sorted(t for t, w in self.weight_.items() if w > 0 and t not in self.own.types_)
        if missing or not all(0.0 <= w <= 1.0 for w in self.weight_.values()):
            raise CorruptModelError(f"{folder}: the blended kernel predictor's weights do not match its own "
                                    f"regressors ({', '.join(missing) or 'a weight outside [0, 1]'})")
        return self


def regressors_from_state(state: dict, folder: Path):
    """:class:`KernelRegressors`, :class:`AdaptedKernels` or :class:`BlendedKernels`, whichever the manifest's
    ``kernels`` holds (a transfer's base may itself be a transfer: a device reached by transfer is a source too)."""
    if state.get("kind") == ADAPTED:
        return AdaptedKernels.from_state(state, folder, regressors_from_state(state["base"], folder / "base"))
    if state.get("kind") == KIND:
        return BlendedKernels.from_state(state, folder)
    return KernelRegressors.from_state(state, folder)
