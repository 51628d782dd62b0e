"""The sample statistics every device's runs go through: one :class:`Batch` of timed runs, and exact pooling.

Devices that only report summaries (``benchmark_model`` prints count/avg/std/min/max) are pooled exactly
for mean and standard deviation; the median is exact when every batch kept its samples or a single batch
reported it, and NaN otherwise (it is never made up).
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from leti.errors import DeviceError

NAN = float("nan")


# ---- one batch of runs, as a device reports it ------------------------------------------------
@dataclass(frozen=True)
class Batch:
    """Statistics of ``n`` timed runs of one model (times in milliseconds).

    ``std_ms`` is the sample standard deviation (ddof=1). ``samples`` holds the individual run times when
    the device exposes them (local, cuda), else it is empty (benchmark_model prints summaries only).
    """

    n: int
    mean_ms: float
    std_ms: float
    min_ms: float
    max_ms: float
    median_ms: float = NAN
    samples: tuple[float, ...] = ()
    delegation: str = "cpu"  # cpu | xnnpack | full | partial | none (see benchmark_log.Delegation)
    mem_init_mb: float = NAN
    mem_overall_mb: float = NAN
    mem_peak_mb: float = NAN
    raw_log: str = ""
    #: delegate coverage (see leti.device.coverage): the delegate's name, the nodes it ran, the graph's nodes
    delegate: str = ""
    delegated_nodes: int | None = None
    total_nodes: int | None = None

    @classmethod
    def from_samples(cls, samples_ms: Sequence[float], **kw) -> Batch:
        a = np.asarray(samples_ms, dtype=np.float64)
        if a.size == 0:
            raise DeviceError("a batch needs at least one timed run")
        std = float(a.std(ddof=1)) if a.size > 1 else 0.0
        return cls(int(a.size), float(a.mean()), std, float(a.min()), float(a.max()), float(np.median(a)),
                   tuple(float(x) for x in a), **kw)


@dataclass(frozen=True)
class Pooled:
    n: int
    mean_ms: float
    std_ms: float
    min_ms: float
    max_ms: float
    median_ms: float

    @property
    def rel_std(self) -> float:
        return self.std_ms / self.mean_ms if self.mean_ms > 0 else math.inf


def pool(batches: Sequence[Batch]) -> Pooled:
    """Exact pooled mean and sample std of several batches (Chan et al.'s parallel update)."""
    if not batches:
        raise DeviceError("no batches to pool")
    n, mean, m2 = 0, 0.0, 0.0
    for b in batches:
        bm2 = (b.std_ms**2) * (b.n - 1) if b.n > 1 else 0.0
        tot = n + b.n
        delta = b.mean_ms - mean
        mean += delta * b.n / tot
        m2 += bm2 + delta * delta * n * b.n / tot
        n = tot
    std = math.sqrt(m2 / (n - 1)) if n > 1 else 0.0
    if all(b.samples for b in batches):
        median = float(np.median(np.concatenate([np.asarray(b.samples) for b in batches])))
    elif len(batches) == 1:
        median = batches[0].median_ms
    else:
        median = NAN
    return Pooled(n, mean, std, min(b.min_ms for b in batches), max(b.max_ms for b in batches), median)


def t_quantile(n: int, confidence: float = 0.95) -> float:
    """Two-sided Student-t quantile for the mean of ``n`` values."""
    from scipy.stats import t

    return float(t.ppf(0.5 + confidence / 2, n - 1))


def ci_half_width(n: int, std: float, confidence: float = 0.95) -> float:
    """Half-width of the Student-t confidence interval of a mean of ``n`` values."""
    if n < 2:
        return math.inf
    return t_quantile(n, confidence) * std / math.sqrt(n)



#: The clocks a run can be timed with (``Protocol.clock``): ``wall`` time, or ``cpu``, the CPU time of the
#: measuring thread — what a run costs when other processes preempt it on a shared host (the time it
#: waits for the CPU is not counted); meaningful only where the whole run executes on that thread.
CLOCKS: dict[str, Callable[[], int]] = {"wall": time.perf_counter_ns, "cpu": time.thread_time_ns}


def timed_ms(go: Callable[[], None], runs: int, warmup: int,
             clock: Callable[[], int] = time.perf_counter_ns) -> np.ndarray:
    """``warmup`` untimed calls of ``go``, then ``runs`` timed ones (ms each, read on ``clock``, in ns), with
    the garbage collector paused so that no collection lands inside a timed run (as ``timeit`` does).
    Devices that can run a loaded model in-process (:meth:`Device.runner`) time their plain experiments with it."""
    for _ in range(warmup):
        go()
    times = np.empty(runs, dtype=np.float64)
    gc.collect()
    gc.disable()
    try:
        for i in range(runs):
            t0 = clock()
            go()
            times[i] = clock() - t0
    finally:
        gc.enable()
    return times / 1e6

