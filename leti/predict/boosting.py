"""Gradient-boosted trees on a feature vector: XGBoost, LightGBM and CatBoost (LETI paper §4.3).

``features="paper"`` is the paper's 58-value vector (NB101), ``"rich"`` LETI's own (see
:mod:`leti.predict.features`). ``target="log"`` fits log-latency, which suits the relative error that
Acc@10% measures; ``"linear"`` fits milliseconds as the paper did. Each library saves its own format:
XGBoost JSON, LightGBM text, CatBoost ``.cbm``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from leti.predict.base import Predictor, register
from leti.predict.features import features
from leti.predict.spaces import CellTable


class _Boosting(Predictor):
    model_file = ""

    def __init__(self, features: str = "paper", target: str = "log", n_estimators: int = 600,
                 learning_rate: float = 0.05, max_depth: int = 6, random_state: int = 0, n_jobs: int = 1) -> None:
        self.features = features
        self.target = target
        self.n_estimators = n_estimators
        self.learning_rate = learning_rate
        self.max_depth = max_depth
        self.random_state = random_state
        self.n_jobs = n_jobs

    @property
    def feature_kind(self) -> str:  # type: ignore[override]
        return self.features

    def _y(self, y: np.ndarray) -> np.ndarray:
        if self.target not in ("log", "linear"):
            raise ValueError(f"target must be 'log' or 'linear', got {self.target!r}")
        return np.log(y) if self.target == "log" else y

    def _back(self, z: np.ndarray) -> np.ndarray:
        return np.exp(z) if self.target == "log" else z

    def _fit(self, table: CellTable, y: np.ndarray) -> None:
        self._train(features(table, self.features), self._y(y))

    def _predict(self, table: CellTable) -> np.ndarray:
        return self._back(self._raw_predict(features(table, self.features)))

    @classmethod
    def param_grid(cls, **fixed: Any) -> list[dict[str, Any]]:
        grid = [{"max_depth": 4, "learning_rate": 0.1}, {"max_depth": 6, "learning_rate": 0.05},
                {"max_depth": 8, "learning_rate": 0.05}]
        return [{**g, **fixed} for g in grid]

    def _train(self, x: np.ndarray, z: np.ndarray) -> None:
        raise NotImplementedError

    def _raw_predict(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError


@register
class XGBoostPredictor(_Boosting):
    name = "xgboost"
    model_file = "model.json"

    def _train(self, x, z):
        import xgboost as xgb

        self.model_ = xgb.XGBRegressor(n_estimators=self.n_estimators, learning_rate=self.learning_rate,
                                       max_depth=self.max_depth, random_state=self.random_state, n_jobs=self.n_jobs,
                                       tree_method="hist")
        self.model_.fit(x, z)

    def _raw_predict(self, x):
        # the booster directly: the sklearn wrapper's checks cost ~2 ms per call
        return self.model_.get_booster().inplace_predict(np.ascontiguousarray(x, np.float32))

    def _save_files(self, folder: Path) -> None:
        self.model_.save_model(folder / self.model_file)

    def _load_files(self, folder: Path) -> None:
        import xgboost as xgb

        self.model_ = xgb.XGBRegressor(n_jobs=self.n_jobs)
        self.model_.load_model(folder / self.model_file)


@register
class LightGBMPredictor(_Boosting):
    name = "lightgbm"
    model_file = "model.txt"

    def _train(self, x, z):
        import lightgbm as lgb

        model = lgb.LGBMRegressor(n_estimators=self.n_estimators, learning_rate=self.learning_rate,
                                  max_depth=self.max_depth, num_leaves=min(2**self.max_depth - 1, 63),
                                  min_child_samples=5, random_state=self.random_state, n_jobs=self.n_jobs,
                                  verbose=-1)
        model.fit(x, z)
        self.booster_ = model.booster_

    def _raw_predict(self, x):
        return self.booster_.predict(x, num_threads=self.n_jobs)

    def _save_files(self, folder: Path) -> None:
        self.booster_.save_model(str(folder / self.model_file))

    def _load_files(self, folder: Path) -> None:
        import lightgbm as lgb

        self.booster_ = lgb.Booster(model_file=str(folder / self.model_file))


@register
class CatBoostPredictor(_Boosting):
    name = "catboost"
    model_file = "model.cbm"

    def _train(self, x, z):
        import catboost as cb

        self.model_ = cb.CatBoostRegressor(iterations=self.n_estimators, learning_rate=self.learning_rate,
                                           depth=self.max_depth, random_seed=self.random_state,
                                           thread_count=self.n_jobs, verbose=False, allow_writing_files=False)
        self.model_.fit(x, z)

    def _raw_predict(self, x):
        return self.model_.predict(x, thread_count=self.n_jobs)

    def _save_files(self, folder: Path) -> None:
        self.model_.save_model(str(folder / self.model_file), format="cbm")

    def _load_files(self, folder: Path) -> None:
        import catboost as cb

        self.model_ = cb.CatBoostRegressor()
        self.model_.load_model(str(folder / self.model_file), format="cbm")
