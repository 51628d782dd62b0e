"""Kernel-level transfer: a known device's kernel regressors adapted to a new device from a few models.

Why: a kernel predictor needs thousands of measured kernels per device, but the *shape* of each kernel
type's cost law (which convolutions are slow, how a depthwise kernel grows with its input) carries over
between devices far better than its level does (LitePred's observation). So a new device B starts from
device A's regressors, and the kernels of a handful of B's models only have to teach the difference, in
log space, per kernel type::

    log ms_B = log â_A + g + δ_t + (s + s_t)·(log â_A − m_t) + (b + b_t)·f + ε

where â_A is A's prediction of the kernel, f its standardised log FLOPs and log bytes in / out / weights (the
regressors' base features), g, s, b device-wide (broad priors), δ_t, s_t, b_t the kernel type's own, shrunk
towards 0 (one prior variance for all offsets δ, one for all type slopes, chosen with the noise by the
marginal likelihood, :mod:`leti.predict.transfer.bayes`), m_t the type's mean log â_A on B's rows. The f terms
matter: a phone whose memory is relatively slower than another's scales its kernels by bytes, not by A's
latency (on one 20-model split, end-to-end Acc@10 0.60–0.65 without them, 0.75 with). A type B measured but A never saw is predicted by A's nearest type plus its own
δ_t, s_t; a type A knows but B's models lack gets the device-wide g, s only.

:class:`AdaptedKernels` answers like :class:`~leti.predict.kernels.predictor.KernelRegressors` (``resolve``,
``predict``, ``kernel_types``, saving), so a :class:`~leti.predict.kernels.model.KernelLatencyPredictor`
holds it unchanged. Saved as A's regressors' files under ``base/`` plus the correction in the manifest.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from leti.errors import CorruptModelError, DatasetError
from leti.predict.kernels.features import kernel_features
from leti.predict.kernels.predictor import _BASE_IDX, KernelRegressors

KIND = "adapted"


class AdaptedKernels:
    """A's :class:`KernelRegressors` (``base``) plus a per-type log-space affine correction fitted on B's rows."""

    def __init__(self, base: KernelRegressors, source_device: str = "") -> None:
        self.base = base
        self.source_device = source_device
        self.types_: list[str] = []  # the correction's types (B's, then A's)
        self.stand_in_: dict[str, str] = {}  # B's types A lacks -> A's type that predicts them
        self.centre_: dict[str, float] = {}
        self.coef_ = np.zeros(2)
        self.cov_ = np.zeros((2, 2))
        self.noise_ = 0.0
        self.rows_: dict[str, int] = {}
        self.f_mean_ = self.f_std_ = np.zeros(len(_BASE_IDX))

    @property
    def params(self) -> dict:
        return self.base.params

    @property
    def kernel_types(self) -> list[str]:
        return sorted(set(self.base.kernel_types) | set(self.stand_in_))

    # ---- fitting -------------------------------------------------------------------------------
    def _base_log(self, table: pd.DataFrame, types: np.ndarray) -> np.ndarray:
        as_base = np.array([self.stand_in_.get(t, t) for t in types])
        return np.log(self.base.predict(table, as_base)[0])

    def _design(self, table: pd.DataFrame, types: np.ndarray, la: np.ndarray) -> np.ndarray:
        """[1, log â − m, f] (device-wide: broad prior), [type one-hot] (offsets), [one-hot ⊗ (log â − m, f)]
        (slopes), with f the standardised log FLOPs and bytes of the kernel."""
        k = len(self.types_)
        idx = np.array([self.types_.index(t) if t in self.types_ else -1 for t in types])
        m = np.array([self.centre_.get(t, self.centre_.get("", 0.0)) for t in types])
        f = (kernel_features(table)[:, _BASE_IDX].astype(np.float64) - self.f_mean_) / self.f_std_
        d = np.column_stack([la - m, f])
        onehot = np.zeros((len(types), k))
        ok = idx >= 0
        onehot[np.flatnonzero(ok), idx[ok]] = 1.0
        slopes = (onehot[:, :, None] * d[:, None, :]).reshape(len(types), -1)
        return np.column_stack([np.ones(len(types)), d, onehot, slopes])

    def fit(self, table: pd.DataFrame) -> AdaptedKernels:
        from leti.predict.transfer.bayes import fit_evidence, fit_evidence_primal

        types = table["kernel_type"].astype(str).to_numpy()
        if len(types) < 3:
            raise DatasetError(f"kernel transfer needs at least 3 measured kernels of the new device, got {len(types)}")
        known = set(self.base.kernel_types)
        lacking = sorted(set(types) - known)
        as_base = self.base.resolve(pd.Series(types), kernel_features(table), True, "kernels")
        self.stand_in_ = {t: str(as_base[types == t][0]) for t in lacking}
        self.types_ = sorted(set(types))
        la = self._base_log(table, types)
        self.centre_ = {t: float(la[types == t].mean()) for t in self.types_}
        self.centre_[""] = float(la.mean())
        self.rows_ = {t: int((types == t).sum()) for t in self.types_}
        k = len(self.types_)
        f = kernel_features(table)[:, _BASE_IDX].astype(np.float64)
        self.f_mean_, self.f_std_ = f.mean(0), np.maximum(f.std(0), 1e-6)
        x = self._design(table, types, la)
        r = np.log(table["latency_ms"].to_numpy(np.float64)) - la
        # the same evidence in weight space when there are more kernels than columns (a transfer build's thousands)
        fit = fit_evidence_primal if len(r) > x.shape[1] else fit_evidence
        m = fit(x, r, [k, k * (1 + len(_BASE_IDX))], broad=2 + len(_BASE_IDX))
        self.coef_, self.cov_, self.noise_ = m["coef"], m["cov"], float(m["noise"])
        return self

    # ---- prediction (KernelRegressors' interface) -----------------------------------------------
    def resolve(self, types: pd.Series, features: np.ndarray, allow_unknown: bool, where: str) -> np.ndarray:
        t = types.astype(str).to_numpy()
        mine = np.isin(t, list(self.stand_in_))
        if mine.all():
            return t
        out = t.copy()
        out[~mine] = self.base.resolve(pd.Series(t[~mine]), features[~mine], allow_unknown, where)
        return out

    def predict(self, table: pd.DataFrame, as_types: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        types = table["kernel_type"].astype(str).to_numpy() if as_types is None else np.asarray(as_types)
        as_base = np.array([self.stand_in_.get(t, t) for t in types])
        ms_a, log_std_a = self.base.predict(table, as_base)
        la = np.log(ms_a)
        x = self._design(table, types, la)
        corr = x @ self.coef_
        var = ((x @ self.cov_) * x).sum(1)
        return np.exp(la + corr), np.sqrt(log_std_a ** 2 + var)

    # ---- persistence ---------------------------------------------------------------------------
    def state(self) -> dict:
        return {"kind": KIND, "source_device": self.source_device, "base": self.base.state(),
                "types": self.types_, "stand_in": self.stand_in_, "centre": self.centre_, "rows": self.rows_,
                "coef": self.coef_.tolist(), "cov": self.cov_.tolist(), "noise": self.noise_,
                "f_mean": self.f_mean_.tolist(), "f_std": self.f_std_.tolist()}

    def save_files(self, folder: Path) -> None:
        self.base.save_files(folder / "base")

    @classmethod
    def from_state(cls, state: dict, folder: Path, base) -> AdaptedKernels:
        """``base``: the source's regressors, loaded from ``state["base"]`` and ``folder / "base"``
        (:func:`~leti.predict.kernels.blend.regressors_from_state`: a source may itself be a transfer)."""
        self = cls(base, str(state.get("source_device", "")))
        self.types_ = [str(t) for t in state["types"]]
        self.stand_in_ = {str(k): str(v) for k, v in state["stand_in"].items()}
        self.centre_ = {str(k): float(v) for k, v in state["centre"].items()}
        self.rows_ = {str(k): int(v) for k, v in state.get("rows", {}).items()}
        self.coef_, self.cov_ = np.asarray(state["coef"], np.float64), np.asarray(state["cov"], np.float64)
        self.noise_ = float(state["noise"])
        self.f_mean_, self.f_std_ = np.asarray(state["f_mean"], np.float64), np.asarray(state["f_std"], np.float64)
        n = (2 + len(_BASE_IDX)) * (1 + len(self.types_))
        if self.coef_.shape != (n,) or self.cov_.shape != (n, n):
            raise CorruptModelError(f"{folder}: the kernel transfer correction has the wrong shape")
        return self

