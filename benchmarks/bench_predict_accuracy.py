"""Acc@10% of the best boosting predictors with 1,000 training cells, against the issue's targets.

The paper's split without model selection (each predictor with its default parameters; ``leti evaluate``
adds the cross-validated choice): for every seed, 1,000 random cells of a device (the same permutation
as ``leti evaluate``) train the predictor and all the other cells of that device test it. Prints mean ± std over the seeds of Acc@10% and Spearman's rho per predictor and device, beside the
targets of issue 4 (pixel2 0.48, raspi4 0.65, titan_rtx_1 0.95, gold_6226 0.96, eyeriss 0.99).

Run: .venv/bin/python benchmarks/bench_predict_accuracy.py [--devices gold_6226,pixel2]
     [--predictors catboost-bag-cal,catboost-bag] [--seeds 0,1,2,3,4]
``catboost-bag-cal`` (the default's first predictor) is ``catboost-bag`` with its point prediction scaled by a
factor fitted on its out-of-bag predictions to maximise Acc@10% (:mod:`leti.predict.calibrated`).
About 1.5 minutes per device on a busy 2-core machine with the defaults.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from leti.predict.base import make_predictor
from leti.predict.data import load_dataset
from leti.predict.evaluate import expand
from leti.predict.metrics import acc_at, spearman

ROOT = Path(__file__).resolve().parents[1]
TARGETS = {"pixel2": 0.48, "raspi4": 0.65, "titan_rtx_1": 0.95, "gold_6226": 0.96, "eyeriss": 0.99}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices", default="gold_6226,pixel2")
    ap.add_argument("--predictors", default="catboost-bag-cal,catboost-bag")
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--train-size", type=int, default=1000)
    args = ap.parse_args()
    specs = expand(args.predictors)
    seeds = [int(s) for s in args.seeds.split(",")]
    print(f"{'device':12s} {'predictor':16s} {'Acc@10%':>16s} {'target':>7s} {'Spearman':>16s}")
    for dev in args.devices.split(","):
        (data,) = load_dataset(ROOT / "datasets" / "nb201_latency.parquet", dev)
        y = data.latency_ms
        for spec in specs:
            acc, rho = [], []
            for seed in seeds:
                order = np.random.default_rng(seed).permutation(len(y))
                tr, te = order[:args.train_size], order[args.train_size:]
                model = make_predictor(spec, random_state=seed).fit(data.cells.take(tr), y[tr])
                p = model.predict(data.cells.take(te))
                acc.append(acc_at(y[te], p))
                rho.append(spearman(y[te], p))
            print(f"{dev:12s} {spec:16s} {np.mean(acc):.4f} ± {np.std(acc):.4f} {TARGETS.get(dev, float('nan')):7.2f} "
                  f"{np.mean(rho):.4f} ± {np.std(rho):.4f}", flush=True)


if __name__ == "__main__":
    main()
