"""The fitting half of a kernel build: measured rows to tables, per-type cross-validation, the final fit.

Why apart from :mod:`.build`: the build loop decides what to measure; this module turns what the store
holds into LETI's kernel table (latency = paired ratio × the build-wide reference latency − the per-invoke
cost), scores the regressors per kernel type by K-fold cross-validation (the error that steers the next
round, and the figure the build reports), and fits the final predictor with its overhead on the
calibration models.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pandas as pd

from leti.errors import LetiError
from leti.models.kernel_models import KernelConfig, expected_row
from leti.predict.kernels.build_store import BuildStore
from leti.predict.kernels.cache import CacheProfile
from leti.predict.kernels.coverage import CLIP, POWER, RealOdds
from leti.predict.kernels.model import KernelLatencyPredictor, fit_kernel_predictor
from leti.predict.kernels.overhead import OUTSIDE, Overhead, fit_on_networks, model_aggregates, outlier_sigmas
from leti.predict.kernels.predictor import KernelRegressors
from leti.predict.kernels.schema import COLUMNS, normalize
from leti.predict.kernels.split import FusionRules

#: fewest kernels of a type for it to be cross-validated
MIN_CV_ROWS = 8
#: how far a kernel's odds of being a real network's kernel (relative to the type's median) move its rank among the
#: worst predicted (:func:`cv_by_type`), either way
IMPORTANCE_CLIP = 30.0
#: the fewest measured kernels per bin :func:`measurement_cost` reads a device's cost from
MIN_COST_ROWS = 20
#: calibration models faster than this are left out of the overhead fit: microseconds of per-invoke and
#: per-kernel cost dominate them, and a fit for relative error weighs each as much as a real network
#: (measured: 40 chains, the six under 0.05 ms off by 1.5-2x, pulled the sum's coefficient to 0.82 and real
#: networks 10% low)
MIN_CALIBRATION_MS = 0.5
#: calibration networks from which the overhead is fitted on them and not on the chains. Why networks win:
#: chains of a few random kernels put each kernel in another setting than a network does (measured on the
#: zoo's dev split: chains scale the sum of kernels by 0.98, real networks want 1.03, and per type from 0.6
#: for grouped convolutions to 1.1 for convolutions)
MIN_NETWORKS = 20
#: calibration networks with more weights (MB) than this are left out of the overhead fit. Why: the random networks
#: reach 350 MB of weights, which stream from memory whatever the kernels around them do, and their errors run both
#: ways by 20-38 % (LETI's engine on a Zen 5 with a 32 MB L3, session 23: leave-one-out spread 0.103 with them, 0.070
#: without); fitted on all 120 the engine zoo's Acc@10 was 83.2 %, on the 98 under 32 MB 88.0 %. That was with
#: terms priced per MB (``evicted_mb@C``), which the networks of 32-350 MB pulled both ways. Raised from 32 to 128 MB
#: in session 36: the ``sum_logw`` term (a share of the kernels' work per log MB) does not run away with them, and
#: the networks of 32-128 MB are what teaches it its slope where the zoo's large models are (ResNet variants of 88 MB,
#: ResNet50's 100). On the Zen 5's fresh store the zoo's dev split went 73.8 / 63.6 / 88.8 % → 83.8 / 72.7 / 88.8 %
#: (three campaigns; 48 and 64 MB: 82.5 / 72.7 / 88.8; all 60 networks 77.5 / 68.8 / 90.0), and the Zen 3 store,
#: which keeps ``evicted_mb@16``, stayed at 98.8 %. Only networks streaming hundreds of MB stay out.
MAX_NETWORK_WEIGHTS_MB = 128.0

#: random whole networks a build times for the overhead (``--networks``' default), by runtime where it measured another.
#: TFLite + XNNPACK: 120. Why: with 60 one network decided the overhead's weight term (session 59: net-037, 78 MB at
#: 1.28× its kernels' sum, 3.7 robust deviations in one fresh build, kept, and 4.1 in the next, left out: 98.8 against
#: 100 % Acc@10 on their zoo campaigns). With 60 more timed beside those two stores (~3 minutes) both left it out, their
#: networks' leave-one-out spread fell (0.052 → 0.038, 0.038 → 0.031), the first store went 98.8 → 100 % on its own
#: campaign (worst of seven 97.6 → 99.6 %), the second 100 → 99.6 % (worst 99.2 → 98.4 %): docs/any_model.md, session 60
NETWORKS = 60
NETWORKS_BY_RUNTIME = {"tflite-xnnpack": 120}


def default_networks(runtime: str) -> int:
    """How many random whole networks a build on ``runtime`` times unless told (:data:`NETWORKS_BY_RUNTIME`)."""
    return NETWORKS_BY_RUNTIME.get(runtime, NETWORKS)


#: the least share of its raw (paired) time a kernel keeps once the per-invoke cost is taken off. Why this low: a
#: kernel under ~2 µs (an add over 8×8×32, a 10-class dense layer) times barely above the near-empty probe, and a
#: floor at half the raw time (session 8 to 12) booked such a kernel at ~1 µs when it costs 0.1-0.5 µs. Measured on
#: the local CPU: every kernel of six small NB101 networks (zoo dev split) timed alone summed to 0.96-1.03× the
#: networks' latency, while the kernel predictor, fitted on floored kernels, put them 14-28 % high.
MIN_KERNEL_SHARE = 0.05


def reference_ms(store: BuildStore) -> float:
    """The build-wide reference latency: the median of the reference's per-experiment means."""
    refs = [r[0] for r in store.db.execute("SELECT ref_ms FROM items WHERE status='ok' AND ref_ms > 0")]
    return float(np.median(refs)) if refs else float("nan")


#: kernels touching at most this many bytes (inputs, outputs and weights) cost one invoke and next to no work: the
#: per-invoke cost cannot exceed their median paired time (:func:`invoke_ms`)
TINY_BYTES = 1024
#: ... when at least this many of them were timed
MIN_TINY = 20


def invoke_ms(store: BuildStore, ref: float, items: pd.DataFrame | None = None) -> float:
    """The per-invoke cost (0 before the probe is measured): the near-empty probe model's median ratio in ms, but no
    more than the median time of the kernels touching at most :data:`TINY_BYTES` (when :data:`MIN_TINY` were timed;
    ``items``: the store's measured kernels when the caller already read them).
    Why the bound: three probes timed once can all land in a noisy minute, and every kernel's time is booked less
    this cost, so a probe 0.3 µs high takes 0.3 µs off each kernel: session 56's fresh TFLite store timed its probes
    at 1.28 / 1.10 / 0.86 % of the reference (1.56 µs), where its 119 kernels of at most 1 KB took a median 1.26 µs
    (in eight other stores those sat 0.02-0.06 µs above the probe, as a kernel's own work says), and its
    sub-millisecond NB101 networks of ~100 kernels were predicted 18-24 % low (zoo Acc@10 95.6 %)."""
    ratios = [r[0] for r in store.db.execute("SELECT ratio FROM items WHERE kind='probe' AND status='ok'")]
    if not ratios:
        return 0.0
    probe = float(np.median(ratios)) * ref
    items = store.measured("kernel") if items is None else items
    if items.empty:
        return probe
    sizes = pd.DataFrame([k[0] for k in items["kernels"]]).reindex(columns=["bytes_in", "bytes_out", "bytes_weights"])
    touched = sizes.bytes_in + sizes.bytes_out + sizes.bytes_weights.fillna(0.0)  # NaN (not tiny) without the sizes
    tiny = items["ratio"].to_numpy(np.float64)[(touched <= TINY_BYTES).to_numpy()]
    return min(probe, float(np.median(tiny)) * ref) if len(tiny) >= MIN_TINY else probe


def kernel_ms(ratio, ref: float, empty: float) -> np.ndarray:
    """A kernel's latency from its paired ``ratio``: ratio × the build's reference latency ``ref`` less the
    per-invoke cost ``empty``, kept at :data:`MIN_KERNEL_SHARE` of the raw time at least."""
    raw = np.asarray(ratio, np.float64) * ref
    return np.maximum(raw - empty, MIN_KERNEL_SHARE * raw)


def kernel_table(store: BuildStore, runtime: str) -> pd.DataFrame:
    """Every measured kernel as a row of LETI's kernel table (plus ``origin``, ``round``, ``ratio``,
    ``ratio_std``, ``config``)."""
    items = store.measured("kernel")
    if items.empty:
        return pd.DataFrame(columns=list(COLUMNS))
    ref = reference_ms(store)
    empty = invoke_ms(store, ref, items)
    rows = pd.DataFrame([k[0] for k in items["kernels"]])
    rows["model"] = items["name"].to_numpy()
    rows["kernel_index"] = 0
    rows["latency_ms"] = kernel_ms(items["ratio"].to_numpy(np.float64), ref, empty)
    rows["runtime"], rows["precision"] = runtime, "float"
    for col in ("origin", "round", "ratio", "ratio_std"):
        rows[col] = items[col].to_numpy()
    rows["config"] = [json.dumps(c, sort_keys=True) for c in items["config"]]
    table = normalize(rows, "kernel build")
    return table[np.isfinite(table.latency_ms) & (table.latency_ms > 0)].reset_index(drop=True)


def calibration_tables(store: BuildStore, runtime: str, kind: str = "calibration") -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the calibration models' kernel rows, their ``model, latency_ms, n_kernels, device`` table); ``kind``
    ``network``: the calibration networks'."""
    items = store.measured(kind)
    if items.empty:
        return pd.DataFrame(), pd.DataFrame({"model": [], "latency_ms": [], "n_kernels": [], "device": []})
    ref = reference_ms(store)
    kernels = pd.DataFrame([dict(k, model=name) for name, ks in zip(items["name"], items["kernels"]) for k in ks])
    kernels["runtime"], kernels["precision"] = runtime, "float"
    lat = pd.DataFrame({"model": items["name"], "latency_ms": items["ratio"].to_numpy(np.float64) * ref,
                        "n_kernels": [len(k) for k in items["kernels"]],
                        "device": [k[0]["device"] for k in items["kernels"]]})
    return normalize(kernels, "calibration kernels"), lat


def _folds(types: np.ndarray, k: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    fold = np.zeros(len(types), np.int64)
    for t in set(types):
        idx = np.flatnonzero(types == t)
        fold[idx] = rng.permutation(len(idx)) % k
    return fold


def cv_by_type(table: pd.DataFrame, params: dict, seed: int = 0, folds: int = 3):
    """Per-type K-fold CV of the regressors: ({type: n, mape, acc10, wmape (latency-weighted), err (latency- and,
    with coverage, closeness-weighted mean |log ratio|, what steers the next round)}, {type: the configs predicted
    worst}, regressors fitted on every row, the table's :class:`~.coverage.RealOdds` (None without coverage)).

    With coverage the worst are ranked by their error times their odds of being a real network's kernel
    (:data:`IMPORTANCE_CLIP`): an importance-weighted share of the error real networks would see. Why: ranked by
    error alone, the adaptive rounds of session 50's Zen 4 build drew again and again around 1-2 channel
    convolutions with 5-20 MB outputs (noisy to time, so always "worst"): 1,653 of its 2,713 conv2d kernels;
    refitting its store without them took the zoo from 95.6 to 96.4 % Acc@10 (docs/any_model.md)."""
    types = table.kernel_type.astype(str).to_numpy()
    counts = pd.Series(types).value_counts()
    cv_types = set(counts[counts >= MIN_CV_ROWS].index)
    sub = np.isin(types, list(cv_types))
    pred = np.full(len(table), np.nan)
    fold = _folds(types, folds, seed)
    odds = RealOdds(table, seed=seed) if params.get("coverage") else None  # once: ~7 s for 4,600 kernels
    weight = odds.weights() if odds is not None else None
    for f in range(folds):
        train, test = sub & (fold != f), sub & (fold == f)
        if test.any():
            reg = KernelRegressors(**params, random_state=seed).fit(table[train],
                                                                    None if weight is None else weight[train])
            pred[test] = reg.predict(table[test])[0]
    y = table.latency_ms.to_numpy(np.float64)
    rel = np.abs(pred / y - 1)
    logerr = np.abs(np.log(pred / y))
    close = np.ones(len(table)) if weight is None else weight
    importance = (np.ones(len(table)) if odds is None
                  else np.clip(odds.table_relative(), 1 / IMPORTANCE_CLIP, IMPORTANCE_CLIP))
    cv, worst = {}, {}
    for t in sorted(set(types)):
        m = types == t
        if t not in cv_types:
            cv[t] = {"n": int(m.sum()), "mape": float("nan"), "acc10": float("nan"), "wmape": float("nan"), "err": 1.0}
            continue
        w = y[m] / y[m].sum()  # a kernel weighs as much as its latency: a model's time is in its big kernels
        wc = y[m] * close[m] / np.sum(y[m] * close[m])  # ... and as much as the fit weighs it
        cv[t] = {"n": int(m.sum()), "mape": float(np.mean(rel[m]) * 100), "acc10": float(np.mean(rel[m] <= 0.1) * 100),
                 "wmape": float(np.sum(w * rel[m]) * 100), "err": float(np.sum(wc * np.minimum(logerr[m], 3.0)))}
        idx = np.flatnonzero(m)
        score = logerr[idx] * np.sqrt(y[idx]) * importance[idx]  # wrong, not tiny, and where real kernels are
        bad = idx[np.argsort(-score)][: max(2, len(idx) // 5)]
        worst[t] = [KernelConfig.from_dict(json.loads(table.config.iloc[i])) for i in bad]
    return cv, worst, KernelRegressors(**params, random_state=seed).fit(table, weight), odds


def predicted_log_std(regressors: KernelRegressors, configs: list[KernelConfig]) -> np.ndarray:
    """The regressors' uncertainty (members' spread of log latency) for configurations not yet built."""
    rows = normalize(pd.DataFrame([expected_row(c) for c in configs]), "candidates")
    return regressors.predict(rows)[1]


@dataclass(frozen=True)
class MeasurementCost:
    """What measuring one more kernel takes on a build's device: seconds (conversion and timing) by kernel ms, the
    medians of the store's measured kernels in bins of ms, interpolated in log ms; past the longest bin, in
    proportion. The protocol's run count falls with a kernel's length (150 runs under 0.1 ms, ~25 over 3 ms), so the
    cost is no straight line: ~0.1 s up to 0.1 ms, 0.4 s at 2 ms, 11 s at 60 ms (session 51, a Zen 4)."""

    ms: tuple[float, ...] = (0.02, 2.0, 60.0)
    seconds: tuple[float, ...] = (0.1, 0.4, 11.0)

    def __call__(self, ms: np.ndarray) -> np.ndarray:
        ms = np.maximum(np.asarray(ms, np.float64), 1e-6)
        x, y = np.log(self.ms), np.asarray(self.seconds)
        out = np.interp(np.log(ms), x, y)
        past = ms > self.ms[-1]
        out[past] = y[-1] * ms[past] / self.ms[-1]
        return np.maximum(out, 1e-3)


def measurement_cost(store: BuildStore, bins: int = 10) -> MeasurementCost:
    """The store's :class:`MeasurementCost` (the defaults until it has :data:`MIN_COST_ROWS` kernels a bin)."""
    ms, sec = store.kernel_costs()
    if len(ms) < bins * MIN_COST_ROWS:
        return MeasurementCost()
    parts = np.array_split(np.arange(len(ms)), bins)
    return MeasurementCost(tuple(float(np.median(ms[p])) for p in parts), tuple(float(np.median(sec[p])) for p in parts))


def candidate_scores(regressors: KernelRegressors, configs: list[KernelConfig], odds: RealOdds | None,
                     cost: MeasurementCost | None = None) -> np.ndarray:
    """How much measuring each candidate is worth: its predicted uncertainty times the weight the fit would give it
    (:func:`~.coverage.coverage_weights`' tempered, clipped odds; 1 without ``odds``), so a round measures where the
    regressors are unsure *and* real networks' kernels are, and the corners (least sure always) only at a discount;
    with ``cost`` (:func:`measurement_cost`) times √(predicted ms) (the kernel's weight in a model's error, as the worst
    are ranked) per predicted second of measuring it. Why the cost: session 51's build, ranking by the first two alone,
    spent 380 s of a round's 530 on 29 depthwise 7×7 convolutions of 60-175 ms (ConvNeXt's, jittered to 176 pixels)."""
    rows = normalize(pd.DataFrame([expected_row(c) for c in configs]), "candidates")
    ms, spread = regressors.predict(rows)
    value = spread if odds is None else spread * np.clip(odds.relative(rows) ** POWER, 1 / CLIP, CLIP)
    if cost is not None:
        value = value * np.sqrt(np.maximum(ms, 1e-6)) / cost(ms)
    return value


#: the forms of a build's per-model overhead (``leti kernels build --overhead``): ``fit``, fitted on the calibration
#: networks (or chains; :class:`~leti.predict.kernels.overhead.Overhead`); ``sum``, none: a model's latency is the sum of
#: its kernels with what the cache profile says each pays inside a model, and the networks give only its spread. Why
#: ``sum`` (session 32, LETI's engine on a Zen 5, every kernel and network timed again with the reference timed warm):
#: the fitted forms, chosen by their leave-one-out error on the random networks, put the zoo's large models 8-23 % high
#: (an eviction term fitted on networks under 32 MB, extrapolated to ResNet50's 100 MB) and scored 82.5-90.0 % Acc@10
#: on the zoo's dev split, the sum 95.0 %: the random networks are no guide to real ones there
OVERHEAD_FORMS = ("fit", "sum")


def check_overhead(form: str) -> str:
    """``form`` if it is one of :data:`OVERHEAD_FORMS`, else a :class:`LetiError` naming them."""
    if form not in OVERHEAD_FORMS:
        raise LetiError(f"--overhead must be one of {', '.join(OVERHEAD_FORMS)}, got {form!r}")
    return form


def _in_model_aggregates(predictor: KernelLatencyPredictor, kernels: pd.DataFrame, lat: pd.DataFrame,
                         where: str) -> tuple[pd.DataFrame, np.ndarray]:
    """The models of ``lat`` (``model, latency_ms``): their :func:`model_aggregates` of the kernels as parts of their
    models (:meth:`~KernelLatencyPredictor.in_model`) and their measured latencies in the same order."""
    rows = predictor.in_model(predictor.predict_kernels(kernels[kernels.model.isin(lat.model)], allow_unknown=True,
                                                        where=where))
    agg = model_aggregates(rows, rows["predicted_ms"].to_numpy())
    return agg, lat.set_index("model").latency_ms.loc[agg.index].to_numpy()


def sum_overhead(agg: pd.DataFrame, e2e_ms: np.ndarray) -> Overhead:
    """The identity overhead (latency = the kernels' sum, ``agg`` from :func:`model_aggregates`) with the spread of its
    log error on the models timed end to end (``e2e_ms``) as its uncertainty."""
    resid = np.log(np.asarray(e2e_ms, np.float64) / np.maximum(agg["sum_ms"].to_numpy(np.float64), 1e-9))
    return Overhead(resid_std=float(np.sqrt(np.mean(np.square(resid)))) if len(resid) else 0.0, n_models=len(resid))


def fit_final(table: pd.DataFrame, cal_kernels: pd.DataFrame, cal: pd.DataFrame, rules: FusionRules,
              net_kernels: pd.DataFrame | None = None, nets: pd.DataFrame | None = None,
              cache: CacheProfile | None = None, coverage: bool = True,
              overhead: str = "fit", delegate_price: float | None = None) -> tuple[KernelLatencyPredictor, list[str]]:
    """The predictor on every kernel (KernelRegressors' default settings; with ``coverage`` each kernel weighed by its
    closeness to real networks' kernels: :mod:`.coverage`), its overhead fitted on the
    calibration networks when there are :data:`MIN_NETWORKS` of them (per-type scales among the options),
    else on the calibration chains (per-type kernel counts among the terms only with enough models), or, with
    ``overhead="sum"`` (:data:`OVERHEAD_FORMS`), none; ``cache``: the device's cache profile, whose one-pixel kernels'
    cost in a model comes before the overhead; ``delegate_price``: the measured ms of a kernel the delegate leaves out
    (:mod:`.partition`), the networks' overhead's ``outside_delegate`` coefficient."""
    check_overhead(overhead)
    notes: list[str] = []
    predictor = fit_kernel_predictor(table[[c for c in COLUMNS if c in table]], rules=rules, coverage=coverage)
    predictor.cache = cache
    if overhead == "sum":
        models, lat = (net_kernels, nets) if nets is not None and len(nets) else (cal_kernels, cal)
        if len(lat):
            predictor.overhead = sum_overhead(*_in_model_aggregates(predictor, models, lat, "calibration models"))
        notes.append(f"no overhead (--overhead sum): latency = the kernels' sum; its log RMS on the {len(lat)} "
                     f"calibration models {predictor.overhead.resid_std:.3f}")
        return predictor, notes
    fixed = {OUTSIDE: float(delegate_price)} if delegate_price is not None else None
    weights = (net_kernels.groupby("model").bytes_weights.sum() / 1e6 if nets is not None and len(nets)
               else pd.Series(dtype=float))
    kept = nets[nets.model.map(weights).fillna(0.0).to_numpy() <= MAX_NETWORK_WEIGHTS_MB] if nets is not None else None
    if kept is not None and len(kept) >= MIN_NETWORKS:
        agg, lat = _in_model_aggregates(predictor, net_kernels, kept, "calibration networks")
        agg = agg[[c for c in agg.columns if not c.startswith("n:")]]
        sigmas = outlier_sigmas(predictor.runtime)
        predictor.overhead, odd = fit_on_networks(agg, lat, sigmas, fixed)
        left = f", {len(nets) - len(kept)} over {MAX_NETWORK_WEIGHTS_MB:g} MB of weights left out" \
            if len(kept) < len(nets) else ""
        left += (f", {len(odd)} left out as outliers ({', '.join(odd)}: measured against their kernels' sum over "
                 f"{sigmas:g} robust deviations off the others')") if odd else ""
        notes.append(f"overhead fitted on {len(kept) - len(odd)} calibration networks{left}: "
                     f"{' + '.join(predictor.overhead.terms)} (leave-one-out log RMS {predictor.overhead.resid_std:.3f})")
        return predictor, notes
    if nets is not None and len(nets):
        notes.append(f"only {len(kept)} calibration networks of at most {MAX_NETWORK_WEIGHTS_MB:g} MB of weights (the "
                     f"overhead takes them from {MIN_NETWORKS}): fitted on the chains")
    small = cal.latency_ms < MIN_CALIBRATION_MS
    if small.any():
        notes.append(f"{int(small.sum())} of {len(cal)} calibration models under {MIN_CALIBRATION_MS} ms left out of "
                     "the overhead fit")
        cal = cal[~small]
        cal_kernels = cal_kernels[cal_kernels.model.isin(cal.model)]
    if len(cal) < 5:
        notes.append(f"only {len(cal)} calibration models: latency = sum of kernels"
                     + (" plus the measured delegate price" if fixed else " (no overhead term)"))
        if fixed:  # what was measured stays: the sum plus the price of each kernel the delegate leaves out
            predictor.overhead = Overhead(["sum_ms", *fixed], [1.0, *fixed.values()])
        return predictor, notes
    agg, lat = _in_model_aggregates(predictor, cal_kernels, cal, "calibration models")
    n_terms = 4 + sum(c.startswith("n:") for c in agg.columns)  # sum, one, MB out, a cache term
    if len(cal) < 2 * n_terms:
        agg = agg[[c for c in agg.columns if not c.startswith("n:")]]
        notes.append(f"{len(cal)} calibration models: overhead = a·sum + c + d·MB out [+ a cache term] (no per-type counts)")
    predictor.overhead = Overhead().fit(agg, lat, fixed=fixed)
    return predictor, notes
