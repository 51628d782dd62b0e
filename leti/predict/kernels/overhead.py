"""The per-model overhead: what a model costs beyond the sum of its kernels' predictions, learnt from models timed end to end.

Why an overhead term: a model's measured end-to-end latency is not the sum of its listed kernels. On
phone GPUs it is 1.1-1.8x the sum (launch and synchronisation gaps, ops the profiler does not list such as
unfused adds and activations, tensor copies in and out of the delegate). :class:`Overhead` learns it from
models whose end-to-end latency was measured, as an additive model with non-negative coefficients::

    e2e ms = a * (sum of predicted kernel ms) + c0 + Σ_type c_type * (kernels of that type) + d * (MB written)
             [+ w * (MB of weights) | + s * (MB of weights per output pixel)]

fitted for relative error (non-negative least squares on rows divided by the measured latency). On the
QED phones this beat a log-linear fit on the sum and the kernel count by ~10 points of end-to-end Acc@10
(``benchmarks/bench_kernels_qed.py``). The weights terms are the cache: a kernel timed alone, again and again,
finds its weights in the core's cache; in a network they stream in from memory once per inference, which
costs most where a weight is used for few output pixels (a dense layer or a squeeze-excite 1x1 convolution at
batch one: ``stream_mb`` = Σ weights / output pixels). A third form is the cache's size (``evicted_mb@C``, C in
:data:`EVICTION_MB`): a kernel whose weights fit a C MB cache finds them there when timed alone, and loses them in a
network whose weights exceed the cache, so the term is the weights of the kernels under C MB, weighed from 0 at
C/2 MB of model weights to 1 at C (measured on the local CPU's 300 calibration networks: the sum of kernels is
right to ~2 % up to 8 MB of weights, 4-27 % short above 16 MB, ~0.028 ms per MB; kernels over 16 MB already
stream alone). A fourth scales the kernels' sum by ln(1 + MB of weights) (:data:`SCALED`): the loss as a share of
the kernels' work, which does not price a model far past the networks' weights per MB. Which of these (or none)
enters is chosen by the
leave-one-model-out error on the models the overhead is fitted on (:data:`CACHE_TERMS`), and so are the
per-type counts: on the local CPU's 113 calibration chains ``stream_mb`` lowered it from 10.5 % to 9.9 % (RMS
of the log ratio; coefficient ~1/40 ms per MB, DRAM speed), while the 21 per-type counts raised it to 14 %.
Fitted on whole networks (a kernel build's calibration networks, :mod:`leti.models.random_networks`), the
options also include one scale per kernel type, ``Σ_type s_type * (predicted ms of that type)`` in place of
``a * sum``, each pulled towards the common scale (ridge rows; the pull, too, chosen by leave-one-out), kernels
of a type the fit never saw scaled by the common scale (``ms:rest``), and a per-kernel saving (``-k * kernels``:
a kernel timed alone carries costs it does not have inside a network) or cost (``+k * kernels``: LETI's engine
pays a few microseconds of dispatch per step that a kernel timed alone does not show); among those the simplest option within
one standard error of the lowest leave-one-out error is taken. On the local CPU's networks that is
``1.03 * sum + 0.01 ms/MB * weights - 1 µs * kernels`` (the per-type scales fitted the random networks' quirks and
did not carry over to the zoo; ``benchmarks/results/zoo_kernels_local_cpu.md``).
A device whose build measured its cache (:mod:`.cache`, the local CPU and LETI's engine) adds to each kernel with
weights what they cost once the model has pushed them out of the cache, before the overhead is fitted
(:meth:`~leti.predict.kernels.model.KernelLatencyPredictor.in_model`); that cost enters the overhead as a term of its
own (:data:`COLD`), so the networks set its scale.
Its leave-one-model-out log residual spread, with the kernel
regressors' bagging spread, is the model prediction's uncertainty (log-normal; ``low_ms``/``high_ms`` bound
90%). Without end-to-end latencies the overhead is the identity (latency = sum) and only the kernels'
spread is claimed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd


def model_aggregates(table: pd.DataFrame, kernel_ms: np.ndarray, cache_mb: tuple[float, ...] = ()) -> pd.DataFrame:
    """Per model: the sum of kernel ms (``sum_ms``), MB of activations written (``bytes_out_mb``), MB of
    weights (``weights_mb``), MB of weights per output pixel (``stream_mb``), the weights a C MB cache lost
    (``evicted_mb@C`` for C in :data:`EVICTION_MB` and ``cache_mb``), the number of kernels of each
    type (``n:<type>``) and their predicted ms (``ms:<type>``)."""
    # every sum by np.bincount over model (and model × type) codes: pandas' grouping, crosstab and pivot_table took
    # ~15 ms for a single model, on every prediction
    m, models = pd.factorize(table["model"], sort=False)  # models in order of appearance
    types, k = np.unique(table["kernel_type"].astype(str).to_numpy(), return_inverse=True)
    n = len(models)
    ms = np.asarray(kernel_ms, np.float64)
    total = lambda w: np.bincount(m, weights=w, minlength=n)  # noqa: E731
    cols = {"sum_ms": total(ms), "bytes_out_mb": total(table["bytes_out"].to_numpy(np.float64)) / 1e6,
            "kernels": total(None).astype(np.float64)}
    if COLD in table:  # the cache profile's part of each kernel's ms (:meth:`.cache.CacheProfile.in_model_ms`)
        cold = table[COLD].to_numpy(np.float64)
        cols[COLD] = total(cold)
    if OUTSIDE in table:  # kernels the delegate leaves to TFLite's own (rows of models not checked: none)
        cols[OUTSIDE] = total(pd.to_numeric(table[OUTSIDE], errors="coerce").fillna(0.0).to_numpy(np.float64))
    if "bytes_weights" in table:
        weights = table["bytes_weights"].to_numpy(np.float64)
        pixels = np.maximum(table["output_h"].to_numpy(np.float64) * table["output_w"].to_numpy(np.float64), 1.0)
        cols["weights_mb"], cols["stream_mb"] = total(weights) / 1e6, total(weights / pixels) / 1e6
        cols[SCALED] = cols["sum_ms"] * np.log1p(cols["weights_mb"])
        for c in dict.fromkeys((*EVICTION_MB, *(float(c) for c in cache_mb if c))):  # the weights a C MB cache held for the kernel alone and cannot hold for the model
            held = total(np.where(weights < c * 1e6, weights, 0.0)) / 1e6
            cols[evicted_term(c)] = held * eviction_ramp(cols["weights_mb"], c)
    cell = m * len(types) + k
    count = np.bincount(cell, minlength=n * len(types)).reshape(n, len(types)).astype(np.float64)
    per = np.bincount(cell, weights=ms, minlength=n * len(types)).reshape(n, len(types))
    cols.update({f"n:{t}": count[:, j] for j, t in enumerate(types)})
    cols.update({f"ms:{t}": per[:, j] for j, t in enumerate(types)})
    if COLD in table:
        per_cold = np.bincount(cell, weights=cold, minlength=n * len(types)).reshape(n, len(types))
        cols.update({f"cold:{t}": per_cold[:, j] for j, t in enumerate(types)})
    return pd.DataFrame(cols, index=pd.Index(models, name="model"))


#: cache sizes (MB) of the eviction term (``evicted_mb@C``); the fit takes at most one, by leave-one-out
EVICTION_MB = (4, 8, 16, 32)


def eviction_ramp(weights_mb: np.ndarray, c: float) -> np.ndarray:
    """The share of a C MB cache's contents a model with ``weights_mb`` MB of weights evicts: 0 up to C/2, 1 from C."""
    return np.clip((np.asarray(weights_mb, np.float64) - c / 2) / (c / 2), 0.0, 1.0)


#: the eviction term's name before its cache size
EVICTED = "evicted_mb@"


def evicted_term(c: float) -> str:
    return f"{EVICTED}{c:g}"


#: cache terms the overhead may take (one or both): MB of weights, MB of weights per output pixel
CACHE_TERMS = ("weights_mb", "stream_mb")
#: the kernels' sum scaled by ln(1 + MB of the model's weights): the share of its kernels' time a model loses to
#: weights that come from a farther cache than when each kernel is timed alone, growing with the weights that compete
#: for the caches. Why scaled and not per MB: the loss is a share of each kernel's work, not a fixed cost per MB. On
#: session 34's Zen 5 build (TFLite) the random networks and the zoo agree on it (the networks under 32 MB: 1.03x
#: their sum under 8 MB of weights, 1.15x at 16-32 MB; the zoo 0.97 / 1.06 / 1.10 / 1.18 at < 8 / 8-16 / 16-32 /
#: > 48 MB), where the MB terms fitted there (``evicted_mb@32`` at 0.088 ms per MB) put DenseNet-121 (32 MB) +36 %
#: and ResNet50 +59 % over; the log keeps a model far past the networks' weights from being priced as one of them
#: times its MB (``docs/any_model.md``, session 35)
SCALED = "sum_logw"
#: relative drop of the leave-one-out spread a cache term must bring to enter
CACHE_GAIN = 0.01
#: leave-one-out spreads closer than this (log ratio) are a tie: an exact fit scores ~1e-16, and which of two
#: exact options scores lower is rounding, not evidence
LOO_TIE = 1e-9
#: the term of the kernels whose type has no scale of its own (its scale: the common one)
REST = "ms:rest"
#: minus the number of kernels: what a kernel timed alone costs beyond its share in a network (its slice of
#: the invoke, below what the near-empty probe subtracts); measured on small calibration networks
SAVED = "saved_per_kernel"
#: the number of kernels: what each kernel costs inside a network beyond its time alone (LETI's engine
#: dispatches every step from Python: a few microseconds each that a kernel timed alone does not show)
ADDED = "kernels"
#: the cache profile's cost of the weights a model evicted (the kernels' ``cold_ms``), a term of its own wherever a
#: model has one: the profile times a one-kernel model after a flush, and how much of that excess a kernel pays inside
#: a network the networks tell. Why (session 26, LETI's engine on a Zen 5): with the cost inside the kernels' sum the
#: networks over 32 MB of weights were over-predicted by 7-45 % where the profile put their cost at 0.3-1.6× the
#: kernels alone; fitted apart, the 98 networks under 32 MB take 0.52× the profile's cost, all 120 0.49×, and the
#: engine zoo's dev split went 93.8 → 97.5 % Acc@10 (ResNet50 at 64 pixels +17 → +4.5 %)
COLD = "cold_ms"
#: the kernels a delegate leaves to TFLite's own kernels (:func:`~leti.predict.kernels.split.split_graph`'s
#: ``outside_delegate``), a term of every option wherever the models fitted on have such kernels. Why: each splits
#: the delegate's graph into one more partition, and neither the switch between partitions nor TFLite's kernel is
#: what the kernel timed alone shows. Session 57, the local CPU's zoo: the 11 of 250 models with such kernels
#: (NB101's uneven channel splits, ``SPLIT_V``, 3-12 a model; NASNet-Mobile's 1×1 stride-2 average pools and
#: 6-input concatenations, 20) were all predicted low (NB101 37-78 µs short, 4-6 µs a kernel; NASNet 0.39-0.66 ms),
#: Acc@10 73-82 % where the 239 others scored 99.6 %; the build's random networks (:mod:`leti.models.random_networks`)
#: hold such kernels so the networks set the price
OUTSIDE = "outside_delegate"
#: weights pulling per-type scales towards the common scale (as many models' worth of relative error),
#: strongest (simplest) first, as the one-standard-error rule wants them ordered
PER_TYPE_PULL = (10.0, 1.0, 0.1, 0.01)
#: robust standard deviations (1.4826 × the median absolute deviation) from the median a calibration model's ratio of
#: measured latency to its kernels' sum (:data:`SCREEN`, leave-one-out) may lie before :func:`overhead_outliers` leaves
#: it out of the overhead fit. Why: one network whose kernels the regressors cannot price pulls every other model's
#: overhead. Session 56, the local CPU's store of session 51: net-004 holds depthwise convolutions on 1×1 maps of 480
#: and 1,152 channels that the regressors put at 0.06 and 0.15 ms (nothing like them was timed alone), so its kernels
#: summed to 1.6× its measured 0.23 ms (9.9 robust deviations; the next network 3.8); it alone raised the other 57
#: networks' leave-one-out spread from 0.057 to 0.083 and hid the sub-millisecond networks' per-kernel saving from
#: the one-standard-error rule; left out, the zoo's Acc@10 went 98.4 → 99.2 % on both Zen 4 campaigns. Why six and
#: not fewer: on LETI's engine five sub-millisecond networks sit at 3.4-5.2 deviations together, a cost the fitted
#: per-kernel terms take, not a kernel the regressors misprice
OUTLIER_SIGMAS = 6.0
#: :data:`OUTLIER_SIGMAS` where a runtime's networks want another. TFLite + XNNPACK: 4. Why: its networks carry no
#: per-step cost that sets the sub-millisecond ones apart, and a fresh build's networks held two its kernels misprice
#: that six deviations kept in (session 58, the local CPU's store ``kernels_local_cpu_zen4f``: net-042, a 0.52 ms
#: network whose kernels' sum overshoots by 0.12 ms, +23 %, at 4.5 deviations, and net-037, a 78 MB weight-streaming
#: one): they raised the networks' leave-one-out log RMS from 0.032 to 0.055 and changed the overhead's form (no
#: ``sum_logw``, 1.67× the cache profile's cost where the others give 0.82×). Left out, the zoo went 98.8 / 98.4 / 98.4 /
#: 97.5 / 97.6 → 98.8 / 99.2 / 99.6 / 98.8 / 99.6 % Acc@10 on the zen4f / zen4e / zen4d / zen4b / zen4 campaigns (dev
#: split 98.8 / 97.5 / 98.7 / 97.4 / 97.5 → 98.8 / 98.8 / 98.7 / 97.4 / 98.7 %); session 57's store is the same at 4
#: and 6 (net-004 alone out)
OUTLIER_SIGMAS_BY_RUNTIME = {"tflite-xnnpack": 4.0}


def outlier_sigmas(runtime: str) -> float:
    """The robust deviations beyond which :func:`overhead_outliers` leaves a network of ``runtime`` out."""
    return OUTLIER_SIGMAS_BY_RUNTIME.get(runtime, OUTLIER_SIGMAS)
#: the overhead :func:`overhead_outliers` judges models by: the kernels' sum times one common scale
SCREEN = ("sum_ms",)


def overhead_outliers(agg: pd.DataFrame, e2e_ms: np.ndarray, sigmas: float = OUTLIER_SIGMAS) -> np.ndarray:
    """Which models (rows of ``agg``, from :func:`model_aggregates`) an overhead fit should leave out, one at a time:
    the model whose leave-one-out log ratio under :data:`SCREEN` lies farthest from the median, while that is more than
    ``sigmas`` robust standard deviations (:func:`outlier_sigmas`), the rest refitted without it each time (an outlier left in
    pulls the others' fits, so one far model makes near ones look far); at most a tenth of the models, none with
    fewer than ten."""
    y = np.asarray(e2e_ms, np.float64)
    odd = np.zeros(len(y), bool)
    while len(y) >= 10 and odd.sum() < len(y) // 10:
        keep = np.flatnonzero(~odd)
        r = Overhead._loo_residuals(Overhead._design(agg.iloc[keep], list(SCREEN)), y[keep])
        if r is None:
            break
        dev = np.abs(r - np.median(r))
        sigma = 1.4826 * float(np.median(dev))
        worst = int(np.argmax(dev))
        if dev[worst] <= sigmas * max(sigma, 1e-3):
            break
        odd[keep[worst]] = True
    return odd


def fit_on_networks(agg: pd.DataFrame, e2e_ms: np.ndarray, sigmas: float = OUTLIER_SIGMAS,
                    fixed: dict[str, float] | None = None) -> tuple[Overhead, list[str]]:
    """The overhead of timed whole networks (a build's calibration networks): :meth:`Overhead.fit` with the per-type
    options, the networks :func:`overhead_outliers` finds left out; returns it and their names."""
    y = np.asarray(e2e_ms, np.float64)
    odd = overhead_outliers(agg, y, sigmas)
    return Overhead().fit(agg[~odd], y[~odd], per_type=True, fixed=fixed), [str(m) for m in agg.index[odd]]


@dataclass
class Overhead:
    """``e2e ms = Σ coef_i · term_i`` over ``terms`` (``sum_ms``, ``one``, ``bytes_out_mb``; the ``n:<type>``
    counts and :data:`CACHE_TERMS` where they lower the leave-one-out error), coefficients non-negative;
    the identity (latency = sum of kernels) until fitted. A saved overhead keeps its own terms."""

    terms: list[str] = field(default_factory=list)
    coef: list[float] = field(default_factory=list)
    resid_std: float = 0.0
    n_models: int = 0
    #: the cache (MB) a predicted model has to itself where it differs from what the networks the eviction term was
    #: fitted on had (0: the same): :meth:`predict` ramps that term's weights at this size, with the fitted
    #: coefficient (the cost of a MB from memory; ``leti kernels build --cache-mb``). Why: the local CPU's 60
    #: networks were timed beside another measurement (load 2), which shares the L3 (32 MB on its Zen 3), and chose
    #: C = 16 MB. The zoo timed twice tells the same: on the loaded host (``zoo_local_cpu``) a fit of sum +
    #: evicted@C is best at C = 16 (log RMS 0.043), on the quiet host (``zoo_local_cpu_quiet``) at C = 20-24
    #: (0.041-0.042), and its models of 10-18 MB of weights at small inputs ran 9-21 % slower loaded than quiet (the
    #: median model 2.6 %). With the networks' coefficient and the ramp at 24 MB the quiet zoo's dev split went
    #: 93.8 → 97.5 % Acc@10 (session 26, local CPU; at 20 / 28 / 32 MB 96.2 / 97.5 / 97.5 %, Acc@5 77.5 / 71.2 /
    #: 65.0 % against 75.0 %)
    cache_mb: float = 0.0

    def cache_sizes(self) -> tuple[float, ...]:
        """The extra cache sizes :func:`model_aggregates` must weigh evicted weights at for :meth:`predict`."""
        return (self.cache_mb,) if self.cache_mb and any(t.startswith(EVICTED) for t in self.terms) else ()

    @staticmethod
    def _design(agg: pd.DataFrame, terms: list[str]) -> np.ndarray:
        apart = COLD in terms  # the kernels' time without their cold cost, which has a coefficient of its own

        def col(t: str) -> np.ndarray:
            if t == SCALED:  # the kernels' sum as this design takes it (without the cold cost when apart), scaled
                return col("sum_ms") * np.log1p(agg["weights_mb"].to_numpy(np.float64))
            v = agg[t].to_numpy(np.float64) if t in agg else np.zeros(len(agg))
            if apart and (t == "sum_ms" or (t.startswith("ms:") and t != REST)):
                cold = COLD if t == "sum_ms" else f"cold:{t[3:]}"
                v = v - (agg[cold].to_numpy(np.float64) if cold in agg else 0.0)
            return v

        cols = []
        for t in terms:
            if t == "one":
                cols.append(np.ones(len(agg)))
            elif t == SAVED:  # a non-negative coefficient on minus the kernel count: ms saved per kernel
                cols.append(-col("kernels"))
            elif t == REST:  # kernels of the types without a term of their own (types a fit never saw)
                cols.append(col("sum_ms") - sum((col(u) for u in terms if u.startswith("ms:") and u != REST),
                                                np.zeros(len(agg))))
            else:
                cols.append(col(t))
        return np.column_stack(cols)

    @staticmethod
    def _nnls(a: np.ndarray, y: np.ndarray, prior: tuple | None = None, offset: np.ndarray | None = None) -> np.ndarray:
        """Non-negative least squares of the relative error; ``prior`` ``(mask, target, lam)``: the masked
        coefficients are pulled towards ``target`` with weight ``lam`` (rows appended to the system); ``offset``: each
        model's ms of the terms whose coefficients are fixed (``fit``'s ``fixed``)."""
        from scipy.optimize import nnls

        a, b = a / y[:, None], np.ones(len(y)) if offset is None else 1.0 - offset / y
        if prior is not None:
            mask, target, lam = prior
            pen = np.sqrt(lam) * np.eye(a.shape[1])[np.asarray(mask)]
            a, b = np.vstack([a, pen]), np.concatenate([b, np.full(len(pen), np.sqrt(lam) * target)])
        return nnls(a, b)[0]

    @classmethod
    def _loo_residuals(cls, a: np.ndarray, y: np.ndarray, prior: tuple | None = None,
                       offset: np.ndarray | None = None) -> np.ndarray | None:
        """The leave-one-model-out log ratios (measured / predicted); None with too few models."""
        if len(y) <= (a.shape[1] if prior is None else a.shape[1] - int(np.sum(prior[0]))):
            return None
        off = np.zeros(len(y)) if offset is None else offset
        return np.array([np.log(y[i] / max(float(a[i] @ cls._nnls(np.delete(a, i, 0), np.delete(y, i), prior,
                                                                   np.delete(off, i))) + off[i], 1e-9))
                         for i in range(len(y))])

    def fit(self, agg: pd.DataFrame, e2e_ms: np.ndarray, per_type: bool = False,
            fixed: dict[str, float] | None = None) -> Overhead:
        """Choose the terms by leave-one-model-out error and fit them; ``per_type``: also try one scale per
        kernel type (``ms:<type>``, pulled towards the common scale, the pull chosen the same way) and a
        per-kernel saving, and take the simplest option within one standard error of the best; ``fixed``: terms whose
        coefficient was measured (:data:`OUTSIDE` at :func:`~.partition.measure_delegate_price`'s price), in every
        option with that coefficient."""
        y = np.asarray(e2e_ms, np.float64)
        fixed = {t: float(v) for t, v in (fixed or {}).items()}  # measured: kept where no model fitted on has the term
        off = self._design(agg, list(fixed)) @ np.asarray(list(fixed.values())) if fixed else None
        counts = sorted(c for c in agg.columns if c.startswith("n:"))
        cache = [[]] + [[c] for c in CACHE_TERMS if c in agg]
        cache += [list(CACHE_TERMS)] if all(c in agg for c in CACHE_TERMS) else []
        # before the eviction terms: it has no cache size to choose, so where both are within one standard error of
        # the best the rule takes it (session 35's Zen 5 networks: leave-one-out 0.074 against evicted_mb@32's 0.071)
        cache += [[SCALED]] if SCALED in agg else []
        cache += [[evicted_term(c)] for c in EVICTION_MB if evicted_term(c) in agg]
        saves = ([], [SAVED], [ADDED]) if per_type else ([],)
        cold = [COLD] if COLD in agg and float(agg[COLD].sum()) > 0 else []  # in every option where there is one
        cold += [OUTSIDE] if OUTSIDE in agg and float(agg[OUTSIDE].sum()) > 0 and OUTSIDE not in fixed else []
        options = [(["sum_ms", "one", *n, *v, "bytes_out_mb", *c, *cold], None)
                   for n in ([], counts)[: 1 + bool(counts)] for v in saves for c in cache]
        if per_type:
            types = sorted(c for c in agg.columns if c.startswith("ms:") and agg[c].sum() > 0)
            base = self._nnls(self._design(agg, ["sum_ms", "one", "bytes_out_mb", *cold]), y, None, off)[0]
            for lam in PER_TYPE_PULL:  # strongest pull (simplest) first
                for v in saves:
                    for c in cache:
                        terms = [*types, REST, "one", *v, "bytes_out_mb", *c, *cold]
                        options.append((terms, ([t.startswith("ms:") for t in terms], base, lam)))
        resid = [self._loo_residuals(self._design(agg, terms), y, prior, off) for terms, prior in options]
        mse = np.array([np.nan if r is None else float(np.mean(np.square(r))) for r in resid])
        best = 0
        if per_type and np.isfinite(mse).any():
            # dozens of flexible options: the lowest leave-one-out error is partly luck, so the simplest option
            # within one standard error of it is taken (the one-standard-error rule)
            low = int(np.nanargmin(mse))
            bar = mse[low] + float(np.std(np.square(resid[low]))) / np.sqrt(len(y)) + LOO_TIE ** 2
            best = next(i for i in range(len(options)) if mse[i] <= bar)
        else:
            # each option's leave-one-model-out spread: the spread a new model's prediction has; the lowest wins
            # (a more complex option must lower it by CACHE_GAIN to be taken)
            for i in range(1, len(options)):
                if np.sqrt(mse[i]) < np.sqrt(mse[best]) * (1 - CACHE_GAIN) - LOO_TIE:  # False for NaN (too few models)
                    best = i
        terms, prior = options[best]
        coef = self._nnls(self._design(agg, terms), y, prior, off).tolist()
        self.terms, self.coef, self.n_models = [*terms, *fixed], [*coef, *fixed.values()], len(y)
        self.resid_std = float(np.sqrt(mse[best])) if np.isfinite(mse[best]) else 0.0
        return self

    def predict(self, agg: pd.DataFrame) -> np.ndarray:
        """Each model's latency (``agg`` from :func:`model_aggregates`, with :meth:`cache_sizes` when
        ``cache_mb`` is set)."""
        if not self.coef:
            return agg["sum_ms"].to_numpy(np.float64)
        terms = [evicted_term(self.cache_mb) if t.startswith(EVICTED) and self.cache_mb else t for t in self.terms]
        missing = [t for t in terms if t.startswith(EVICTED) and t not in agg]
        if missing:
            raise ValueError(f"the aggregates lack {missing[0]}: pass cache_mb=overhead.cache_sizes()")
        return np.maximum(self._design(agg, terms) @ np.asarray(self.coef), 1e-9)
