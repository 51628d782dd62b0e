"""``leti kernels build --transfer-from SRC/``: a new device's kernel predictor from a known device's, in minutes.

Why: a scratch build measures thousands of kernels (an hour) because its regressors learn each kernel type's cost
law from nothing. That law's shape carries over between devices (LitePred; :mod:`.adapt`), so a transfer build
measures a few hundred single-kernel models on the new device, chosen to pin a per-type correction of the source's
regressors (:mod:`.transfer_plan`: every type first, then spread over the source's predicted latency and the
kernels' features), and fits :class:`~leti.predict.kernels.blend.BlendedKernels` on them: the corrected source
blended per type with the device's own regressors, each type's weight chosen by cross-validation on its kernels
(the corrected source with a few kernels of a type, the device's own with many). Within the budget:

0. the fusion rules: the source's (its runtime's a-priori rules when the new device runs another runtime);
   measured only with ``--detect`` and at least :data:`DETECT_MIN_MINUTES` of budget;
1. the near-empty probes (the per-invoke cost), then kernels in batches of :data:`BATCH` (fresh sampler draws
   ordered by :func:`~leti.predict.kernels.transfer_plan.order_kernels`) until :data:`KERNEL_SHARE` of the budget;
2. up to ``n_networks`` random whole networks (:mod:`leti.models.random_networks`, as the scratch build names them)
   timed end to end: the source's overhead scaled to them, or with 20 or more fitted afresh
   (:func:`~leti.predict.kernels.adapt_fit.networks_overhead`);
3. more kernels until the budget is spent; the device's cache profile, once.

Saved like a scratch build (the predictor with the source's regressors under ``base/``, ``kernels.parquet``,
``networks.parquet``, ``kernels.sqlite``): a rerun continues it, a larger budget measures more. The store is bound
to the source (its device, runtime and manifest digest): a rerun from another source, or without
``--transfer-from``, is refused.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from leti.errors import LetiError
from leti.models.kernel_models import KernelConfig
from leti.predict.kernels.build import (DB, _cache_profile, _Clock, _items, _measure_pending, _save, check_out,
                                        plan_networks)
from leti.predict.kernels.build_fit import calibration_tables, kernel_table
from leti.predict.kernels.build_store import BuildStore
from leti.predict.kernels.model import MANIFEST, KernelLatencyPredictor, is_kernel_predictor, load_kernel_predictor
from leti.predict.kernels.split import FusionRules, rules_for
from leti.predict.kernels.transfer_plan import candidate_pool, order_kernels, source_weights, type_shares

#: the share of the budget spent on kernels before the networks are timed (the rest: networks, then kernels)
KERNEL_SHARE = 0.7
#: whole networks a transfer build times for the overhead (``--networks``' default with ``--transfer-from``)
TRANSFER_NETWORKS = 8
#: kernels chosen at a time (a rerun with a larger budget, or a fast device, plans another batch)
BATCH = 400
#: the least budget (minutes) with which ``--detect`` measures the fusion rules (about a minute of pairs)
DETECT_MIN_MINUTES = 5.0
#: the precision every kernel build measures
PRECISION = "float"
#: the fewest kernels a transfer fits on (:class:`~leti.predict.kernels.blend.BlendedKernels`)
MIN_KERNELS = 3


@dataclass
class TransferReport:
    out: Path
    source: str
    per_type: dict[str, int]
    networks: int
    minutes: float
    rules: dict
    budget_left_s: float
    pending: int = 0
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        n = sum(self.per_type.values())
        types = ", ".join(f"{t} {k}" for t, k in sorted(self.per_type.items(), key=lambda x: (-x[1], x[0])))
        return (f"the kernel regressors of {self.source} adapted with {n} kernels measured ({types}), blended "
                f"with this device's own; "
                f"{self.networks} networks timed; {self.minutes:.1f} minutes")


def load_source(folder: str | Path, device_id: str, runtime: str) -> KernelLatencyPredictor:
    """The source predictor at ``folder``, refused in one line when it is no kernel predictor, when it already
    describes ``device_id`` on ``runtime`` on this machine (or on machines it did not record: a store of before session
    47), or when it is of another precision than a build measures. The same device on another recorded machine is a
    source like another device's: ``local`` built on one VM is another machine than ``local`` here (session 50: the
    Zen 3 store on a Zen 4 predicted the zoo 21 % high)."""
    folder = Path(folder)
    if not is_kernel_predictor(folder):
        raise LetiError(f"--transfer-from {folder} is not a kernel predictor (no {MANIFEST} of leti kernels build or "
                        "leti fit --kernels in it); give the folder of another device's kernel predictor")
    src = load_kernel_predictor(folder)
    if src.device == device_id and src.runtime == runtime and src.host != "other":
        where = "this machine" if src.host == "this" else "a machine its build did not record"
        raise LetiError(f"--transfer-from {folder} is the kernel predictor of this very device ({src.describes}, "
                        f"measured on {where}): a transfer to itself makes no sense; continue its own build instead, "
                        "or transfer from another device's or another machine's predictor")
    if src.precision != PRECISION:
        raise LetiError(f"--transfer-from {folder} describes precision {src.precision!r}, and a kernel build "
                        f"measures {PRECISION!r} kernels; transfer needs a source of the same precision")
    return src


def source_identity(folder: str | Path, src: KernelLatencyPredictor) -> dict:
    """What the store is bound to: the source's device, runtime and the digest of its manifest."""
    digest = hashlib.sha256((Path(folder) / MANIFEST).read_bytes()).hexdigest()[:16]
    return {"device": src.device, "runtime": src.runtime, "manifest": digest}


def _rules(store: BuildStore, bench, protocol, src: KernelLatencyPredictor, runtime: str, types: list[str],
           detect: bool, budget_minutes: float, tick) -> tuple[dict, str]:
    """The build's fusion rules (kept in the store): measured with ``detect`` when the budget affords it, else the
    source's, or the runtime's a-priori rules when the source describes another runtime."""
    from leti.predict.kernels.detect import DEFAULT_PAIRS, DETECT_PROTOCOL, measure_pairs, rules_from

    saved = store.get("rules")
    if saved is not None:
        return saved, store.get("rules_note", "")
    pairs = [p for p in DEFAULT_PAIRS if set(p) <= set(types) | {"relu"}]
    if detect and pairs and budget_minutes >= DETECT_MIN_MINUTES:
        tick("fusion detection")
        bench.use(DETECT_PROTOCOL)
        evidence = measure_pairs(bench, pairs)
        bench.use(protocol)
        rules, note = rules_from(evidence, runtime), "fusion rules measured"
        store.set("fusion_evidence", [e.to_dict() for e in evidence])
    elif src.rules.runtime == runtime:
        rules, note = src.rules, f"fusion rules: those of {src.device!r}"
    else:
        rules, note = rules_for(runtime), f"fusion rules: {runtime}'s a priori ({src.device!r} runs {src.runtime})"
    if detect and note != "fusion rules measured":
        note += f" (--detect takes at least {DETECT_MIN_MINUTES:g} minutes of budget)"
    store.set("rules", rules.to_dict())
    store.set("rules_note", note)
    return rules.to_dict(), note


def _measure_kernels(store: BuildStore, bench, clock: _Clock, reserve_s: float, tick, plan_batch) -> bool:
    """Measure pending kernels, planning another batch when none is left; False when the budget ran out."""
    while True:
        if not store.pending("kernel"):
            if clock.left() < reserve_s or not plan_batch():
                return clock.left() >= reserve_s
        if not _measure_pending(store, bench, clock, reserve_s, tick, "kernel"):
            return False


def build_transfer_predictor(device, out: str | Path, budget_minutes: float, source: str | Path, seed: int = 0,
                             threads: int = 1, kernel_types: list[str] | None = None,
                             n_networks: int = TRANSFER_NETWORKS, detect: bool = False, protocol=None,
                             cache_probe: bool = True,
                             notify: Callable[[float, float, str], None] = lambda _s, _b, _m: None) -> TransferReport:
    """Build (or continue) the kernel predictor of ``device`` into ``out`` by adapting the kernel predictor at
    ``source`` (another device's) to kernels measured within ``budget_minutes`` of wall time in all (module
    docstring); the other arguments as :func:`~leti.predict.kernels.build.build_kernel_predictor`'s."""
    from leti.device.registry import open_device
    from leti.predict.kernels.adapt_fit import adapt_to_build
    from leti.predict.kernels.bench import KERNEL_PROTOCOL, KernelBench, runtime_of
    from leti.predict.kernels.sampler import default_sampler

    if not budget_minutes > 0:
        raise LetiError(f"--budget-minutes must be above 0, got {budget_minutes:g}")
    out = Path(out)
    check_out(out)
    dev = open_device(device, threads=threads) if isinstance(device, str) else device
    runtime = runtime_of(dev)
    src = load_source(source, dev.id, runtime)
    sampler = default_sampler()
    types = sorted(kernel_types) if kernel_types else sampler.kernel_types
    unknown = sorted(set(types) - set(sampler.kernel_types))
    if unknown:
        raise LetiError(f"unknown kernel type(s) {', '.join(unknown)}; the sampler knows "
                        f"{', '.join(sampler.kernel_types)}")
    notes = []
    unmeasured = sorted(set(src.regressors.kernel_types) - set(types))
    if unmeasured:
        notes.append(f"types of the source not measured here (the device-wide correction only): {', '.join(unmeasured)}")
    out.mkdir(parents=True, exist_ok=True)
    with BuildStore(out / DB) as store, dev:
        store.bind(device=dev.id, runtime=runtime, threads=threads, seed=seed, kernel_types=types,
                   transfer_from=source_identity(source, src))
        clock = _Clock(store, budget_minutes * 60.0)
        tick = lambda msg: notify(clock.spent, clock.budget_s, msg)  # noqa: E731
        bench = KernelBench(dev, out / ".work", protocol or KERNEL_PROTOCOL)
        rules, note = _rules(store, bench, protocol or KERNEL_PROTOCOL, src, runtime, types, detect,
                             budget_minutes, tick)
        notes.append(note)
        clock.save()
        bench.rules = FusionRules.from_dict(rules)
        if not store.counts().get("probe"):
            store.plan("probe", [(f"empty-{i}", "probe", "relu", KernelConfig("relu", 1, 1, 4).to_dict())
                                 for i in range(3)], 0)
        weights = source_weights(sampler, src.regressors)
        shares = type_shares(types, weights)

        def plan_batch() -> int:
            r = len(store.rounds())
            rng = np.random.default_rng([seed, r])
            configs, cand = candidate_pool(sampler, types, shares, BATCH, rng, store.names())
            chosen = [configs[i] for i in order_kernels(src.regressors, cand, weights, rng, BATCH)]
            planned = store.plan("kernel", _items(chosen, "transfer"), r)
            store.start_round(r, planned)
            return planned

        reserve = lambda: 5.0 + 1.5 * float(store.get("last_fit_s", 2.0))  # noqa: E731 - the final fit's time
        ok = _measure_pending(store, bench, clock, reserve(), tick, "probe")
        if ok and n_networks:
            _measure_kernels(store, bench, clock, (1 - KERNEL_SHARE) * clock.budget_s + reserve(), tick, plan_batch)
            ok = clock.left() >= reserve()
            if ok:
                plan_networks(store, n_networks, seed)
                ok = _measure_pending(store, bench, clock, reserve(), tick, "network")
        if ok:
            _measure_kernels(store, bench, clock, reserve(), tick, plan_batch)
        cache = _cache_profile(store, bench, types, cache_probe, tick)
        clock.save()
        bench.close()
        table = kernel_table(store, runtime)
        if len(table) < MIN_KERNELS:
            raise LetiError(f"only {len(table)} kernels were measured within {budget_minutes:g} minutes, and a "
                            f"transfer fits on at least {MIN_KERNELS}; give a larger --budget-minutes")
        cal_kernels, cal = calibration_tables(store, runtime)
        net_kernels, nets = calibration_tables(store, runtime, "network")
        t0 = time.perf_counter()
        predictor = adapt_to_build(src, table, dev.id, runtime, FusionRules.from_dict(rules), cache, nets, net_kernels)
        store.set("last_fit_s", time.perf_counter() - t0)
        notes += [predictor.regressors.summary(), predictor.overhead_note]
        predictor.hosts = store.hosts()  # where the kernels were timed, not where this fit runs
        _save(out, predictor, table, cal, cal_kernels, nets, net_kernels)
        clock.save()
        return TransferReport(out, f"{src.device!r} ({src.runtime})", table.kernel_type.value_counts().to_dict(),
                              len(nets), clock.spent / 60.0, rules, clock.left(),
                              store.counts().get("kernel", {}).get("pending", 0), notes)
