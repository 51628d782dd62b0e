"""Overhead forms fitted on real models' campaigns (issue 16): which per-model terms explain a zoo, and do they carry over?

Offline (nothing is timed). For each ``--store`` / ``--dataset`` pair (a kernel build's folder and a zoo campaign
timed on the same host) the script predicts every zoo model's kernels alone and forms per-model aggregates: the
kernels' sum, the sums of conv2d / depthwise / grouped / other kernels (``t_*``), and ``E<C>``, the weights of the
convolutions and dense kernels ramped from 0 at C/2 MB of model weights to all at C MB (the weights a C MB cache no
longer holds). It fits each form by non-negative least squares on relative error and prints Acc@10: in sample, fitted
on the ``dev`` split and scored on ``test``, fitted on the build's own random networks and scored on the zoo, and, with
two pairs, fitted on one campaign's ``dev`` split and scored on the other build's store and campaign.

    PYTHONPATH=. python benchmarks/overhead_forms.py --zoo zoo/ --store kp5b/ --dataset datasets/zoo_local_cpu_zen5b.parquet \\
        --store kp5c/ --dataset datasets/zoo_local_cpu_zen5c.parquet

Session 40's figures: ``benchmarks/results/zoo_kernels_local_cpu.md``, "Session 40".
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

TYPED = ("conv2d", "depthwise_conv2d", "grouped_conv2d")
CACHES = (8, 12, 16, 24, 32)
PER_TYPE = [f"t_{t}" for t in TYPED] + ["t_rest"]
FORMS = [["sum"], ["sum", "W"], *[["sum", f"E{c}"] for c in CACHES], PER_TYPE, [*PER_TYPE, "E16"]]


def aggregates(kp, table: pd.DataFrame) -> pd.DataFrame:
    """Per model: ``sum``, ``W`` (MB of conv/dense weights), ``t_<type>`` and ``E<C>`` (see the module's doc)."""
    from leti.predict.kernels.cache import STREAMED
    from leti.predict.kernels.overhead import eviction_ramp
    from leti.predict.kernels.resident import resident_weight_bytes

    k = kp.predict_kernels(table, allow_unknown=True)
    kind, ms = k.kernel_type.astype(str).to_numpy(), k.predicted_ms.to_numpy(np.float64)
    cols = {"sum": ms, "W": np.where(np.isin(kind, STREAMED), resident_weight_bytes(k) / 1e6, 0.0)}
    for t in TYPED:
        cols[f"t_{t}"] = np.where(kind == t, ms, 0.0)
    cols["t_rest"] = np.where(np.isin(kind, TYPED), 0.0, ms)
    agg = pd.DataFrame(cols).groupby(k.model.to_numpy(), sort=False).sum()
    for c in CACHES:
        agg[f"E{c}"] = agg.W * eviction_ramp(agg.W, c)
    return agg


def fit(d: pd.DataFrame, form: list[str]) -> np.ndarray:
    from scipy.optimize import nnls

    return nnls(d[form].to_numpy() / d.y.to_numpy()[:, None], np.ones(len(d)))[0]


def acc10(d: pd.DataFrame, form: list[str], coef: np.ndarray) -> float:
    return float(np.mean(np.abs(d[form].to_numpy() @ coef / d.y - 1) <= 0.1) * 100)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--zoo", type=Path, required=True)
    ap.add_argument("--store", type=Path, action="append", required=True, help="a kernel build's folder (repeatable)")
    ap.add_argument("--dataset", type=Path, action="append", required=True, help="its zoo campaign (one per --store)")
    args = ap.parse_args(argv)
    if len(args.store) != len(args.dataset):
        print("error: give one --dataset per --store", file=sys.stderr)
        return 1

    from bench_kernels_zoo import measured_latency, zoo_split

    from leti.predict.kernels.build_fit import calibration_tables
    from leti.predict.kernels.build_store import BuildStore
    from leti.predict.kernels.model import load_kernel_predictor
    from leti.predict.kernels.split import split_model

    sides = []
    for store, dataset in zip(args.store, args.dataset):
        kp = load_kernel_predictor(store)
        truth, _ = measured_latency(dataset, args.zoo, "auto")
        tables = [split_model(args.zoo / m, kp.rules, device=kp.device) for m in truth.index if (args.zoo / m).is_file()]
        zoo = aggregates(kp, pd.concat(tables, ignore_index=True))
        zoo = zoo.join(truth.rename(index=lambda f: Path(f).stem).rename("y"), how="inner")
        zoo["split"] = [zoo_split(f"{m}.tflite") for m in zoo.index]
        with BuildStore(store / "kernels.sqlite") as s:
            net_kernels, nets = calibration_tables(s, kp.runtime, "network")
        net = aggregates(kp, net_kernels).join(nets.set_index("model").latency_ms.rename("y"), how="inner")
        sides.append((f"{store.name}/{dataset.stem}", zoo, net))
        print(f"{store.name} on {dataset.name}: {len(zoo)} zoo models, {len(net)} networks; time shares zoo / networks: "
              + ", ".join(f"{t[2:]} {zoo[t].sum() / zoo['sum'].sum():.3f} / {net[t].sum() / net['sum'].sum():.3f}"
                          for t in PER_TYPE))
    for name, zoo, net in sides:
        dev, test = zoo[zoo.split == "dev"], zoo[zoo.split == "test"]
        print(f"{name}: Acc@10 in sample | dev -> test | networks -> zoo; coefficients in sample")
        for form in FORMS:
            c = fit(zoo, form)
            print(f"  {' + '.join(form):<66}{acc10(zoo, form, c):6.1f}{acc10(test, form, fit(dev, form)):7.1f}"
                  f"{acc10(zoo, form, fit(net, form)):7.1f}   {np.round(c, 4).tolist()}")
    for a, b in ((a, b) for a in sides for b in sides if a is not b):
        print(f"fitted on {a[0]} (dev split), scored on {b[0]} (all | test):")
        for form in (['sum', 'E16'], [*PER_TYPE, 'E16']):
            c = fit(a[1][a[1].split == "dev"], form)
            print(f"  {' + '.join(form):<66}{acc10(b[1], form, c):6.1f}{acc10(b[1][b[1].split == 'test'], form, c):7.1f}")
    print(f"load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
