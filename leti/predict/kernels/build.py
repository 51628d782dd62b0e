"""``leti kernels build``: a kernel-level predictor of one device, measured within a wall-time budget.

Why adaptive: an hour of measurement buys a few thousand kernels, and where they go decides the accuracy.
The build (nn-Meter's adaptive sampling, with LETI's uncertainty) runs in rounds:

0. fusion detection (:mod:`.detect`), a near-empty model (the per-invoke cost), then initial draws per kernel
   type (:class:`~leti.predict.kernels.sampler.KernelSampler`), as many per type as its weight: its share of
   the kernels of real networks and of their latency;
1. the calibration models (:mod:`.calibration`), timed end to end, once (a continued build asked for more
   adds the missing ones), and with ``--networks N`` as many random whole networks
   (:mod:`leti.models.random_networks`), on which the overhead is then fitted: planned after round 0 and timed a
   share after each round's kernels, as many as keep pace with the budget (:func:`calibration_due`), the kernels
   leaving the time the rest will take;
2. each round fits the per-type regressors, cross-validates them per type, and plans the next round: its
   kernels go to the types with the largest latency-weighted CV error (times their weight), and within a type to the
   candidates with the largest predicted uncertainty (the bagged members' spread) among fresh draws and
   draws near the kernels predicted worst; every fit weighs a kernel by its closeness to real networks' kernels
   (:mod:`.coverage`; ``--no-coverage``: not);

until the budget (wall minutes, conversion, fits and detection included) is spent; then, once, the device's cache
profile (:mod:`.cache`: what a one-pixel kernel's weights cost once a network has pushed them out). The final predictor
(regressors on every kernel, overhead on the calibration models) is saved in ``out/`` with the measured
fusion rules, beside ``kernels.parquet`` (the measured kernel table, LETI's schema), ``calibration.parquet``
(``model, latency_ms``) and ``kernels.sqlite``, the resumable state (:mod:`.build_store`).

A kernel's latency is its paired ratio times the build-wide reference latency (the median of the reference's
per-experiment means) minus the per-invoke cost, which a model pays once (the overhead adds it back).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from leti.errors import LetiError
from leti.models.kernel_models import KernelConfig
from leti.predict.kernels.build_fit import (calibration_tables, candidate_scores, check_overhead, cv_by_type,
                                           default_networks, fit_final, kernel_table, measurement_cost)
from leti.predict.kernels.build_store import BuildStore
from leti.predict.kernels.split import FusionRules, rules_for

DB = "kernels.sqlite"
#: regressor settings of the per-round fits and CV (the final fit uses KernelRegressors' defaults; both weigh each
#: kernel by its closeness to real networks' kernels, :mod:`.coverage`, unless the build says otherwise)
ROUND_PARAMS = {"n_members": 4, "n_estimators": 150, "max_depth": 5}
#: the share of the budget by which every calibration chain and network is timed. They are timed a share after each
#: round, not all after round 0: the overhead is their time against their kernels', and on a VM whose speed steps
#: within the hour networks timed in a build's first minutes read 1.04x against kernels timed over its hour (session
#: 52: the fitted overhead's Acc@10 50.8 % as built, 86.4 % with the networks timed again later). Session 53's paced
#: build scored 96.4 / 95.6 % on two campaigns where session 52's store scored 97.6 / 98.4 %: no gain shown (docs/any_model.md)
CALIBRATION_PACE = 0.85
#: seconds a calibration item is guessed to take until one of its kind was timed (session 52, the engine: 1.0, 3.4)
GUESS_S = {"calibration": 1.5, "network": 4.0}


@dataclass
class BuildReport:
    out: Path
    per_type: dict[str, int]
    minutes: float
    cv: dict[str, dict]
    calibration: int
    rules: dict
    rounds: int
    budget_left_s: float
    pending: int = 0
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        n = sum(self.per_type.values())
        types = ", ".join(f"{t} {k}" for t, k in sorted(self.per_type.items(), key=lambda x: -x[1]))
        cv = ", ".join(f"{t} {v['mape']:.1f}%/{v.get('wmape', float('nan')):.1f}%" if v["mape"] == v["mape"]
                       else f"{t} n/a ({v['n']} kernels)" for t, v in sorted(self.cv.items()))
        return (f"{n} kernels measured ({types}); {self.calibration} calibration models; {self.rounds} rounds; "
                f"{self.minutes:.1f} minutes; CV error per type (MAPE/latency-weighted MAPE): {cv}")


def check_out(out: Path) -> None:
    """``out`` must be new, empty, or a kernel build's folder (continued); anything else is refused."""
    if out.exists() and not out.is_dir():
        raise LetiError(f"--out {out} is a file, not a folder")
    if out.is_dir() and any(out.iterdir()) and not (out / DB).is_file():
        raise LetiError(f"--out {out} holds something else (no {DB} of a kernel build); give a new or empty "
                        "folder, or the folder of a build to continue")


class _Clock:
    """Wall time of the build across runs: what the store had plus this run's, saved after every step."""

    def __init__(self, store: BuildStore, budget_s: float) -> None:
        self.store, self.budget_s = store, budget_s
        self.before, self.start = store.spent_s(), time.perf_counter()

    @property
    def spent(self) -> float:
        return self.before + time.perf_counter() - self.start

    def left(self) -> float:
        return self.budget_s - self.spent

    def save(self) -> None:
        self.store.set_spent(self.spent)


def calibration_due(total: int, spent_s: float, budget_s: float, pace: float | None = None) -> int:
    """How many of ``total`` planned calibration items (chains or networks) are due to be timed once ``spent_s``
    of ``budget_s`` are spent: their share in proportion, all of them by ``pace`` (:data:`CALIBRATION_PACE`) of the
    budget, and at least one."""
    if total <= 0:
        return 0
    share = min(1.0, spent_s / max((CALIBRATION_PACE if pace is None else pace) * budget_s, 1e-9))
    return max(1, int(np.ceil(total * share - 1e-9)))


def _calibration_left_s(store: BuildStore) -> float:
    """What timing the calibration items still pending will take (the kernels leave it)."""
    return sum(store.expected_s(kind, guess) for kind, guess in GUESS_S.items())


def _measure_calibration(store: BuildStore, bench, clock: _Clock, reserve_s: float, notify, every: bool) -> bool:
    """Time the calibration chains and networks due by now (:func:`calibration_due`), or ``every`` one pending."""
    ok, counts = True, store.counts()
    for kind in GUESS_S:  # chains first, then networks
        planned, pending = sum(counts.get(kind, {}).values()), counts.get(kind, {}).get("pending", 0)
        limit = None if every else max(calibration_due(planned, clock.spent, clock.budget_s) - (planned - pending), 0)
        ok = _measure_pending(store, bench, clock, reserve_s, notify, kind, limit) and ok
    return ok


def _measure_pending(store: BuildStore, bench, clock: _Clock, reserve_s: float, notify, kind: str | None = None,
                     limit: int | None = None) -> bool:
    """Measure the pending rows (of ``kind``; the first ``limit``) in order; False when the budget ran out first."""
    for item in store.pending(kind)[:limit]:
        if clock.left() < reserve_s:
            return False
        start = time.perf_counter()
        try:
            if item["kind"] == "network":
                timed = bench.network(item["config"]["params"], stem=item["name"])
            elif item["kind"] == "calibration":
                steps = [KernelConfig.from_dict(d) for d in item["config"]["steps"]]
                timed = bench.chain(steps, seed=int(item["config"]["seed"]), stem=item["name"])
            else:
                timed = bench.kernel(KernelConfig.from_dict(item["config"]), seed=int(item["id"]), stem=item["name"])
            store.done(item["id"], timed.kernels, timed.measurement, time.perf_counter() - start)
        except Exception as exc:  # noqa: BLE001 - one model that cannot be built or run is recorded, not fatal
            msg = str(exc) if isinstance(exc, LetiError) else f"{type(exc).__name__}: {str(exc)[:300]}"
            store.failed(item["id"], msg, time.perf_counter() - start)
        clock.save()
        notify(f"round {item['round']}: {item['kind']} {item['kernel_type']}")
    return True


def _items(configs: list[KernelConfig], origin: str) -> list[tuple[str, str, str, dict]]:
    return [(c.name, origin, c.kernel_type if c.kernel_type != "relu6" else "relu", c.to_dict()) for c in configs]


def _plan_initial(sampler, types: list[str], weights: dict[str, float], per_type: int, rng) -> list:
    """The first round's kernels, the types interleaved (:func:`interleave`): a budget that runs out in the first
    round still leaves every type some kernels."""
    total = per_type * len(types)
    groups = []
    for t in types:
        n = max(4, int(round(total * weights.get(t, 0.0))), per_type // 2)
        groups.append(_items(sampler.draw(t, n, rng), "initial"))
    return interleave(groups)


def _plan_adaptive(store: BuildStore, sampler, types: list[str], weights: dict[str, float], cv: dict,
                   worst: dict[str, list[KernelConfig]], regressors, quota: int, rng, odds=None) -> list:
    """The next round: ``quota`` kernels over types by weight × CV error, then by predicted uncertainty (times
    the candidate's closeness to real networks' kernels, given their ``odds``, per second of measuring it:
    :func:`~.build_fit.candidate_scores`)."""
    score = {t: weights.get(t, 0.0) * (cv.get(t, {}).get("err", 1.0) + 0.02) + 1e-3 for t in types}
    total = sum(score.values())
    known = store.names()
    cost = measurement_cost(store)
    per_type = []
    for t in types:
        n = max(2, int(round(quota * score[t] / total)))
        pool = sampler.draw(t, 3 * n, rng)
        if worst.get(t):
            pool += sampler.draw(t, 3 * n, rng, uniform_share=0.0, around=worst[t])
        pool = [c for c in {c.name: c for c in pool}.values() if c.name not in known]
        if not pool:
            continue
        value = candidate_scores(regressors, pool, odds, cost) if t in regressors.types_ else np.ones(len(pool))
        order = np.argsort(-value)[:n]
        per_type.append(_items([pool[i] for i in order], "adaptive"))
    return interleave(per_type)


def interleave(groups: list[list]) -> list:
    """One item of each group in turn (most uncertain first within a group). Why: a round is measured in
    planned order, and a budget that runs out mid-round must leave every type a share, not the types late in
    the alphabet none (measured: a 14-minute continuation of a 45-minute build stopped inside conv2d's share
    and measured no grouped convolution)."""
    from itertools import zip_longest

    return [x for row in zip_longest(*groups) for x in row if x is not None]


def plan_calibration(store: BuildStore, types: list[str], weights: dict[str, float], n: int, seed: int) -> int:
    """Plan the calibration chains up to ``n`` in all (``calib-000`` ...); a continued build asked for more
    adds the missing ones and keeps those already planned or measured. Returns how many were added."""
    from leti.predict.kernels.calibration import calibration_chains

    if n <= sum(store.counts().get("calibration", {}).values()):
        return 0
    chains = [(f"calib-{i:03d}", "calibration", "chain", {"steps": [s.to_dict() for s in steps], "seed": i})
              for i, steps in enumerate(calibration_chains(types, weights, n, seed))]
    return store.plan("calibration", chains, max(len(store.rounds()) - 1, 0))


def plan_networks(store: BuildStore, n: int, seed: int) -> int:
    """Plan the calibration networks up to ``n`` in all (``net-000`` ...; :mod:`leti.models.random_networks`),
    as :func:`plan_calibration` does the chains. Returns how many were added."""
    from leti.models.random_networks import network_params

    if n <= sum(store.counts().get("network", {}).values()):
        return 0
    nets = [(f"net-{i:03d}", "network", "network", {"params": network_params(seed * 100_003 + i)}) for i in range(n)]
    return store.plan("network", nets, max(len(store.rounds()) - 1, 0))


def build_kernel_predictor(device, out: str | Path, budget_minutes: float, seed: int = 0, threads: int = 1,
                           kernel_types: list[str] | None = None, n_calibration: int = 40,
                           n_networks: int | None = None,
                           initial_per_type: int = 24, detect: bool = True, protocol=None, cache_probe: bool = True,
                           cache_mb: float = 0.0, coverage: bool | None = None, overhead: str | None = None,
                           notify: Callable[[float, float, str], None] = lambda _s, _b, _m: None) -> BuildReport:
    """Build (or continue building) the kernel predictor of ``device`` (a name for
    :func:`~leti.device.registry.open_device`, or a device) into ``out`` within ``budget_minutes`` of wall
    time in all; ``kernel_types`` limits the types sampled (default: every type of the real networks);
    ``cache_probe``: measure the device's cache profile (:func:`_cache_profile`); ``cache_mb``: the cache a model
    has to itself on the host predicted for, where the overhead's eviction term ramps (``Overhead.cache_mb``);
    ``coverage``: the fits weigh each kernel by its closeness to real networks' kernels (:mod:`.coverage`; None: as
    the store's build was fitted, which a store from before session 31 was not; on for a new build); ``overhead``:
    the per-model overhead's form (:data:`~.build_fit.OVERHEAD_FORMS`; None: as the store's build was fitted, ``fit``
    for a new build or a store from before session 32); ``n_networks``: None, :func:`~.build_fit.default_networks`;
    ``notify(spent_s, budget_s, what)`` is called after every step (the progress bar)."""
    from leti.device.registry import open_device
    from leti.predict.kernels.bench import KERNEL_PROTOCOL, KernelBench, runtime_of
    from leti.predict.kernels.detect import DEFAULT_PAIRS, DETECT_PROTOCOL, measure_pairs, rules_from
    from leti.predict.kernels.partition import stored_delegate_price
    from leti.predict.kernels.sampler import default_sampler

    if not budget_minutes > 0:
        raise LetiError(f"--budget-minutes must be above 0, got {budget_minutes:g}")
    out = Path(out)
    check_out(out)
    sampler = default_sampler()
    types = sorted(kernel_types) if kernel_types else sampler.kernel_types
    unknown = sorted(set(types) - set(sampler.kernel_types))
    if unknown:
        raise LetiError(f"unknown kernel type(s) {', '.join(unknown)}; the sampler knows "
                        f"{', '.join(sampler.kernel_types)}")
    dev = open_device(device, threads=threads) if isinstance(device, str) else device
    out.mkdir(parents=True, exist_ok=True)
    with BuildStore(out / DB) as store, dev:
        runtime = runtime_of(dev)
        n_networks = default_networks(runtime) if n_networks is None else n_networks
        if (store.get("identity") or {}).get("transfer_from"):
            raise LetiError(f"{out} holds a transfer build (leti kernels build --transfer-from); rerun it with its "
                            "--transfer-from to continue it, or use another --out")
        new = store.get("identity") is None
        store.bind(device=dev.id, runtime=runtime, threads=threads, seed=seed, kernel_types=types)
        if coverage is None:  # a fitting choice, not a measurement setting: a rerun may change it
            coverage = bool(store.get("coverage", new))
        store.set("coverage", bool(coverage))
        overhead = check_overhead(overhead or store.get("overhead", "fit"))  # a fitting choice too
        store.set("overhead", overhead)
        params = {**ROUND_PARAMS, "coverage": bool(coverage)}
        clock = _Clock(store, budget_minutes * 60.0)
        tick = lambda msg: notify(clock.spent, clock.budget_s, msg)  # noqa: E731
        bench = KernelBench(dev, out / ".work", protocol or KERNEL_PROTOCOL)
        rules = store.get("rules")
        if rules is None:
            pairs = [p for p in DEFAULT_PAIRS if detect and set(p) <= set(types) | {"relu"}]
            tick("fusion detection")
            bench.use(DETECT_PROTOCOL)
            evidence = measure_pairs(bench, pairs) if pairs else []
            bench.use(protocol or KERNEL_PROTOCOL)
            # nothing measured (--no-detect, or no candidate pair among the types): the rules known a priori
            found = rules_from(evidence, runtime) if evidence else rules_for(runtime)
            store.set("rules", found.to_dict())
            store.set("fusion_evidence", [e.to_dict() for e in evidence])
            rules = found.to_dict()
            clock.save()
        bench.rules = FusionRules.from_dict(rules)
        if not store.counts().get("probe"):
            store.plan("probe", [(f"empty-{i}", "probe", "relu", KernelConfig("relu", 1, 1, 4).to_dict())
                                 for i in range(3)], 0)
        rng = np.random.default_rng([seed, len(store.rounds())])
        weights = sampler.type_weights()
        if not store.rounds():
            store.start_round(0, store.plan("kernel", _plan_initial(sampler, types, weights, initial_per_type, rng), 0))
        reserve = lambda: 5.0 + 1.5 * float(store.get("last_fit_s", 2.0))  # noqa: E731 - the final fit's time
        ok = _measure_pending(store, bench, clock, reserve(), tick, "probe")
        while ok:
            ok = _measure_pending(store, bench, clock, reserve() + _calibration_left_s(store), tick, "kernel")
            if ok:
                plan_calibration(store, types, weights, n_calibration, seed)
                if n_networks:
                    plan_networks(store, n_networks, seed)
            ok = _measure_calibration(store, bench, clock, reserve(), tick, every=not ok) and ok
            if not ok:
                break
            # fit, cross-validate, plan the next round
            t0 = time.perf_counter()
            table = kernel_table(store, runtime)
            cv, worst, regressors, odds = cv_by_type(table, params, seed)
            store.set("last_fit_s", time.perf_counter() - t0)
            last = len(store.rounds()) - 1
            store.finish_round(last, time.perf_counter() - t0, cv)
            store.set("cv", cv)
            store.set("cv_rows", len(table))
            weights = sampler.type_weights(_real_latency(sampler, regressors))
            clock.save()
            tick(f"round {last} fitted: {len(table)} kernels")
            if clock.left() < reserve() + _calibration_left_s(store):
                _measure_calibration(store, bench, clock, reserve(), tick, every=True)
                break
            quota = int(np.clip(0.5 * len(table), 40, 600))
            rng = np.random.default_rng([seed, last + 1])
            planned = store.plan("kernel", _plan_adaptive(store, sampler, types, weights, cv, worst, regressors,
                                                          quota, rng, odds), last + 1)
            store.start_round(last + 1, planned)
        cache = _cache_profile(store, bench, types, cache_probe, tick)
        price = stored_delegate_price(store, bench, tick)
        clock.save()
        bench.close()
        # the final predictor
        table = kernel_table(store, runtime)
        if table.empty:
            raise LetiError(f"no kernel was measured within {budget_minutes:g} minutes; give a larger --budget-minutes")
        cal_kernels, cal = calibration_tables(store, runtime)
        net_kernels, nets = calibration_tables(store, runtime, "network")
        predictor, notes = fit_final(table, cal_kernels, cal, FusionRules.from_dict(rules), net_kernels, nets, cache,
                                     coverage=bool(coverage), overhead=overhead, delegate_price=price)
        if cache_mb:
            predictor.overhead.cache_mb = float(cache_mb)
            notes.append(f"the eviction term ramps at {cache_mb:g} MB of cache when predicting" if
                         predictor.overhead.cache_sizes() else "--cache-mb: the overhead has no eviction term")
        predictor.hosts = store.hosts()  # where the kernels were timed, not where this fit runs
        _save(out, predictor, table, cal, cal_kernels, nets, net_kernels)
        cv = store.get("cv", {})
        if store.get("cv_rows") != len(table):  # kernels measured since the last round's fit
            cv = cv_by_type(table, params, seed)[0]
        clock.save()
        counts = store.counts()
        return BuildReport(out, table.kernel_type.value_counts().to_dict(), clock.spent / 60.0, cv,
                           len(cal) + len(nets), rules, len(store.rounds()), clock.left(),
                           counts.get("kernel", {}).get("pending", 0), notes)


#: kernel types that run as one-pixel products in real networks (a classifier, a squeeze-excite's convolutions):
#: a build of any of them measures the device's cache profile
ONE_PIXEL_TYPES = frozenset({"conv2d", "dense"})


def _cache_profile(store: BuildStore, bench, types: list[str], wanted: bool, tick):
    """The device's cache profile (:mod:`.cache`): measured once per build (a few seconds, after the budget too: the
    final fit needs it) when the build samples one-pixel product types and the device runs models in this
    process; kept in the store. None otherwise."""
    from leti.predict.kernels.cache import CacheProfile, measure_cache_profile

    if not wanted or not bench.device.pairable or not ONE_PIXEL_TYPES & set(types):
        return None
    saved = store.get("cache_profile")
    if saved is None:
        saved = measure_cache_profile(bench, tick).to_dict()
        store.set("cache_profile", saved)
    return CacheProfile.from_dict(saved)


def _real_latency(sampler, regressors) -> np.ndarray | None:
    """Predicted latency of the real networks' kernels (types without a regressor: FLOPs-based guess)."""
    real = sampler.real
    known = real.kernel_type.isin(list(regressors.types_))
    if not known.any():
        return None
    ms = np.array(real.flops / 2e7 + (real.bytes_in + real.bytes_out) / 1e7, np.float64)  # a writable copy
    ms[known.to_numpy()] = regressors.predict(real[known])[0]
    return ms


def _save(out: Path, predictor, table: pd.DataFrame, cal: pd.DataFrame, cal_kernels: pd.DataFrame,
          nets: pd.DataFrame, net_kernels: pd.DataFrame) -> None:
    """The predictor's files and the tables, the manifest last (a half-written folder is no predictor)."""
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory(prefix=".predictor-", dir=out) as tmp:
        predictor.save(Path(tmp) / "p")
        for part in ("types", "base", "own"):  # the regressors' files (a transfer build's: the source's under
            # ``base``, the blend's own under ``own``)
            shutil.rmtree(out / part, ignore_errors=True)
            if (Path(tmp) / "p" / part).exists():
                shutil.move(str(Path(tmp) / "p" / part), str(out / part))
        table.to_parquet(out / "kernels.parquet", index=False)
        cal.to_parquet(out / "calibration.parquet", index=False)
        if len(cal_kernels):
            cal_kernels.to_parquet(out / "calibration_kernels.parquet", index=False)
        if len(nets):
            nets.to_parquet(out / "networks.parquet", index=False)
            net_kernels.to_parquet(out / "network_kernels.parquet", index=False)
        (Path(tmp) / "p" / "manifest.json").replace(out / "manifest.json")
