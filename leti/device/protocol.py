"""The statistical protocol that turns a device's runs into one number: :func:`measure`.

Everything statistical lives here, so the devices (adb, local, cuda, engine) cannot disagree on what
"a measurement" means:

* an experiment is ``runs`` timed runs after ``warmup`` untimed ones (the LETI paper: 300 runs);
* when the standard deviation exceeds ``max_rel_std`` of the mean (paper: 10 %) the experiment is
  repeated, at most ``max_attempts`` times in all; a model still above the limit is kept and marked
  ``stable=False`` instead of being dropped silently;
* with ``adaptive=True`` an experiment stops as soon as the 95 % confidence half-width of the mean is
  within ``ci_rel`` (±2 %) of the mean, and never runs more than ``runs`` timed runs.

**Paired measurement against a reference** (``measure(..., reference=path)``, devices that run models
in this process): a shared host's speed drifts by tens of percent over fractions of a second (other
tenants on the physical core), far more than run-to-run noise, so two experiments on one model seconds
apart disagree. The experiment then alternates short blocks (≈10 ms) of the model and of a fixed
reference model, untimed runs (at least :data:`SWITCH_WARM_RUNS` and :data:`SWITCH_WARM_MS`) after every switch so both
are timed warm as in the plain protocol.
Each timed run of the model is divided by the mean of the reference blocks around it; those
*normalised samples* are what the stability limit, the adaptive stop and the CI apply to, and their
median is the ``ratio`` (robust to a run preempted by another process). A campaign turns ratios back into milliseconds with one campaign-wide reference
latency (the median of the reference's per-experiment means), so a slow second on the host no longer
moves a cell (randomised interleaved trials, as in Abedi & Brecht's cloud benchmarking methodology).
The raw statistics of the model's own runs are kept beside the ratio. On a host shared by more busy
processes than cores, a run longer than the scheduler's time slice is preempted and its elapsed time counts
other processes' work (a 5 ms kernel read 17 ms at a load of 8 on 2 cores); ``Protocol(clock="cpu")`` times
runs (paired or not) with the calling thread's CPU time instead, on devices that run the model in that thread
(:meth:`Device.clocks`; :meth:`Device.timing` applies the clock).

**Op profiling** (devices with ``op_profiling``, an adb phone's ``benchmark_model``): after the timed
experiments, one more run of at most :data:`OP_PROFILE_RUNS` runs with the runtime's op profiler gives
per-op times (:attr:`Measurement.ops`). A separate run, never the timed ones: the profiler takes two time
stamps and records an event around every op (and with XNNPACK's profiler around every XNNPACK operator),
which costs time per op, more for models of many small ops, so a profiled total is not the latency a
campaign stores, and stored latencies stay comparable with campaigns that did not profile.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from leti.device.base import Device, Measurement, utc_now
from leti.device.stats import CLOCKS, Batch, ci_half_width, pool, t_quantile


# ---- the protocol ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Protocol:
    """How one model is measured. Defaults follow the LETI paper (300 runs, 10 % std limit)."""

    runs: int = 300
    warmup: int = 10
    max_rel_std: float = 0.10
    max_attempts: int = 3
    adaptive: bool = False
    ci_rel: float = 0.02
    confidence: float = 0.95
    min_runs: int = 20
    #: Thermal care: cool down before a model while the device is hotter than this (°C); None = never.
    cooldown_above_c: float | None = None
    cooldown_timeout_s: float = 120.0
    #: What a run's time is read on (:data:`~leti.device.stats.CLOCKS`): ``wall``, or ``cpu`` — the measuring
    #: thread's CPU time, which other processes preempting it on a shared host cannot inflate (local, 1 thread).
    clock: str = "wall"

    def __post_init__(self) -> None:
        if self.runs < 1 or self.warmup < 0 or self.max_attempts < 1 or self.min_runs < 2:
            raise ValueError("Protocol needs runs >= 1, warmup >= 0, max_attempts >= 1, min_runs >= 2")
        if not (0 < self.max_rel_std) or not (0 < self.ci_rel < 1) or not (0 < self.confidence < 1):
            raise ValueError("Protocol needs max_rel_std > 0 and ci_rel, confidence in (0, 1)")
        if self.clock not in CLOCKS:
            raise ValueError(f"unknown clock {self.clock!r}; known: {', '.join(CLOCKS)}")

    def to_dict(self) -> dict:
        """The stored form; the wall clock is left out, so campaigns stored before clocks existed resume."""
        d = asdict(self)
        if d["clock"] == "wall":
            del d["clock"]
        return d


def cool_down(device: Device, above_c: float | None, timeout_s: float, poll_s: float = 2.0,
              sleep: Callable[[float], None] = time.sleep) -> tuple[float | None, float]:
    """Wait while the device is hotter than ``above_c``. Returns (temperature at start, seconds waited)."""
    temp = device.temperature_c()
    if above_c is None or temp is None or temp <= above_c:
        return temp, 0.0
    start = time.monotonic()
    now = temp
    while now is not None and now > above_c and time.monotonic() - start < timeout_s:
        sleep(poll_s)
        now = device.temperature_c()
    return temp, time.monotonic() - start


def _experiment(device: Device, model: Path, p: Protocol) -> list[Batch]:
    if not p.adaptive:
        return [device.run(model, p.runs, p.warmup)]
    batches = [device.run(model, min(p.min_runs, p.runs), p.warmup)]
    while True:
        s = pool(batches)
        if s.n >= p.runs:
            return batches
        if ci_half_width(s.n, s.std_ms, p.confidence) <= p.ci_rel * s.mean_ms:
            return batches
        # runs the current estimate says are needed, at least 10 more and never past the cap
        tq = t_quantile(s.n, p.confidence)
        needed = math.ceil((tq * s.std_ms / (p.ci_rel * s.mean_ms)) ** 2) if s.mean_ms > 0 else p.runs
        step = min(max(needed - s.n, 10), p.runs - s.n)
        batches.append(device.run(model, step, min(p.warmup, 2)))



#: Timed runs of the extra op-profiled run (fewer when the protocol's ``runs`` are fewer).
OP_PROFILE_RUNS = 50

#: Target length of one block of paired measurement (ms): well under the host's drift time scale.
BLOCK_MS = 10.0
#: Untimed runs after every switch between model and reference last at least this long (ms), and number at least
#: :data:`SWITCH_WARM_RUNS`. Why:
#: a model that ran right after another one finds the caches full of the other's data, and one untimed run does not
#: restore them. Measured (LETI's engine, Zen 5, one thread): the 0.045 ms reference kernel of a kernel build after
#: three runs of a 128-pixel ResNet50 takes 3.2x its warm time on its first run, 1.2x on its second, 1.05x on its
#: third and 1.01-1.02x from the fourth on. A 5 ms model's blocks hold two runs, and so did the reference's blocks
#: beside it: with one untimed run, the reference was timed on its second and third runs, 12 % slow, and every large
#: kernel's and network's ratio 8-15 % low (the reference's per-experiment time 0.052 ms beside items of 2 ms and
#: more, 0.045 beside small ones), while a model campaign's reference (a 1.5 ms network) was slowed the same way
#: beside large models: the engine's any-model predictor, fitted on the kernel build, came out 9 % under the zoo
#: campaign measured right after it (session 32).
SWITCH_WARM_MS = 1.0
#: ... and at least this many runs: a model of a millisecond or more (a model campaign's reference network) is still
#: slow on its second run after a larger one
SWITCH_WARM_RUNS = 3


def warm_up(run, clock, ms: float = SWITCH_WARM_MS, runs: int = SWITCH_WARM_RUNS) -> None:
    """Run ``run`` untimed at least ``runs`` times and until ``ms`` of ``clock`` (nanoseconds) have passed."""
    end = clock() + ms * 1e6
    for _ in range(runs):
        run()
    while clock() < end:
        run()


def _paired_blocks(device: Device, model: Path, reference: Path, blocks: int, block_runs: int,
                   warmup: int) -> tuple[list[float], list[float], list[float]]:
    """Alternate ``blocks`` blocks of ``block_runs`` timed runs of model and reference.

    Returns the model's run times, the reference's, and the model's normalised samples, all in ms.
    A model block runs between two reference blocks; each of its runs is divided by the mean of those
    two blocks' medians (the first block, which has none before it, by the one after it), which follows
    a drift that changes within the block better than one neighbour does; medians, so that one run
    preempted by another process does not move a whole block.
    """
    a, r = device.runner(model), device.runner(reference)
    for _ in range(warmup):
        a()
        r()
    clock = device.clock_ns
    ta = np.empty((blocks, block_runs))
    tr = np.empty((blocks, block_runs))
    gc.collect()
    gc.disable()  # no collector pauses inside timed runs
    try:
        for j in range(blocks):
            warm_up(a, clock)  # warm again after the reference ran
            for k in range(block_runs):
                t0 = clock()
                a()
                ta[j, k] = clock() - t0
            warm_up(r, clock)
            for k in range(block_runs):
                t0 = clock()
                r()
                tr[j, k] = clock() - t0
    finally:
        gc.enable()
    ta /= 1e6
    tr /= 1e6
    rb = np.median(tr, axis=1)
    denom = np.concatenate([rb[:1], (rb[:-1] + rb[1:]) / 2])
    norm = ta / denom[:, None]
    return ta.ravel().tolist(), tr.ravel().tolist(), norm.ravel().tolist()


def _experiment_paired(device: Device, model: Path, reference: Path, p: Protocol) -> tuple[Batch, Batch, Batch]:
    """One paired experiment: (model runs, reference runs, normalised samples) as batches."""
    probe = device.run(model, 3, p.warmup)  # sizes the blocks; the model is warm afterwards
    block_runs = int(min(50, max(2, round(BLOCK_MS / max(probe.median_ms, 1e-3)))))
    first = max(3, math.ceil(min(p.min_runs, p.runs) / block_runs))
    cap = max(first, math.ceil(p.runs / block_runs))
    ta, tr, norm = _paired_blocks(device, model, reference, first if p.adaptive else cap, block_runs, p.warmup)
    while p.adaptive:
        s = Batch.from_samples(norm)
        if len(ta) >= p.runs or ci_half_width(s.n, s.std_ms, p.confidence) <= p.ci_rel * s.mean_ms:
            break
        tq = t_quantile(s.n, p.confidence)
        needed = math.ceil((tq * s.std_ms / (p.ci_rel * s.mean_ms)) ** 2) if s.mean_ms > 0 else p.runs
        more = min(max(needed - s.n, 2 * block_runs), p.runs - len(ta))
        if more < block_runs:  # whole blocks only: the adaptive protocol never exceeds ``runs`` timed runs
            break
        a2, r2, n2 = _paired_blocks(device, model, reference, more // block_runs, block_runs, min(p.warmup, 2))
        ta, tr, norm = ta + a2, tr + r2, norm + n2
    return Batch.from_samples(ta, delegation=probe.delegation, mem_init_mb=probe.mem_init_mb,
                              mem_overall_mb=probe.mem_overall_mb, delegate=probe.delegate,
                              delegated_nodes=probe.delegated_nodes, total_nodes=probe.total_nodes), Batch.from_samples(tr), Batch.from_samples(norm)


def measure(device: Device, model: Path | str, protocol: Protocol = Protocol(),
            reference: Path | str | None = None) -> Measurement:
    """Measure ``model`` on ``device`` under ``protocol`` (reruns, adaptive stop, thermal care).

    With ``reference`` the measurement is paired (see the module docstring): the stability limit and the
    adaptive stop apply to the normalised samples, and ``ref_ms``, ``ratio``, ``ratio_std`` are filled.
    """
    model = Path(model)
    with device.timing(protocol.clock):
        return _measure(device, model, protocol, reference)


def _measure(device: Device, model: Path, protocol: Protocol, reference: Path | str | None) -> Measurement:
    temp, cooled = cool_down(device, protocol.cooldown_above_c, protocol.cooldown_timeout_s)
    started = utc_now()
    logs: list[str] = []
    paired: dict = {}
    for attempt in range(1, protocol.max_attempts + 1):
        if reference is None:
            batches = _experiment(device, model, protocol)
            logs.extend(b.raw_log for b in batches if b.raw_log)
            s = pool(batches)
            ok = s.rel_std <= protocol.max_rel_std
        else:
            target, ref, norm = _experiment_paired(device, model, Path(reference), protocol)
            batches = [target]
            s = pool(batches)
            # the ratio is the median normalised sample: a preempted run is noise of the host, not the model's
            paired = {"ref_ms": ref.mean_ms, "ratio": norm.median_ms, "ratio_std": norm.std_ms}
            ok = norm.std_ms <= protocol.max_rel_std * norm.mean_ms
        if ok:
            break
    finished, ops, ops_log = utc_now(), (), None  # the timed measurement ends here, before any profiled run
    if device.op_profiling:
        found, ops_log = device.op_times(model, min(protocol.runs, OP_PROFILE_RUNS), protocol.warmup)
        ops = tuple(found)
    last = batches[-1]
    ci = (ci_half_width(s.n, s.std_ms, protocol.confidence) if reference is None
          else ci_half_width(s.n, paired["ratio_std"], protocol.confidence) * paired["ref_ms"])
    return Measurement(
        device_id=device.id, backend=device.backend, mean_ms=s.mean_ms, median_ms=s.median_ms,
        std_ms=s.std_ms, min_ms=s.min_ms, max_ms=s.max_ms, runs=s.n, warmup=protocol.warmup,
        attempts=attempt, stable=ok, ci_half_width_ms=ci, delegation=last.delegation,
        mem_init_mb=last.mem_init_mb, mem_overall_mb=last.mem_overall_mb, mem_peak_mb=last.mem_peak_mb,
        temperature_c=temp, cooldown_s=round(cooled, 3), started_at=started, finished_at=finished,
        raw_log="\n".join(logs), delegate=last.delegate, delegated_nodes=last.delegated_nodes,
        total_nodes=last.total_nodes, ops=ops, ops_log=ops_log, **paired,
    )
