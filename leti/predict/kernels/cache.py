"""What a one-pixel kernel's weights cost in a network that has pushed them out of the cache, measured on the device.

Why: a kernel with one output pixel (a classifier at batch one, a squeeze-excite's 1×1 convolutions) reads each
weight once per inference. Timed alone, again and again, it finds its weights in the core's caches; inside a network
whose weights exceed the cache they come from memory every time. On LETI's engine a 5 MB classifier took 0.336 ms
inside a GhostNet variant and 0.088 ms alone (session 20), and the build's random calibration networks are too noisy
(leave-one-out spread ~11 %) to teach the overhead a term worth a few percent of a model. So the build times it
directly (:func:`measure_cache_profile`, a few seconds): one-pixel fully connected kernels of ``TARGET_MB`` megabytes
of weights, alone (warm) and each time after ``FLUSH_MB`` megabytes of other data were read (cold). From that:

* ``excess(w)``: what a kernel with ``w`` MB of weights costs beyond its time alone once its weights come from
  memory (the cold time after the largest flush minus the warm time; piecewise linear through the measured sizes
  and through 0 at 0 MB, the last slope beyond);
* ``lost(T)``: the share of that excess paid when ``T`` MB of data pass through the cache between two runs of the
  kernel (its own weights plus the others': an isotonic fit from 0 to 1 of the measured ``(w + X, excess(X) /
  excess(w))``).

A one-pixel kernel of ``w`` MB in a model that passes ``T`` MB per inference through the cache (:func:`footprint_mb`:
every kernel's weights and the larger of its largest step's maps and half the maps it writes) then costs
``excess(w) · (lost(T) − lost(w))`` more than alone: nothing in a model that fits the cache, and nothing for a
kernel whose own weights overflow it (alone it already streams them). A kernel with more output pixels hides part
of that stream behind its own work (:meth:`CacheProfile.in_model_ms`: the two combine as ``(work^p +
stream^p)^(1/p)``). Why it matters: on the AVX-512 engine (session 22) the work of a convolution on a 2×2 or
4×4 map with 4-12 MB of weights shrank below the time its weights take to come from memory, and inside ResNet50 at
64×64 or a ResNet-basic variant such kernels ran 1.25-2.5× their time alone (`Session.profile`), which the one-pixel
rule left out. Why activations
count: the probe's flush is any data, and in a network at 128-224 pixels the feature maps written between two
classifier runs are tens of MB, more than the weights (on the engine's zoo, counting weights only: Acc@10 94.0 %; with
the activations written: 95.6 %; a GhostNet variant's 5 MB classifier 0.125 ms in the network against 0.054
predicted with weights only). Why the largest step's feature maps and not every map written (session 25): the runtime
keeps its feature maps in one arena whose buffers steps reuse (``leti/engine/memory.py``, TFLite's arena planner), so
an inference touches the arena's bytes, not the sum of every output: the zoo's EfficientNet-B0s write a median 36 MB
of maps whose largest step holds 6 MB. Counting the sum put every kernel with weights of the EfficientNets (many
element-wise swish and squeeze-excite steps) in a model that evicts everything, and over-predicted them by 11-17 %.
Session 33 counts half of every map written where that is more (:data:`TRAFFIC_SHARE`, :func:`footprint_mb`).
Why the weights as the runtime holds them (session 26): LETI's engine multiplies a Winograd convolution by its
transformed filters (α²/k² the filter's bytes, 4× for a 3×3 filter at F(4×4)) and every product by packed panels
(:mod:`.resident`); those are the bytes a kernel reads and a model pushes through the cache (engine zoo's dev split:
Acc@5 61.3 → 63.7 %, Acc@10 unchanged). :meth:`CacheProfile.in_model_ms` adds it to each such kernel's prediction;
the overhead, fitted on top (``leti kernels build``), gives that cost a scale of its own (``overhead.COLD``). Devices
that cannot run two models in turn in this process (phones) have no profile and no such term.

Why a second level (session 31): the profile above prices weights that come from memory, and ``lost(T)`` is all but
0 for the 5-15 MB a MobileNet touches. Yet on LETI's engine the zoo's dev models cost 0.93-1.45× the sum of their
kernels timed alone (``benchmarks/bench_kernels_alone.py``, all 75), the most where many kernels have a few hundred
KB of weights over few pixels (MobileNets and RegNets at 96-128 pixels): alone, such a kernel finds its weights in
the core's own cache (L2, 1 MB on the Zen 4 measured); in a model, whose other kernels pass MBs through it, they come
from the shared L3 at every inference. So the probe also times one-pixel kernels of :data:`NEAR_MB` (0.125-0.5 MB)
warm and after the smallest flush (:meth:`CacheProfile.near`: 3, 9.5 and 11 µs beyond warm on that host), and every
kernel with weights pays that, unhidden, in a model whose other data exceed the smallest flush
(:meth:`CacheProfile.near_in_model_ms`). It enters a kernel's own time, not the overhead's cold term: fitted as part
of that term, the build's random networks scaled it to 0.2 (dev Acc@10 88.0 %); as measured, 89.3 % (the networks
then drop the memory term, ``cold_ms``, to 0 and keep ``evicted_mb@16``). ``docs/any_model.md``, session 31.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from leti.predict.kernels.resident import resident_weight_bytes

#: weights (MB) of the one-pixel kernels timed warm and cold
TARGET_MB = (1.0, 2.0, 4.0, 8.0)
#: weights (MB) another kernel streams between two runs of the timed one
FLUSH_MB = (4.0, 8.0, 16.0, 32.0, 64.0)
#: weights (MB) of the one-pixel kernels timed warm and after the smallest flush only: what a kernel whose weights the
#: core's own cache (L2) holds alone pays once a model has pushed them to the next level (:meth:`CacheProfile.near`)
NEAR_MB = (0.125, 0.25, 0.5)
#: timed runs per condition (after :data:`WARMUP`), the median kept
RUNS, WARMUP = 40, 5
#: kernel types whose weights a model streams in (:meth:`CacheProfile.in_model_ms`)
STREAMED = ("conv2d", "dense", "grouped_conv2d")
#: how a kernel's own work and its weights' stream combine inside a model, ``(c^p + s^p)^(1/p)``: p = 1 adds them
#: (no overlap), p → ∞ takes the larger (full overlap). Chosen on the engine zoo's dev split, where two re-timings of
#: the paired-panel AVX-512 engine gave 78.7 / 88.7 / 91.2 / 88.7 % (session 22) and 76.2 / 83.8 / 87.5 / 88.8 %
#: (session 23) Acc@10 for p = 1 / 1.5 / 2 / 3, against 85.0 % with the one-pixel rule (session 23; whole zoo 87.6 →
#: 88.0 %, test split 88.8 → 88.2 %, worst error 27 → 19 %); the build's calibration networks cannot choose it (their
#: leave-one-out spread is 0.070-0.073 for every p)
STREAM_P = 2.0


#: the share of the feature maps a model writes per inference that counts in its footprint (:func:`footprint_mb`)
TRAFFIC_SHARE = 0.5


def footprint_mb(rows: pd.DataFrame) -> np.ndarray:
    """Per kernel row: the MB its model (``model`` column) passes through the cache between two runs of one kernel:
    every kernel's weights as the runtime reads them (:func:`.resident.resident_weight_bytes`: on LETI's engine
    Winograd's transformed filters and packed panels, else ``bytes_weights``; each read once) plus the larger of the
    feature maps of the model's largest step (``bytes_in + bytes_out``) and :data:`TRAFFIC_SHARE` of every map the
    model writes (``bytes_out`` summed).

    Why not the largest step alone (session 25's rule): its maps are the arena the runtime's steps reuse, the
    distinct memory an inference touches; but a map written into a reused buffer still passes from the core's cache
    into the shared one when the next maps push it out, and there it ages the weights as new data would (an AMD L3
    fills with what the core's L2 evicts). Timed inside the network (``Session.profile(in_run=True)``, session 33),
    the engine's classifiers in the zoo's dev models paid a share of their cold cost that followed the maps written
    (corr. 0.77) more than the largest step (0.66): MobileNetV2 at 10.6 MB of weights kept its 5 MB classifier warm,
    a GhostNet variant at 10.5 MB, writing 24 MB of maps, did not. On the engine zoo's dev split the share 0 / 0.25 /
    0.35 / 0.42 / 0.5 / 0.6 / 0.75 / 1 scored Acc@10 96.2 / 96.2 / 97.5 / 97.5 / 98.8 / 97.5 / 96.2 / 95.0 % (the test
    split 94.7 / 94.7 / 95.3 / 95.9 / 95.9 / 95.9 / 96.5 / 95.3 %): all of every map written (1) was session 25's
    over-prediction of the EfficientNets, which write a median 36 MB of maps through a 6 MB arena."""
    model = rows["model"].to_numpy()
    weights = pd.Series(resident_weight_bytes(rows)).groupby(model, sort=False).transform("sum")
    step = rows["bytes_in"].to_numpy(np.float64) + rows["bytes_out"].to_numpy(np.float64)
    largest = pd.Series(step).groupby(model, sort=False).transform("max").to_numpy()
    written = pd.Series(rows["bytes_out"].to_numpy(np.float64)).groupby(model, sort=False).transform("sum").to_numpy()
    return (weights.to_numpy() + np.maximum(largest, TRAFFIC_SHARE * written)) / 1e6


@dataclass
class CacheProfile:
    """``excess_ms`` at ``weights_mb`` (the measured sizes), ``lost`` at ``total_mb`` (knots of the isotonic fit)."""

    weights_mb: list[float]
    excess_ms: list[float]
    total_mb: list[float]
    lost: list[float]
    #: :data:`NEAR_MB` and what each size costs after the smallest flush beyond warm (empty: a profile without them)
    near_mb: list[float] = field(default_factory=list)
    near_ms: list[float] = field(default_factory=list)

    def near(self, w: np.ndarray) -> np.ndarray:
        """What a kernel with ``w`` MB of weights pays inside any model that passes more than the core's cache through
        between two of its runs: its weights that cache held alone come from the next level. Through 0 at 0 MB and
        the measured sizes; the largest size's cost beyond (a kernel's weights over the cache's size left part of
        them there alone, as much as the largest size)."""
        w = np.asarray(w, np.float64)
        if not self.near_mb or not self.near_resolved():
            return np.zeros_like(w)
        return np.interp(w, np.concatenate([[0.0], self.near_mb]), np.maximum(np.concatenate([[0.0], self.near_ms]), 0.0))

    def near_resolved(self) -> bool:
        """Whether the near costs grow with the size, as a larger block of weights from the next level must: costs that
        fall with it are below what the probe resolves and count as none (session 32's Zen 5: 2.3, 1.2 and 1.0 µs for
        0.125-0.5 MB; session 31's Zen 4: 3.0, 9.5, 11.1). Counted there, they cost the engine zoo's dev split 10
        points of Acc@5 (62.5 against 72.5 %) and its worst error 21 against 12 %."""
        return bool(np.all(np.diff(np.asarray(self.near_ms, np.float64)) >= 0.0))

    def excess(self, w: np.ndarray) -> np.ndarray:
        x = np.concatenate([[0.0], self.weights_mb])
        y = np.maximum(np.concatenate([[0.0], self.excess_ms]), 0.0)
        slope = (y[-1] - y[-2]) / max(x[-1] - x[-2], 1e-9)
        w = np.asarray(w, np.float64)
        return np.where(w <= x[-1], np.interp(w, x, y), y[-1] + max(slope, 0.0) * (w - x[-1]))

    def share_lost(self, total: np.ndarray) -> np.ndarray:
        return np.interp(np.asarray(total, np.float64), self.total_mb, self.lost, left=0.0, right=self.lost[-1])

    def in_model_ms(self, rows: pd.DataFrame, alone_ms: np.ndarray, warm_ms=None) -> np.ndarray:
        """Per kernel row: what it costs in its model (``model`` column) beyond ``alone_ms``, its time alone. A kernel
        with weights (:data:`STREAMED`) reads them once per inference, ``w`` MB as the runtime holds them
        (:func:`.resident.resident_weight_bytes`); in a model that touches T MB
        (:func:`footprint_mb`) reading them takes ``s = warm(w) + excess(w) ·
        (lost(T) − lost(w))``, where ``warm_ms(w)`` is what a one-pixel kernel of ``w`` MB takes alone (0 without
        it). The kernel's other work, ``c = alone − warm(w)``, overlaps that stream in part: in the model the kernel
        takes ``(c^p + s^p)^(1/p)`` (p = :data:`STREAM_P`), never less than alone. A one-pixel kernel (c ≈ 0) pays
        the whole excess; a kernel whose work dwarfs its weights pays next to nothing; nothing changes in a model
        the cache holds (``s = warm``)."""
        return self.in_model_costs(rows, alone_ms, warm_ms)[0]

    def near_in_model_ms(self, rows: pd.DataFrame) -> np.ndarray:
        """Per kernel row: what its weights that the core's cache held alone cost inside its model (``model`` column),
        :meth:`near` of its weights as the runtime holds them, where the rest of the model passes at least the smallest
        flush (:data:`FLUSH_MB`) between two of its runs; 0 for kernels without weights (:data:`STREAMED`)."""
        return self.in_model_costs(rows, np.zeros(len(rows)))[1]

    def in_model_costs(self, rows: pd.DataFrame, alone_ms: np.ndarray, warm_ms=None) -> tuple[np.ndarray, np.ndarray]:
        """(:meth:`in_model_ms`, :meth:`near_in_model_ms`) from one pass over the rows: the weights as the runtime
        holds them and the model's footprint are computed once (a prediction needs both)."""
        w = resident_weight_bytes(rows) / 1e6
        alone = np.asarray(alone_ms, np.float64)
        streamed = rows["kernel_type"].astype(str).isin(STREAMED).to_numpy() & (w > 0)
        total = footprint_mb(rows)
        warm = np.zeros_like(w) if warm_ms is None else np.asarray(warm_ms(w), np.float64)
        stream = warm + self.excess(w) * np.maximum(self.share_lost(total) - self.share_lost(w), 0.0)
        work = np.maximum(alone - warm, 0.0)
        inside = (work ** STREAM_P + stream ** STREAM_P) ** (1.0 / STREAM_P)
        cold = np.where(streamed, np.maximum(inside - alone, 0.0), 0.0)
        near = np.where(streamed & (total >= w + FLUSH_MB[0]), self.near(w), 0.0)
        return cold, near

    def to_dict(self) -> dict:
        d = {"weights_mb": self.weights_mb, "excess_ms": self.excess_ms, "total_mb": self.total_mb, "lost": self.lost}
        if self.near_mb:
            d.update(near_mb=self.near_mb, near_ms=self.near_ms)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> CacheProfile:
        return cls(*(list(map(float, d.get(k, ()))) for k in ("weights_mb", "excess_ms", "total_mb", "lost", "near_mb",
                                                               "near_ms")))

    @classmethod
    def from_times(cls, warm: dict[float, float], cold: dict[tuple[float, float], float],
                   near: dict[float, tuple[float, float]] | None = None) -> CacheProfile:
        """From the warm time of each target size and the cold time of each (target, flush) pair (ms); ``near``: the
        (warm, cold after the smallest flush) times of each :data:`NEAR_MB` size."""
        from sklearn.isotonic import IsotonicRegression

        sizes_near = sorted(near or {})
        extra = ([float(w) for w in sizes_near], [max(near[w][1] - near[w][0], 0.0) for w in sizes_near])

        sizes = sorted(warm)
        top = max(x for _, x in cold)
        excess = [max(cold[(w, top)] - warm[w], 0.0) for w in sizes]
        pts = [(w + x, (cold[(w, x)] - warm[w]) / e) for w, e in zip(sizes, excess) if e > 0
               for (w2, x) in cold if w2 == w]
        if not pts:  # no measurable cold cost: nothing lost anywhere
            return cls(sizes, [0.0] * len(sizes), [0.0, 1.0], [0.0, 0.0], *extra)
        t, s = np.array(pts).T
        order = np.argsort(t)
        fit = IsotonicRegression(y_min=0.0, y_max=1.0, increasing=True).fit(t[order], s[order])
        knots = np.unique(np.concatenate([[0.0], t[order]]))
        lost = np.clip(fit.predict(knots), 0.0, 1.0)
        lost[0] = 0.0
        return cls(sizes, excess, knots.tolist(), np.maximum.accumulate(lost).tolist(), *extra)


def measure_cache_profile(bench, notify=lambda _m: None) -> CacheProfile:
    """Time the one-pixel targets warm and after each flush (a sweep over ``X`` MB of a NumPy array in this
    process: other data pushing the weights out, as the rest of a network does) on ``bench``'s device, by its CPU
    clock when it has one. Raises the device's error when it cannot run models in this process."""
    from leti.device.base import CLOCKS
    from leti.models.kernel_models import KernelConfig, kernel_model

    dev = bench.device
    clock = CLOCKS["cpu"] if "cpu" in dev.clocks() else CLOCKS["wall"]
    sweep = np.ones(int(max(FLUSH_MB) * 1e6 / 4), np.float32)

    def timed(run, flush_mb: float | None) -> float:
        part = sweep[: int(flush_mb * 1e6 / 4)] if flush_mb else None
        times = []
        for _ in range(WARMUP + RUNS):
            if part is not None:
                part.sum()
            t0 = clock()
            run()
            times.append((clock() - t0) / 1e6)
        return float(np.median(times[WARMUP:]))

    warm, cold, near = {}, {}, {}
    for w in (*NEAR_MB, *TARGET_MB):
        notify(f"cache probe: {w:g} MB")
        k = 1024
        path, _ = bench.write(kernel_model(KernelConfig("dense", 1, 1, k, output_c=int(w * 1e6 / 4 / k)), 0),
                              f"cache-{w:g}")
        try:
            run = dev.runner(path)
            if w in NEAR_MB:
                near[w] = (min(timed(run, None), timed(run, None)), timed(run, FLUSH_MB[0]))
                continue
            warm[w] = timed(run, None)
            for x in FLUSH_MB:
                cold[(w, x)] = timed(run, x)
            warm[w] = min(warm[w], timed(run, None))  # again after the cold runs: the lower of the two
        finally:
            dev.release(path)
            path.unlink(missing_ok=True)
    return CacheProfile.from_times(warm, cold, near)
