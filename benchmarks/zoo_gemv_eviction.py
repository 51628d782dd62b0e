"""Diagnosis (issue 16): does a kernel predictor miss the cost of one-pixel kernels' weights in a network?

A kernel with one output pixel (a classifier, a squeeze-excite or head 1x1 convolution at batch one) reads each
weight once per inference. Timed alone, again and again, its weights stay in the cache; in a network whose working
set exceeds the cache they come from memory every time. This script adds ``k · gemv_mb · lost(C)`` to a predictor's
zoo predictions — ``gemv_mb`` the MB of weights of the model's one-pixel kernels, ``lost(C)`` the evicted-term ramp
(:func:`~leti.predict.kernels.overhead.eviction_ramp`: 0 below C/2 MB of model weights, 1 from C MB) — and prints
Acc@10 on the zoo's dev and test splits
(:func:`bench_kernels_zoo.zoo_split`) for a grid of C and k, and the same term's leave-one-out error on the
predictor's own calibration networks (what a build could choose it by).

Run: PYTHONPATH=. .venv/bin/python benchmarks/zoo_gemv_eviction.py --predictor kp --zoo zoo \\
         --results benchmarks/results/zoo_kernels_engine_cpu_session19.json
(``--results``: ``bench_kernels_zoo.py --json`` rows of the same predictor: measured latency per model.)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_kernels_zoo import zoo_split  # noqa: E402

from leti.predict.kernels.model import load_kernel_predictor  # noqa: E402
from leti.predict.kernels.overhead import Overhead, eviction_ramp, model_aggregates  # noqa: E402
from leti.predict.kernels.split import split_model  # noqa: E402


def gemv_mb(rows: pd.DataFrame, index: pd.Index) -> np.ndarray:
    """MB of weights of each model's kernels with one output pixel."""
    w = rows.bytes_weights.to_numpy(float)
    pix = rows.output_h.to_numpy(float) * rows.output_w.to_numpy(float)
    return pd.Series(np.where(pix <= 1, w, 0.0) / 1e6, index=rows.index).groupby(rows.model).sum().reindex(index).to_numpy()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--predictor", required=True)
    ap.add_argument("--zoo", required=True, help="folder of the zoo's model files")
    ap.add_argument("--results", required=True, help="bench_kernels_zoo.py --json rows (measured_ms per model)")
    args = ap.parse_args()
    p = load_kernel_predictor(args.predictor)
    res = pd.DataFrame(json.loads(Path(args.results).read_text())).set_index("model")
    table = pd.concat([split_model(str(Path(args.zoo) / m), p.rules, device=p.device).assign(model=m) for m in res.index],
                      ignore_index=True)
    rows = p.predict_kernels(table, allow_unknown=True, where="zoo")
    agg = model_aggregates(rows, rows["predicted_ms"].to_numpy())
    g, base = gemv_mb(rows, agg.index), p.overhead.predict(agg)
    y = res.measured_ms.reindex(agg.index).to_numpy()
    split = np.array([zoo_split(m) for m in agg.index])
    acc = lambda pred, m: 100 * float(np.mean(np.abs(pred[m] / y[m] - 1) <= 0.1))  # noqa: E731
    print(f"predictor {args.predictor}: overhead {' + '.join(p.overhead.terms)}; {len(y)} zoo models")
    print(f"{'C (MB)':>7s} {'k (ms/MB)':>10s} {'dev':>6s} {'test':>6s} {'all':>6s}")
    print(f"{'-':>7s} {0.0:10.2f} {acc(base, split == 'dev'):6.1f} {acc(base, split == 'test'):6.1f} "
          f"{acc(base, split != ''):6.1f}")
    for c in (8, 16, 32, 64):
        for k in (0.02, 0.04, 0.06):
            pred = base + k * g * eviction_ramp(agg.weights_mb.to_numpy(), c)
            print(f"{c:7d} {k:10.2f} {acc(pred, split == 'dev'):6.1f} {acc(pred, split == 'test'):6.1f} "
                  f"{acc(pred, split != ''):6.1f}")
    # the calibration networks: the same term's coefficient fitted beside the chosen overhead's terms
    folder = Path(args.predictor)
    nk, nets = pd.read_parquet(folder / "network_kernels.parquet"), pd.read_parquet(folder / "networks.parquet")
    nrows = p.predict_kernels(nk, allow_unknown=True, where="calibration networks")
    nagg = model_aggregates(nrows, nrows["predicted_ms"].to_numpy())
    ny = nets.set_index("model").latency_ms.loc[nagg.index].to_numpy()
    ng = gemv_mb(nrows, nagg.index)
    terms = [t for t in p.overhead.terms if not t.startswith("ms:")]
    print(f"\ncalibration networks ({len(ny)}): leave-one-out log RMS and coefficients, terms {' + '.join(terms)} [+ term]")
    for c in (None, 8, 16, 32):
        a = Overhead._design(nagg, terms)
        if c is not None:
            a = np.column_stack([a, ng * eviction_ramp(nagg.weights_mb.to_numpy(), c)])
        r = Overhead._loo_residuals(a, ny)
        coef = Overhead._nnls(a, ny)
        print(f"  {'without' if c is None else f'C = {c}':10s} {np.sqrt(np.mean(r ** 2)):.4f}  k = "
              f"{coef[-1] if c is not None else 0.0:.4f} ms/MB")


if __name__ == "__main__":
    main()
