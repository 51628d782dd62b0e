"""Kernel-level transfer on measured devices (issue 17, item 4), simulated offline from the stored kernel builds.

What ``leti kernels build --device TARGET --transfer-from SOURCE/ --budget-minutes K`` would have produced, without
measuring anything: the two CPU builds in ``datasets/`` (TFLite + XNNPACK: ``kernels_local_cpu.build.sqlite``;
LETI's engine: ``kernels_engine_cpu.build.sqlite``) timed the same kernel sampler's draws, so one is the source and
the other's store stands in for the new device.

* **source**: the source device's full predictor, refitted from its store (what ``leti kernels build`` on a
  copy of the store saves; kept in ``--work``);
* **K minutes**: the target's measured single-kernel models, ordered by the command's chooser
  (:func:`leti.predict.kernels.transfer_plan.order_kernels`, the source's regressors, seed s), are taken in that
  order as the command's schedule takes them — the probes, kernels up to ``KERNEL_SHARE`` of the budget, the first
  ``TRANSFER_NETWORKS`` calibration networks (``net-000`` …, the names the command plans with seed 0), kernels again
  — until the store's recorded seconds per item (conversion and timing; fits not counted) sum to K minutes;
* on those rows: **transfer** (:func:`leti.predict.kernels.adapt_fit.adapt_to_build`: the source's regressors
  adapted, its overhead scaled to the networks; the fusion rules the command keeps without ``--detect``: the
  source's, or the target runtime's a-priori rules when the runtimes differ) and **scratch** (the scratch build's
  final fit on the same kernels with the target's measured fusion rules; the overhead: latency = sum of kernels
  scaled to the same networks); where the a-priori rules differ from the target's measured ones, **transfer +
  measured rules** too (what ``--detect`` would give, its minutes not charged);
* **source as is** (its own rules, device and overhead) and **full build** (the target's whole store refitted:
  the ceiling).

Each is scored on the target's measured zoo (``datasets/zoo_<target>_cpu.parquet``; the zoo files of
``benchmarks/build_zoo.py``): Acc@10, Acc@5 and median |error| over the models, mean ± std over the seeds.

    PYTHONPATH=. python benchmarks/bench_kernel_transfer.py --zoo /work/zoo --work /tmp/ktw \\
        --out benchmarks/results/kernel_transfer_zoo.txt
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
DEVICES = {"local": "kernels_local_cpu", "engine": "kernels_engine_cpu"}


class Target:
    """One device's stored build: kernel rows with their seconds, networks, probes, rules, cache profile."""

    def __init__(self, name: str, work: Path) -> None:
        from leti.predict.kernels.build_fit import calibration_tables, kernel_table
        from leti.predict.kernels.build_store import BuildStore
        from leti.predict.kernels.cache import CacheProfile
        from leti.predict.kernels.split import FusionRules

        db = work / f"{DEVICES[name]}.build.sqlite"
        if not db.is_file():  # a copy: the dataset's file stays untouched
            shutil.copy(ROOT / "datasets" / db.name, db)
        with BuildStore(db) as store:
            ident = store.get("identity")
            self.device, self.runtime = ident["device"], ident["runtime"]
            self.table = kernel_table(store, self.runtime)
            items = store.measured("kernel").set_index("name")
            self.seconds = items.seconds.loc[self.table.model].to_numpy(np.float64)
            self.net_kernels, self.nets = calibration_tables(store, self.runtime, "network")
            nets = store.measured("network").set_index("name")
            self.nets = self.nets.assign(seconds=nets.seconds.loc[self.nets.model].to_numpy(np.float64))
            self.probe_s = float(store.measured("probe").seconds.sum())
            self.rules = FusionRules.from_dict(store.get("rules"))
            cache = store.get("cache_profile")
            self.cache = CacheProfile.from_dict(cache) if cache else None
            self.cal_kernels, self.cal = calibration_tables(store, self.runtime)
        self.name = name

    def full(self, work: Path):
        """The target's whole store refitted (the scratch build's final fit), saved in ``work``."""
        from leti.predict.kernels.build_fit import fit_final
        from leti.predict.kernels.model import load_kernel_predictor

        folder = work / f"full_{self.name}"
        if not (folder / "manifest.json").is_file():
            pred, _ = fit_final(self.table, self.cal_kernels, self.cal, self.rules, self.net_kernels, self.nets,
                                self.cache)
            pred.save(folder)
        return load_kernel_predictor(folder)


def zoo_split(zoo: Path, rules, device: str, work: Path) -> pd.DataFrame:
    """Every zoo model split into the kernels ``rules``' runtime runs (cached in ``work``)."""
    from leti.predict.kernels.split import delegate_outside, split_model

    # "outside": the kernels XNNPACK leaves out are marked (session 58); a cache from before lacks the marks
    key = hashlib.sha1(json.dumps([rules.to_dict(), device, "outside"], sort_keys=True).encode()).hexdigest()[:10]
    path = work / f"zoo_{rules.runtime}_{key}.parquet"
    if path.is_file():
        return pd.read_parquet(path)
    files = sorted(p for p in zoo.iterdir() if p.suffix == ".tflite")
    table = pd.concat([split_model(f, rules, device=device, outside=delegate_outside(f, rules.runtime)).assign(model=f.name)
                       for f in files], ignore_index=True)
    table.to_parquet(path, index=False)
    return table


def score(pred, zoo_table: pd.DataFrame, truth: pd.Series) -> dict:
    """Acc@10, Acc@5 (%), median |error| (%) of ``pred`` over the zoo models measured."""
    rows = zoo_table[zoo_table.model.isin(truth.index)].assign(device=pred.device)
    res = pred.predict_models(rows, allow_unknown=True, where="zoo")
    err = np.array([r.latency_ms / truth[r.model] - 1 for r in res])
    return {"acc10": float(np.mean(np.abs(err) <= 0.10) * 100), "acc5": float(np.mean(np.abs(err) <= 0.05) * 100),
            "med": float(np.median(np.abs(err)) * 100), "n": len(err)}


def schedule(order: np.ndarray, seconds: np.ndarray, nets: pd.DataFrame, probe_s: float, budget_s: float):
    """(kernel row positions, network names) the command's schedule fits in ``budget_s`` of recorded seconds."""
    from leti.predict.kernels.build_transfer import KERNEL_SHARE, TRANSFER_NETWORKS

    spent, k = probe_s, 0
    while k < len(order) and spent < KERNEL_SHARE * budget_s:
        spent += seconds[order[k]]
        k += 1
    names = []
    by_name = nets.set_index("model").seconds
    for i in range(TRANSFER_NETWORKS):
        name = f"net-{i:03d}"
        if spent >= budget_s or name not in by_name.index:
            break
        spent += float(by_name[name])
        names.append(name)
    while k < len(order) and spent < budget_s:
        spent += seconds[order[k]]
        k += 1
    return order[:k], names, spent


def scratch_on(t: Target, rows: pd.DataFrame, nets: pd.DataFrame, net_kernels: pd.DataFrame):
    """The scratch build's final fit on ``rows`` (target's measured rules), its overhead the identity scaled to the
    networks."""
    from leti.predict.kernels.adapt_fit import networks_overhead
    from leti.predict.kernels.build_fit import fit_final
    from leti.predict.kernels.overhead import Overhead

    none = pd.DataFrame({"model": [], "latency_ms": []})
    pred, _ = fit_final(rows, pd.DataFrame(), none, t.rules, None, None, t.cache)
    pred.overhead, pred.overhead_note = networks_overhead(pred, Overhead(), nets, net_kernels)
    return pred


def run_direction(src_t: Target, tgt: Target, args, work: Path, truth: pd.Series, log) -> list[dict]:
    from leti.predict.kernels.adapt_fit import adapt_to_build, networks_overhead
    from leti.predict.kernels.sampler import KernelSampler
    from leti.predict.kernels.split import rules_for
    from leti.predict.kernels.transfer_plan import order_kernels, source_weights

    source = src_t.full(work)
    full = tgt.full(work)
    default_rules = source.rules if source.runtime == tgt.runtime else rules_for(tgt.runtime)
    zoo_measured = zoo_split(args.zoo, tgt.rules, tgt.device, work)
    zoo_default = zoo_split(args.zoo, default_rules, tgt.device, work)
    zoo_source = zoo_split(args.zoo, source.rules, source.device, work)
    label = f"{src_t.name} -> {tgt.name}"
    out = [{"direction": label, "what": "source as is", "k": None, **score(source, zoo_source, truth)},
           {"direction": label, "what": "full build", "k": None, **score(full, zoo_measured, truth),
            "kernels": len(tgt.table), "minutes": (tgt.seconds.sum() + tgt.nets.seconds.sum() + tgt.probe_s) / 60}]
    log(f"{label}: source as is {out[0]['acc10']:.1f} %, full build {out[1]['acc10']:.1f} %")
    weights = source_weights(KernelSampler(), source.regressors)
    for seed in args.seeds:
        t0 = time.perf_counter()
        order = order_kernels(source.regressors, tgt.table, weights, np.random.default_rng([seed, 0]))
        for k in args.minutes:
            picked, names, spent = schedule(order, tgt.seconds, tgt.nets, tgt.probe_s, k * 60.0)
            rows = tgt.table.iloc[np.sort(picked)].reset_index(drop=True)
            nets = tgt.nets[tgt.nets.model.isin(names)]
            netk = tgt.net_kernels[tgt.net_kernels.model.isin(names)]
            common = {"direction": label, "k": k, "seed": seed, "kernels": len(rows), "networks": len(names),
                      "minutes": spent / 60, "types": rows.kernel_type.nunique()}
            adapted = adapt_to_build(source, rows, tgt.device, tgt.runtime, default_rules, tgt.cache, nets, netk)
            out.append({**common, "what": "transfer", **score(adapted, zoo_default, truth)})
            affine = copy.copy(adapted)  # the blend's adapted half alone, its overhead scaled the same way
            affine.regressors = adapted.regressors.adapted
            affine.overhead, _ = networks_overhead(affine, source.overhead, nets, netk)
            out.append({**common, "what": "transfer (affine only)", **score(affine, zoo_default, truth)})
            log(f"  {adapted.regressors.summary()}; {adapted.overhead_note}")
            if default_rules.to_dict()["fuse"] != tgt.rules.to_dict()["fuse"]:
                adapted.rules = tgt.rules  # the networks' kernels are the store's (measured rules) either way
                out.append({**common, "what": "transfer + measured rules", **score(adapted, zoo_measured, truth)})
            out.append({**common, "what": "scratch", **score(scratch_on(tgt, rows, nets, netk), zoo_measured, truth)})
            log(f"{label} seed {seed} K={k:g}: {len(rows)} kernels, {len(names)} networks, {spent / 60:.1f} min: "
                + ", ".join(f"{r['what']} {r['acc10']:.1f}" for r in out[-4:] if r.get("seed") == seed and r["k"] == k))
        log(f"  seed {seed}: {time.perf_counter() - t0:.0f} s")
    return out


def table(results: list[dict]) -> list[str]:
    df = pd.DataFrame(results)
    lines = ["| source -> target | predictor | K min | kernels | networks | Acc@10 % | Acc@5 % | median abs err % |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    order = {"source as is": 0, "transfer": 1, "transfer + measured rules": 2, "transfer (affine only)": 3,
             "scratch": 4, "full build": 5}
    for direction, d in df.groupby("direction", sort=False):
        keys = sorted({(order[w], w, k if k == k and k is not None else -1) for w, k in zip(d.what, d.k)},
                      key=lambda x: (x[2], x[0]))
        for _, what, k in keys:
            g = d[(d.what == what) & ((d.k == k) if k >= 0 else d.k.isna())]
            fmt = lambda c: f"{g[c].mean():.1f} ± {g[c].std(ddof=0):.1f}" if len(g) > 1 else f"{g[c].mean():.1f}"  # noqa: E731
            kern = f"{g.kernels.mean():.0f}" if "kernels" in g and g.kernels.notna().any() else ""
            nets = f"{g.networks.mean():.0f}" if "networks" in g and g.networks.notna().any() else ""
            lines.append(f"| {direction} | {what} | {'' if k < 0 else f'{k:g}'} | {kern} | {nets} | {fmt('acc10')} | "
                         f"{fmt('acc5')} | {fmt('med')} |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--zoo", type=Path, required=True, help="folder of the zoo's model files")
    ap.add_argument("--work", type=Path, required=True, help="cache: store copies, refitted predictors, zoo splits")
    ap.add_argument("--minutes", default="0.5,1,2,5,10,20", help="target measurement budgets (minutes)")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--directions", default="local:engine,engine:local", help="SOURCE:TARGET pairs")
    ap.add_argument("--out", type=Path, default=None, help="text file of the log and the table")
    args = ap.parse_args(argv)
    args.minutes = [float(x) for x in args.minutes.split(",")]
    args.seeds = [int(x) for x in args.seeds.split(",")]
    from bench_kernels_zoo import measured_latency

    args.work.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []

    def log(msg: str) -> None:
        print(msg, flush=True)
        lines.append(msg)

    t0 = time.perf_counter()
    targets = {name: Target(name, args.work) for name in DEVICES}
    results = []
    for pair in args.directions.split(","):
        s, t = pair.split(":")
        truth, how = measured_latency(ROOT / "datasets" / f"zoo_{t}_cpu.parquet", args.zoo, "auto")
        log(f"{s} -> {t}: zoo datasets/zoo_{t}_cpu.parquet, {len(truth)} models, measured latency: {how}")
        results += run_direction(targets[s], targets[t], args, args.work, truth, log)
    log(f"K minutes: the target store's recorded seconds per item (conversion + timing), fits not counted; "
        f"seeds {args.seeds}; {time.perf_counter() - t0:.0f} s in all")
    lines += table(results)
    print("\n".join(table(results)))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
