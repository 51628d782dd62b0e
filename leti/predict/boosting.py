"""Gradient-boosted trees on a feature vector: XGBoost, LightGBM and CatBoost (LETI paper §4.3).

``features="paper"`` is the paper's 58-value vector (NB101), ``"rich"`` LETI's own (see
:mod:`leti.predict.features`). ``target="log"`` fits log-latency, which suits the relative error that
Acc@10% measures; ``"linear"`` fits milliseconds as the paper did. Each library saves its own format:
XGBoost JSON, LightGBM text, CatBoost ``.cbm``.

**Speed.** Features are rounded to float32 before training and predicting (what the libraries do
internally anyway), so that trained models can be compiled into numba kernels
(:mod:`leti.predict.trees`): XGBoost and LightGBM predict several times faster than through the
libraries, and all three lose the libraries' per-call overhead (up to ~1 ms). The compiled form is
rebuilt after ``fit`` and ``load``; the library's native file stays the saved form, and
``library_predict`` gives the library's own predictions (tests compare them).

**Uncertainty.** With ``n_members = M > 1`` the predictor is a bagged ensemble: member ``i`` is trained
on a bootstrap resample of the training cells (seed ``random_state + i``). ``predict`` returns the
exponential of the members' mean log-latency (``target="log"``) or their mean (``"linear"``);
``predict(cells, return_std=True)`` also returns the members' standard deviation in ms — their
disagreement, an *epistemic* uncertainty that is large where training cells are scarce, not a
calibrated noise interval. ``predict_log_std`` gives the spread of log-latency (a relative
uncertainty), which is what the active sampler ranks by.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from leti.errors import LetiError
from leti.predict.base import Predictor, native_file, register
from leti.predict.features import features
from leti.spaces.search_space import CellTable


class _Boosting(Predictor):
    model_file = ""

    def __init__(self, features: str = "paper", target: str = "log", n_estimators: int = 600,
                 learning_rate: float = 0.05, max_depth: int = 6, random_state: int = 0, n_jobs: int = 1,
                 n_members: int = 1) -> None:
        self.features = features
        self.target = target
        self.n_estimators = n_estimators
        self.learning_rate = learning_rate
        self.max_depth = max_depth
        self.random_state = random_state
        self.n_jobs = n_jobs
        self.n_members = n_members

    @property
    def feature_kind(self) -> str:  # type: ignore[override]
        return self.features

    def _y(self, y: np.ndarray) -> np.ndarray:
        if self.target not in ("log", "linear"):
            raise ValueError(f"target must be 'log' or 'linear', got {self.target!r}")
        return np.log(y) if self.target == "log" else y

    def _back(self, z: np.ndarray) -> np.ndarray:
        return np.exp(z) if self.target == "log" else z

    def _x(self, table: CellTable) -> np.ndarray:
        return np.ascontiguousarray(features(table, self.features), np.float32)

    def _fit(self, table: CellTable, y: np.ndarray) -> None:
        self.fit_features(self._x(table), y)

    def fit_features(self, x: np.ndarray, y: np.ndarray, weight: np.ndarray | None = None) -> "_Boosting":
        """Fit on a ready feature matrix instead of cells (e.g. the engine's op configurations);
        ``y`` in ms. Used by :mod:`leti.engine.cost.learned`. ``weight`` (per row, optional): each member's
        bootstrap draws rows with probability proportional to it (a single member too)."""
        if int(self.n_members) < 1:
            raise LetiError(f"n_members must be at least 1, got {self.n_members}")
        x, z = np.ascontiguousarray(x, np.float32), self._y(np.asarray(y, np.float64))
        self.members_ = []
        for i in range(int(self.n_members)):
            idx = self._bag(i, len(z), weight)
            self.members_.append(self._train(x[idx], z[idx], int(self.random_state) + i))
        self._compile()
        return self

    def _bag(self, i: int, n: int, weight: np.ndarray | None = None) -> np.ndarray:
        """Training rows of member ``i``: all of them for one unweighted member, else a seeded bootstrap sample
        (drawn in proportion to ``weight`` when given)."""
        rng = np.random.default_rng(int(self.random_state) + i)
        if weight is not None:
            p = np.asarray(weight, np.float64)
            return rng.choice(n, n, p=p / p.sum())
        if self.n_members == 1:
            return np.arange(n)
        return rng.integers(0, n, n)

    def predict_features(self, x: np.ndarray) -> np.ndarray:
        """Predictions (ms) for a feature matrix laid out as in :meth:`fit_features`."""
        if not getattr(self, "members_", None):
            raise LetiError(f"{type(self).__name__} is not fitted: call fit_features() first")
        raw = self._member_raw(np.ascontiguousarray(x, np.float32))
        return self._back(raw.mean(axis=0))

    def _member_raw(self, x: np.ndarray) -> np.ndarray:
        """``(M, N)`` raw (target-space) predictions of every member."""
        return np.stack([self._raw_predict(i, x) for i in range(len(self.members_))])

    def _predict(self, table: CellTable) -> np.ndarray:
        x = self._x(table)
        if len(self.members_) == 1:
            return self._back(self._raw_predict(0, x))
        return self._back(self._member_raw(x).mean(axis=0))

    @property
    def has_uncertainty(self) -> bool:
        return len(getattr(self, "members_", [])) >= 2

    def _predict_std(self, table: CellTable) -> tuple[np.ndarray, np.ndarray]:
        raw = self._member_raw(self._x(table))
        return self._back(raw.mean(axis=0)), self._back(raw).std(axis=0)

    def predict_log_std(self, cells: Any) -> np.ndarray:
        """Standard deviation of the members' log-latency predictions (a relative uncertainty)."""
        self._check_fitted()
        self._need_members()
        raw = self._member_raw(self._x(self.table(cells)))
        return (raw if self.target == "log" else np.log(np.maximum(raw, 1e-12))).std(axis=0)

    def _need_members(self) -> None:
        if not self.has_uncertainty:
            raise LetiError(f"{self.name} was fitted with n_members={getattr(self, 'n_members', 1)}: "
                            f"uncertainty needs a bagged ensemble, fit with n_members >= 2")

    @classmethod
    def param_grid(cls, **fixed: Any) -> list[dict[str, Any]]:
        grid = [{"max_depth": 4, "learning_rate": 0.1}, {"max_depth": 6, "learning_rate": 0.05},
                {"max_depth": 8, "learning_rate": 0.05}]
        return [{**g, **fixed} for g in grid]

    # ---- persistence: one native file per member ------------------------------------------------
    def _member_file(self, i: int) -> str:
        if len(self.members_) == 1 and i == 0:
            return self.model_file
        stem, dot, ext = self.model_file.partition(".")
        return f"{stem}_{i}{dot}{ext}"

    def _state(self) -> dict:
        return {"members": len(self.members_)}

    def _set_state(self, state: dict) -> None:
        self._n_saved = int(state.get("members", 1))

    def _save_files(self, folder: Path) -> None:
        for i, m in enumerate(self.members_):
            self._save_member(m, folder / self._member_file(i))

    def _load_files(self, folder: Path) -> None:
        self.members_ = [None] * getattr(self, "_n_saved", 1)
        for i in range(len(self.members_)):
            self.members_[i] = native_file(folder / self._member_file(i), self.name, self._load_member)
        self._compile()

    # ---- per library ------------------------------------------------------------------------
    def _train(self, x: np.ndarray, z: np.ndarray, seed: int) -> Any:
        raise NotImplementedError

    def _compile(self) -> None:
        """Build the fast prediction form of ``members_`` (none by default)."""

    def _raw_predict(self, i: int, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _save_member(self, member: Any, path: Path) -> None:
        raise NotImplementedError

    def _load_member(self, path: Path) -> Any:
        raise NotImplementedError


class _CompiledBoosting(_Boosting):
    """Members are library models; predictions come from their compiled trees."""

    def _compile(self) -> None:
        self.compiled_ = [self._compile_member(m) for m in self.members_]

    def _raw_predict(self, i, x):
        return self.compiled_[i].predict(x, self.n_jobs)

    def library_predict(self, cells: Any) -> np.ndarray:
        """Predictions by the library's own evaluator (the reference the compiled trees are tested on)."""
        x = self._x(self.table(cells))
        return self._back(np.mean([self._library_raw(m, x) for m in self.members_], axis=0))

    def _compile_member(self, member: Any):
        raise NotImplementedError

    def _library_raw(self, member: Any, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError


@register
class XGBoostPredictor(_CompiledBoosting):
    name = "xgboost"
    model_file = "model.json"

    def _train(self, x, z, seed):
        import xgboost as xgb

        model = xgb.XGBRegressor(n_estimators=self.n_estimators, learning_rate=self.learning_rate,
                                 max_depth=self.max_depth, random_state=seed, n_jobs=self.n_jobs,
                                 tree_method="hist")
        model.fit(x, z)
        return model.get_booster()

    def _compile_member(self, member):
        from leti.predict.trees import compile_xgboost

        return compile_xgboost(member)

    def _library_raw(self, member, x):
        return member.inplace_predict(x)

    def _save_member(self, member, path):
        member.save_model(path)

    def _load_member(self, path):
        import xgboost as xgb

        booster = xgb.Booster()
        booster.load_model(path)
        return booster


@register
class LightGBMPredictor(_CompiledBoosting):
    name = "lightgbm"
    model_file = "model.txt"

    def _train(self, x, z, seed):
        import lightgbm as lgb

        model = lgb.LGBMRegressor(n_estimators=self.n_estimators, learning_rate=self.learning_rate,
                                  max_depth=self.max_depth, num_leaves=min(2**self.max_depth - 1, 63),
                                  min_child_samples=5, random_state=seed, n_jobs=self.n_jobs, verbose=-1)
        model.fit(x, z)
        return model.booster_

    def _compile_member(self, member):
        from leti.predict.trees import compile_lightgbm

        return compile_lightgbm(member)

    def _library_raw(self, member, x):
        return member.predict(x, num_threads=self.n_jobs)

    def _save_member(self, member, path):
        member.save_model(str(path))

    def _load_member(self, path):
        import lightgbm as lgb

        # LightGBM crashes the process (SIGSEGV) on a truncated text model: check it is whole first
        text = path.read_text(errors="replace")
        if not text.startswith("tree") or "end of trees" not in text:
            raise ValueError("the text model is incomplete (no 'end of trees')")
        return lgb.Booster(model_file=str(path))


@register
class CatBoostPredictor(_CompiledBoosting):
    name = "catboost"
    model_file = "model.cbm"

    def _train(self, x, z, seed):
        import catboost as cb

        model = cb.CatBoostRegressor(iterations=self.n_estimators, learning_rate=self.learning_rate,
                                     depth=self.max_depth, random_seed=seed, thread_count=self.n_jobs,
                                     verbose=False, allow_writing_files=False)
        model.fit(x, z)
        return model

    def _compile_member(self, member):
        from leti.predict.trees import compile_catboost

        return compile_catboost(member)

    def _library_raw(self, member, x):
        return member.predict(x, thread_count=self.n_jobs)

    def _save_member(self, member, path):
        member.save_model(str(path), format="cbm")

    def _load_member(self, path):
        import catboost as cb

        model = cb.CatBoostRegressor()
        model.load_model(str(path), format="cbm")
        return model
