"""The predictor base class, the registry of predictor families and pickle-free persistence.

Predictors follow scikit-learn's conventions (they *are* ``BaseEstimator`` s): ``__init__`` only stores
its arguments, ``get_params``/``set_params`` come from its signature, ``fit(cells, latency_ms)``
returns ``self``, learned state ends in ``_``, ``predict(cells)`` returns milliseconds as a float64
array. ``cells`` is anything :func:`leti.spaces.search_space.as_table` reads; the space seen in ``fit`` is
kept (``space_``) and later inputs are read as cells of that space.

**Saved form** — a folder holding ``manifest.json`` and the model's native files::

    manifest.json   {"format": "leti-predictor", "format_version": 1, "name": ..., "version": ...,
                     "leti_version": ..., "params": {...}, "space": {...}, "features": {...},
                     "state": {...}, "model": {...} | null, "files": {name: sha256}}
    model.json | model.txt | model.cbm | model.pt | ...

``model`` is the :class:`~leti.spaces.spec.ModelSpec` of the training latencies (one cell at 64
channels is not the stacked network), so that ``leti predict`` can refuse a table of another model;
``null`` when the data did not say, absent in predictors saved before it was recorded (they still
load). ``files`` holds the native files' checksums, so a truncated or damaged file is refused in one
line before a library (whose errors are C++ stacks, or a crash) reads it. Every manifest field is
type-checked on load; a malformed one is named with its file.

XGBoost writes JSON, LightGBM text, CatBoost ``.cbm``, torch a ``state_dict`` read back with
``weights_only=True``; everything else lives in the manifest's ``state``. Nothing is ever unpickled.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin

from leti.errors import CorruptModelError, DatasetError, LetiError
from leti.registry import Registry
from leti.spaces.search_space import CellTable, as_table, space_from_spec
from leti.predict.manifest import MANIFEST, prepare_folder, read_manifest, write_manifest
from leti.spaces.spec import ModelSpec

FORMAT = "leti-predictor"
FORMAT_VERSION = 1

#: Predictor families by name; each module registers its classes with ``@register`` and is imported
#: on first use, so that importing ``leti.predict`` does not import torch or the boosting libraries.
FAMILIES: Registry[type[Predictor]] = Registry("predictor", lazy={
    "flops": "leti.predict.flops",
    "ransac": "leti.predict.ransac",
    "ransac_cluster": "leti.predict.ransac",
    "xgboost": "leti.predict.boosting",
    "lightgbm": "leti.predict.boosting",
    "catboost": "leti.predict.boosting",
    "xgboost_cal": "leti.predict.calibrated",
    "lightgbm_cal": "leti.predict.calibrated",
    "catboost_cal": "leti.predict.calibrated",
    "gcn": "leti.predict.gcn",
    "lut": "leti.predict.lut",
    # fitted with source devices' latencies (leti.predict.transfer); saved and loaded like any other
    "transfer-ridge": "leti.predict.transfer.ridge",
    "transfer-help": "leti.predict.transfer.help",
    "transfer-boost": "leti.predict.transfer.boost",
})
#: Class decorator: make a predictor family loadable by its ``name``.
register = FAMILIES.register()

#: Named variants: preset -> (family, parameters).
PRESETS: Registry[tuple[str, dict[str, Any]]] = Registry("predictor preset")
PRESETS.add("xgboost-rich", ("xgboost", {"features": "rich"}))
PRESETS.add("lightgbm-rich", ("lightgbm", {"features": "rich"}))
PRESETS.add("catboost-rich", ("catboost", {"features": "rich"}))
# 5 bootstrap members: gives predict(return_std=True), and +0.1-0.2 points of Acc@10% on NB201
PRESETS.add("catboost-bag", ("catboost", {"features": "rich", "n_members": 5}))
# catboost-bag whose point prediction is scaled by a factor fitted on its out-of-bag predictions to
# maximise Acc@10% (leti.predict.calibrated): +1-4 points of Acc@10% on NB201, biased on purpose
PRESETS.add("catboost-bag-cal", ("catboost_cal", {"features": "rich", "n_members": 5, "hit_k": 0.10}))
PRESETS.add("gcn-flops", ("gcn", {"node_flops": True, "global_node": True}))


def available() -> list[str]:
    """Every family and preset name."""
    return [*FAMILIES.names(), *PRESETS.names()]


def predictor_class(name: str) -> type[Predictor]:
    if name not in FAMILIES:
        raise LetiError(f"unknown predictor {name!r}; known: {', '.join(available())}")
    return FAMILIES.get(name)


def make_predictor(name: str, **params: Any) -> Predictor:
    """A new predictor from a family or preset name; ``params`` override the preset's."""
    if name in PRESETS:
        family, preset = PRESETS.get(name)
        return predictor_class(family)(**{**preset, **params})
    cls = predictor_class(name)
    try:
        return cls(**params)
    except TypeError as exc:
        raise LetiError(f"bad parameters for {name}: {exc}") from None


def check_latency(latency_ms: Any, n: int) -> np.ndarray:
    """Latencies as float64, or :class:`DatasetError` (length mismatch, NaN, infinite, non-positive)."""
    try:
        y = np.asarray(latency_ms, np.float64).ravel()
    except (TypeError, ValueError):
        raise DatasetError("latency_ms must be numbers") from None
    if y.size != n:
        raise DatasetError(f"{n} cells but {y.size} latencies")
    bad = ~np.isfinite(y)
    if bad.any():
        raise DatasetError(f"latency {y[bad][0]} at index {int(np.flatnonzero(bad)[0])} is not finite")
    if (y <= 0).any():
        i = int(np.flatnonzero(y <= 0)[0])
        raise DatasetError(f"latency {y[i]} at index {i} is not positive")
    return y


class Predictor(BaseEstimator, RegressorMixin):
    """Base of every latency predictor. Subclasses implement ``_fit``, ``_predict`` and, when they
    have learned state beyond JSON, ``_save_files``/``_load_files``."""

    name: ClassVar[str] = ""
    version: ClassVar[int] = 1
    #: the feature set the predictor reads, recorded in the manifest ("" = its own inputs)
    feature_kind: ClassVar[str] = ""

    # ---- the public API -------------------------------------------------------------------
    def fit(self, cells: Any, latency_ms: Any) -> Predictor:
        table = as_table(cells)
        if len(table) == 0:
            raise DatasetError("cannot fit on an empty set of cells")
        y = check_latency(latency_ms, len(table))
        self.space_ = table.space
        self._fit(table, y)
        return self

    def predict(self, cells: Any, return_std: bool = False) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """Latency in ms of every cell; with ``return_std`` also a standard deviation in ms (families
        that model uncertainty only: a bagged boosting ensemble, ``n_members >= 2``)."""
        self._check_fitted()
        table = as_table(cells, self.space_)
        if not return_std:
            if len(table) == 0:
                return np.zeros(0)
            return np.asarray(self._predict(table), np.float64).ravel()
        if not self.has_uncertainty:
            raise LetiError(f"the {self.name} predictor gives no uncertainty; use a boosting predictor with "
                            f"n_members >= 2 (e.g. make_predictor('xgboost-rich', n_members=5))")
        if len(table) == 0:
            return np.zeros(0), np.zeros(0)
        mean, std = self._predict_std(table)
        return np.asarray(mean, np.float64).ravel(), np.asarray(std, np.float64).ravel()

    def _check_fitted(self) -> None:
        if not hasattr(self, "space_"):
            raise LetiError(f"{type(self).__name__} is not fitted: call fit() or load a saved predictor")

    def table(self, cells: Any) -> CellTable:
        """``cells`` as a table of this predictor's space (convert once, predict many times)."""
        return as_table(cells, getattr(self, "space_", None))

    # ---- to implement ---------------------------------------------------------------------
    def _fit(self, table: CellTable, y: np.ndarray) -> None:
        raise NotImplementedError

    def _predict(self, table: CellTable) -> np.ndarray:
        raise NotImplementedError

    @property
    def has_uncertainty(self) -> bool:
        """Whether ``predict(cells, return_std=True)`` works for this fitted predictor."""
        return False

    def _predict_std(self, table: CellTable) -> tuple[np.ndarray, np.ndarray]:
        """(mean, standard deviation) in ms, for families whose ``has_uncertainty`` can be true."""
        raise NotImplementedError

    def _state(self) -> dict:
        """Learned state that is plain JSON."""
        return {}

    def _set_state(self, state: dict) -> None:
        pass

    def _save_files(self, folder: Path) -> None:
        """Write native model files into ``folder``."""

    def _load_files(self, folder: Path) -> None:
        """Read what :meth:`_save_files` wrote."""

    @classmethod
    def param_grid(cls, **fixed: Any) -> list[dict[str, Any]]:
        """Candidate parameter sets for model selection by cross-validation (``fixed`` kept)."""
        return [dict(fixed)]

    # ---- persistence ----------------------------------------------------------------------
    def _json_params(self) -> dict:
        params = {}
        for k, v in self.get_params(deep=False).items():
            try:
                json.dumps(v, allow_nan=False)
            except (TypeError, ValueError):
                v = None  # callables (a LUT's measure function) are not saved
            params[k] = v
        return params

    def save(self, path: str | Path) -> Path:
        """Write the predictor to folder ``path`` (created; an existing predictor there is replaced)."""
        if not hasattr(self, "space_"):
            raise LetiError("cannot save a predictor that is not fitted")
        folder = prepare_folder(path)
        try:
            return self._write(folder)
        except OSError as exc:
            raise LetiError(f"{folder}: cannot write the predictor there ({exc.strerror or type(exc).__name__})"
                            ) from None

    def _write(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        from leti import __version__

        self._save_files(folder)
        files = {f.name: _sha256(f) for f in sorted(folder.iterdir())
                 if f.is_file() and not f.name.startswith(MANIFEST)}
        manifest = {
            "format": FORMAT, "format_version": FORMAT_VERSION, "name": self.name, "version": self.version,
            "leti_version": __version__, "params": self._json_params(), "space": self.space_.spec(),
            "features": {"kind": self.feature_kind}, "state": _jsonable(self._state()),
            # which model the training latencies were of (None: the data did not say); a missing key
            # marks a predictor saved before LETI recorded it
            "model": spec.to_dict() if isinstance(spec := getattr(self, "model_spec_", None), ModelSpec)
            else None,
            # SHA-256 of the native files: a truncated or damaged one is refused before a library reads it
            "files": files,
        }
        if getattr(self, "model_spec_", None) is UNKNOWN_MODEL:
            del manifest["model"]  # re-saving an old predictor does not make its model known
        return write_manifest(folder, manifest)

    @classmethod
    def load(cls, path: str | Path) -> Predictor:
        """Read a saved predictor; the folder's manifest decides the class."""
        return load_predictor(path)


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating, float)):
        f = float(obj)
        return f if math.isfinite(f) else None
    return obj


def _one_line(exc: BaseException, limit: int = 120) -> str:
    """The start of an exception's message (native libraries append whole C++ stacks)."""
    text = str(exc).strip().splitlines()
    first = text[0].strip() if text else ""
    first = first if len(first) <= limit else first[:limit - 3] + "..."
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _sha256(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _check_files(files: Any, folder: Path, mf: Path) -> None:
    """Compare the native files with the checksums the manifest recorded (older predictors have none)."""
    if files is None:
        return
    if not isinstance(files, dict):
        raise CorruptModelError(f"{mf}: field 'files' is malformed ({type(files).__name__})")
    for name, digest in files.items():
        path = folder / str(name)
        if Path(str(name)).name != name:
            raise CorruptModelError(f"{mf}: field 'files' names {name!r}, which is not a file of the folder")
        if not path.is_file():
            raise CorruptModelError(f"{path}: model file is missing")
        if _sha256(path) != digest:
            raise CorruptModelError(f"{path}: model file is truncated or damaged (its SHA-256 differs from the "
                                    f"one recorded in {MANIFEST})")


def _manifest_fields(manifest: dict, mf: Path) -> None:
    """Check the manifest's fields have the types LETI writes; :class:`CorruptModelError` names the field."""
    expected = {"name": str, "format_version": int, "version": int, "params": dict, "space": dict,
                "state": dict, "features": dict, "model": (dict, type(None))}
    required = ("name", "space")
    for key, kind in expected.items():
        if key not in manifest:
            if key in required:
                raise CorruptModelError(f"{mf}: field {key!r} is missing")
            continue
        value = manifest[key]
        if not isinstance(value, kind) or isinstance(value, bool):
            raise CorruptModelError(f"{mf}: field {key!r} is malformed ({type(value).__name__} {value!r:.60})")


def load_predictor(path: str | Path) -> Predictor:
    """Load any saved predictor; :class:`CorruptModelError` when ``path`` is not one (naming the file)."""
    folder = Path(path)
    mf = folder / MANIFEST
    manifest = read_manifest(folder, FORMAT, FORMAT_VERSION)
    _manifest_fields(manifest, mf)
    name = manifest["name"]
    if name not in FAMILIES:
        raise CorruptModelError(f"{mf}: field 'name' is an unknown predictor family {name!r}")
    cls = predictor_class(name)
    if manifest.get("version", 0) > cls.version:
        raise CorruptModelError(f"{folder}: {name} version {manifest.get('version')} is newer than this LETI's "
                                f"{cls.version}")
    _check_files(manifest.get("files"), folder, mf)
    stage = "params"
    try:
        pred = cls(**{k: v for k, v in manifest.get("params", {}).items() if v is not None})
        stage = "space"
        pred.space_ = space_from_spec(manifest["space"])
        stage = "model"
        pred.model_spec_ = _model_spec(manifest, mf)
        stage = "state"
        pred._set_state(manifest.get("state", {}))
        stage = ""
        pred._load_files(folder)
    except LetiError as exc:
        if not stage:
            raise
        if str(exc).startswith(str(mf)):
            raise CorruptModelError(str(exc)) from None
        raise CorruptModelError(f"{mf}: field {stage!r} is malformed ({exc})") from None
    except Exception as exc:  # a damaged native file, a missing key
        where = f"{mf}: field {stage!r} is malformed" if stage else f"{folder}: cannot load {name} predictor"
        raise CorruptModelError(f"{where} ({_one_line(exc)})") from None
    return pred


#: marks a predictor saved before manifests recorded the model of the training data
UNKNOWN_MODEL = object()


def _model_spec(manifest: dict, mf: Path):
    """The :class:`~leti.spaces.spec.ModelSpec` the predictor was fitted on; ``None`` when its data did
    not say; :data:`UNKNOWN_MODEL` for a predictor saved by an older LETI (no ``model`` field)."""
    if "model" not in manifest:
        return UNKNOWN_MODEL
    if manifest["model"] is None:
        return None
    return ModelSpec.from_dict(manifest["model"], f"{mf}: field 'model'")


def native_file(path: Path, what: str, load):
    """``load(path)`` for a library's model file; a missing, truncated or foreign file raises
    :class:`CorruptModelError` naming it in one line (libraries raise multi-line C++ errors)."""
    if not path.is_file():
        raise CorruptModelError(f"{path}: {what} model file is missing")
    try:
        return load(path)
    except LetiError:
        raise
    except Exception as exc:
        raise CorruptModelError(f"{path}: not a readable {what} model file (truncated or damaged? "
                                f"{_one_line(exc)})") from None
