"""Model latency from kernel latencies: the sum of kernel predictions plus a learned per-model overhead
(:mod:`.overhead`, which says why and how it is fitted).

:class:`KernelLatencyPredictor` is what ``leti fit --kernels`` saves: the regressors, the overhead and the
device/runtime/precision they describe (kernels of another are refused, naming both).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from leti.errors import CorruptModelError, DatasetError, LetiError
from leti.predict.kernels.cache import CacheProfile
from leti.predict.kernels.overhead import Overhead, model_aggregates
from leti.predict.kernels.predictor import KernelRegressors
from leti.predict.kernels.resident import stepped_ms
from leti.predict.kernels.schema import check_latency
from leti.predict.kernels.split import FusionRules, rules_for

FORMAT = "leti-kernel-predictor"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
#: weights (MB) at which :meth:`KernelLatencyPredictor.warm_ms` predicts a one-pixel kernel once (log-spaced)
WARM_GRID_MB = tuple(float(v) for v in np.geomspace(0.01, 400.0, 60))
Z90 = 1.6449
#: the log-scale spread a prediction made on a machine other than those its kernels were timed on adds to its
#: interval: two VMs of one CPU type ran the same models 1.17x apart (log 0.15; :mod:`leti.device.host` says where)
OTHER_HOST_LOG_STD = 0.15


@dataclass
class ModelLatency:
    """One model's predicted latency: ``latency_ms`` (with the overhead), its 90% interval, the
    kernels' sum and the per-kernel breakdown (the kernel rows plus ``predicted_ms``, ``predicted_as``)."""

    model: str
    latency_ms: float
    std_ms: float
    low_ms: float
    high_ms: float
    kernel_sum_ms: float
    overhead_ms: float
    kernels: pd.DataFrame
    #: ``this``: the predictor's kernels were timed on this machine; ``other``: on others only (the interval is
    #: widened by :data:`OTHER_HOST_LOG_STD`); ``unrecorded``: a predictor that does not say (a fit from a table)
    host: str = "unrecorded"
    #: the nodes XNNPACK leaves to TFLite's own kernels, by TFLite op name
    #: (:func:`leti.device.coverage.xnnpack_fallback_nodes`; ``{}``: it runs the model whole; None: not checked, for a
    #: predictor of another runtime or a model not given as a ``.tflite`` file). Checked, their kernels are marked
    #: (``outside_delegate``) and the overhead prices them where its networks held such kernels
    #: (:data:`~leti.predict.kernels.overhead.OUTSIDE`)
    outside_delegate: dict | None = None

    def to_dict(self) -> dict:
        keep = [c for c in ("kernel_index", "kernel_type", "predicted_as", "predicted_ms", "cold_ms", "stepped_ms",
                            "near_ms", "outside_delegate")
                if c in self.kernels]
        return {"model": self.model, "latency_ms": self.latency_ms, "std_ms": self.std_ms, "low_ms": self.low_ms,
                "high_ms": self.high_ms, "kernel_sum_ms": self.kernel_sum_ms, "overhead_ms": self.overhead_ms,
                "host": self.host, "outside_delegate": self.outside_delegate,
                "kernels": self.kernels[keep].to_dict(orient="records")}


class KernelLatencyPredictor:
    """Kernel regressors + overhead for one (device, runtime, precision)."""

    def __init__(self, regressors: KernelRegressors, overhead: Overhead, device: str, runtime: str,
                 precision: str, rules: FusionRules | None = None, cache: CacheProfile | None = None) -> None:
        self.regressors, self.overhead = regressors, overhead
        self.device, self.runtime, self.precision = device, runtime, precision
        #: how this runtime groups a model's ops into kernels (what :func:`split_model` uses)
        self.rules = rules if rules is not None else rules_for(runtime)
        #: what one-pixel kernels' weights cost in a model that evicts them (measured by the build; None: nothing)
        self.cache = cache
        self.source = ""
        #: the machines its kernels were timed on (a kernel build's :meth:`~.build_store.BuildStore.hosts`)
        self.hosts: list[dict] = []
        self._warm: tuple[np.ndarray, np.ndarray] | None = None  # warm_ms's grid, predicted at its first use

    @property
    def describes(self) -> str:
        return f"device {self.device!r}, runtime {self.runtime!r}, precision {self.precision!r}"

    @property
    def host(self) -> str:
        """``this``, ``other`` or ``unrecorded``: where this machine stands among :attr:`hosts`."""
        if not self.hosts:
            return "unrecorded"
        from leti.device.host import host_identity

        return "this" if any(h.get("id") == host_identity()["id"] for h in self.hosts) else "other"

    # ---- checks --------------------------------------------------------------------------------
    def check_compatible(self, table: pd.DataFrame, where: str) -> None:
        """Refuse kernels measured on / meant for another device, runtime or precision (blank = any)."""
        for col in ("device", "runtime", "precision"):
            mine = getattr(self, col)
            theirs = sorted({v for v in table[col].astype(str) if v} - {mine}) if col in table else []
            if theirs and mine:
                which = f"the predictor {self.source}" if self.source else "the predictor"
                raise DatasetError(f"{where}: kernels of {col} {', '.join(map(repr, theirs))}, but {which} "
                                   f"describes {self.describes}; fit a predictor for {theirs[0]!r}")

    # ---- prediction ----------------------------------------------------------------------------
    def predict_kernels(self, table: pd.DataFrame, allow_unknown: bool = False,
                        where: str = "kernels") -> pd.DataFrame:
        """The rows plus ``predicted_ms``, ``predicted_log_std`` and ``predicted_as`` (the type used)."""
        from leti.predict.kernels.features import kernel_features

        self.check_compatible(table, where)
        as_types = self.regressors.resolve(table["kernel_type"], kernel_features(table), allow_unknown, where)
        ms, log_std = self.regressors.predict(table, as_types)
        return table.assign(predicted_ms=ms, predicted_log_std=log_std, predicted_as=as_types)

    def in_model(self, rows: pd.DataFrame) -> pd.DataFrame:
        """Predicted kernel rows as parts of their models: ``predicted_ms`` plus ``cold_ms``, what the device's
        cache profile says a kernel pays for weights its model has pushed out of the cache
        (:meth:`~leti.predict.kernels.cache.CacheProfile.in_model_ms`), plus ``stepped_ms``, what a kernel LETI's
        engine runs outside its native program costs between two programs (:func:`~.resident.stepped_ms`; 0 on
        other runtimes), plus ``near_ms``, what its weights that the core's cache held alone cost from the next level
        (:meth:`~leti.predict.kernels.cache.CacheProfile.near_in_model_ms`; 0 for a profile without it)."""
        step = stepped_ms(rows)
        if self.cache is None and not step.any():
            return rows
        ms = rows["predicted_ms"].to_numpy(np.float64)
        cold, near = ((np.zeros(len(rows)), np.zeros(len(rows))) if self.cache is None
                      else self.cache.in_model_costs(rows, ms, self.warm_ms))
        return rows.assign(predicted_ms=ms + cold + step + near, cold_ms=cold, stepped_ms=step, near_ms=near)

    def warm_ms(self, weights_mb: np.ndarray) -> np.ndarray:
        """What reading ``weights_mb`` MB of weights from the cache takes: this predictor's one-pixel fully connected
        kernel of 1,024 inputs and that many weights alone (:data:`WARM_GRID_MB`, interpolated in log size; 0 for a
        predictor without dense kernels)."""
        if self._warm is None:
            from leti.predict.kernels.schema import normalize

            outputs = np.maximum(np.round(np.asarray(WARM_GRID_MB) * 1e6 / 4 / 1024), 1).astype(np.int64)
            grid = normalize(pd.DataFrame({
                "model": "warm", "kernel_index": np.arange(len(outputs)), "kernel_type": "dense", "input_h": 1,
                "input_w": 1, "input_c": 1024, "output_h": 1, "output_w": 1, "output_c": outputs, "kernel_h": 1,
                "kernel_w": 1, "stride": 1, "groups": 1, "n_inputs": 1, "fused": "", "device": self.device,
                "runtime": self.runtime, "precision": self.precision}), "warm grid")
            try:
                ms = self.predict_kernels(grid, where="the warm grid").predicted_ms.to_numpy(np.float64)
            except DatasetError:  # no dense regressor: nothing known about reading weights warm
                ms = np.zeros(len(grid))
            self._warm = (np.log(grid["bytes_weights"].to_numpy(np.float64) / 1e6), ms)
        x, y = self._warm
        return np.interp(np.log(np.maximum(np.asarray(weights_mb, np.float64), 1e-6)), x, y, left=0.0)

    def predict_models(self, table: pd.DataFrame, allow_unknown: bool = False,
                       where: str = "kernels") -> list[ModelLatency]:
        """One :class:`ModelLatency` per model of the table (in order of appearance)."""
        return self.models_of(self.predict_kernels(table, allow_unknown, where))

    def models_of(self, predicted: pd.DataFrame) -> list[ModelLatency]:
        """:meth:`predict_models` of rows :meth:`predict_kernels` predicted."""
        rows = self.in_model(predicted)
        agg = model_aggregates(rows, rows["predicted_ms"].to_numpy(), self.overhead.cache_sizes())
        e2e = self.overhead.predict(agg)
        host = self.host
        elsewhere = OTHER_HOST_LOG_STD if host == "other" else 0.0
        out = []
        for (name, a), mean in zip(agg.iterrows(), e2e):
            k = rows[rows.model == name]
            # kernels' spreads taken as fully correlated (a device-wide bias moves them together)
            k_rel = float((k.predicted_ms * k.predicted_log_std).sum() / max(a.sum_ms, 1e-12))
            sigma = float(np.sqrt(self.overhead.resid_std ** 2 + k_rel ** 2 + elsewhere ** 2))
            mean = float(mean)
            out.append(ModelLatency(str(name), mean, mean * sigma, mean * float(np.exp(-Z90 * sigma)),
                                    mean * float(np.exp(Z90 * sigma)), float(a.sum_ms), mean - float(a.sum_ms),
                                    k.reset_index(drop=True), host))
        return out

    # ---- persistence ---------------------------------------------------------------------------
    def save(self, folder: str | Path) -> Path:
        from leti import __version__

        from leti.predict.manifest import prepare_folder

        folder = prepare_folder(folder)
        self.regressors.save_files(folder)
        manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "leti_version": __version__,
                    "device": self.device, "runtime": self.runtime, "precision": self.precision,
                    "kernels": self.regressors.state(), "fusion_rules": self.rules.to_dict(),
                    "overhead": {"terms": list(self.overhead.terms), "coef": self.overhead.coef,
                                 "resid_std": self.overhead.resid_std, "n_models": self.overhead.n_models}}
        if self.overhead.cache_mb:
            manifest["overhead"]["cache_mb"] = self.overhead.cache_mb
        if self.cache is not None:
            manifest["cache"] = self.cache.to_dict()
        if self.hosts:
            manifest["hosts"] = self.hosts
        from leti.predict.manifest import write_manifest

        return write_manifest(folder, manifest)


def is_kernel_predictor(folder: str | Path) -> bool:
    mf = Path(folder) / MANIFEST
    try:
        return mf.is_file() and json.loads(mf.read_text()).get("format") == FORMAT
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return False


def load_kernel_predictor(folder: str | Path) -> KernelLatencyPredictor:
    from leti.predict.manifest import read_manifest

    folder = Path(folder)
    if is_kernel_predictor(folder) or not (folder / MANIFEST).is_file():
        m = read_manifest(folder, FORMAT, FORMAT_VERSION)
    else:
        raise CorruptModelError(f"{folder} is not a kernel-level predictor (fit one with leti fit --kernels)")
    try:
        from leti.predict.kernels.blend import regressors_from_state

        reg = regressors_from_state(m["kernels"], folder)
        o = m["overhead"]
        overhead = Overhead(list(o["terms"]), list(o["coef"]), float(o["resid_std"]), int(o["n_models"]),
                            float(o.get("cache_mb", 0.0)))
        rules = FusionRules.from_dict(m["fusion_rules"]) if "fusion_rules" in m else None
        cache = CacheProfile.from_dict(m["cache"]) if m.get("cache") else None
        pred = KernelLatencyPredictor(reg, overhead, m["device"], m["runtime"], m["precision"], rules, cache)
    except LetiError:
        raise
    except Exception as exc:  # a damaged native file, a missing key
        raise CorruptModelError(f"{folder}: cannot load the kernel predictor: {type(exc).__name__}: {exc}") from None
    pred.source = str(folder)
    pred.hosts = [dict(h) for h in m.get("hosts", []) if isinstance(h, dict)]
    return pred


def table_identity(table: pd.DataFrame, where: str) -> dict[str, str]:
    """The one device, runtime and precision of a measured kernel table (latencies checked), or a
    :class:`DatasetError` when it holds several."""
    check_latency(table, where)
    ident = {}
    for col in ("device", "runtime", "precision"):
        vals = sorted(set(table[col].astype(str)))
        if len(vals) > 1:
            hint = " (choose one with --device)" if col == "device" else ""
            raise DatasetError(f"{where}: kernels of several {col}s ({', '.join(vals)}); "
                               f"a predictor describes one{hint}")
        ident[col] = vals[0]
    return ident


def fit_kernel_predictor(table: pd.DataFrame, e2e: pd.DataFrame | None = None, where: str = "kernels",
                         rules: FusionRules | None = None, **params) -> KernelLatencyPredictor:
    """Fit on a kernel table of one device/runtime/precision; ``e2e`` (``model, latency_ms``) fits the
    overhead on the models it shares with the table (else latency = sum of kernels)."""
    ident = table_identity(table, where)
    reg = KernelRegressors(**params).fit(table)
    overhead = Overhead()
    if e2e is not None:
        e2e = e2e[e2e.device.isin([ident["device"], ""])] if "device" in e2e else e2e
        lat = e2e.groupby("model")["latency_ms"].mean()
        shared = [m for m in pd.unique(table.model) if m in lat.index]
        need = table.kernel_type.nunique() + 4
        if len(shared) < need:
            raise DatasetError(f"{where}: only {len(shared)} models have an end-to-end latency; the overhead of "
                               f"{table.kernel_type.nunique()} kernel types needs at least {need}")
        sub = table[table.model.isin(shared)]
        ms, _ = reg.predict(sub)
        agg = model_aggregates(sub, ms)
        overhead.fit(agg, lat.loc[agg.index].to_numpy())
    return KernelLatencyPredictor(reg, overhead, ident["device"], ident["runtime"], ident["precision"], rules)


def predict_kernels_latency(kernels: pd.DataFrame | list[dict], predictor: KernelLatencyPredictor | str | Path,
                            allow_unknown: bool = False) -> ModelLatency:
    """The latency of ONE model given as its kernel rows (a DataFrame or a list of dicts in LETI's kernel
    schema, or QED's per-op rows): sum of kernel predictions + overhead, with uncertainty and per-kernel
    breakdown. What ``leti.predict_model_latency`` calls once a model file is split into kernels."""
    from leti.predict.kernels.schema import as_kernel_table

    if not isinstance(predictor, KernelLatencyPredictor):
        predictor = load_kernel_predictor(predictor)
    frame = kernels if isinstance(kernels, pd.DataFrame) else pd.DataFrame(list(kernels))
    table = as_kernel_table(frame, "kernels")
    if table.model.nunique() > 1:
        table = table.assign(model=table.model.iloc[0])  # one model by contract: its rows are summed together
    return predictor.predict_models(table, allow_unknown)[0]


def predict_model_latency(model, predictor: KernelLatencyPredictor | str | Path, allow_unknown: bool = False,
                          device: str | None = None, runtime: str | None = None) -> ModelLatency:
    """The latency of any float model on the device ``predictor`` describes: ``model`` is a path
    (``.tflite``, ``.keras``/``.h5``, ``.onnx``, ``.leti``), a Keras model or an engine graph. The model is
    split into the kernels the predictor's runtime runs (its fusion rules), each kernel is predicted and
    the overhead added. ``device``/``runtime``, when given, are what the caller expects the predictor to
    describe: another one is refused, naming both."""
    from leti.predict.kernels.split import delegate_outside, split_model

    if not isinstance(predictor, KernelLatencyPredictor):
        predictor = load_kernel_predictor(predictor)
    for what, want, have in (("device", device, predictor.device), ("runtime", runtime, predictor.runtime)):
        if want and have and want != have:
            raise DatasetError(f"the predictor {predictor.source or ''} describes {what} {have!r}, not {want!r} "
                               f"({predictor.describes}); fit one for {want!r}".replace("  ", " "))
    table = split_model(model, predictor.rules, device=predictor.device)
    rows = predictor.predict_kernels(table, allow_unknown, where=str(table.model.iloc[0]))  # a bad model fails here
    nodes = delegate_outside(model, predictor.runtime)
    if nodes is not None:  # the kernels those nodes run, marked (split again only for a model run in parts)
        marked = split_model(model, predictor.rules, device=predictor.device, outside=nodes) if nodes else None
        rows = rows.assign(outside_delegate=0 if marked is None else marked["outside_delegate"].to_numpy())
    result = predictor.models_of(rows)[0]
    if nodes is not None:
        result.outside_delegate = dict(Counter(n.op for n in nodes))
    return result
