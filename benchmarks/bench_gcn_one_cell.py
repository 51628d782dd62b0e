"""GCN one-cell calls (the NAS loop: ``predict`` on one cell at a time) with and without the proved-dead units of
:mod:`leti.predict.gcn_infer`, paired in one process.

    PYTHONPATH=. python benchmarks/bench_gcn_one_cell.py [--model SAVED_GCN] [--epochs 30]

Fits the issue's 4x600 GCN on ``datasets/nb101_local_cpu.parquet`` (or loads ``--model``), checks 400 one-cell
predictions against the torch-geometric module (a fresh fast path: the caps learnt call by call), then times 200
one-cell calls with the proof and 200 with every unit, alternating the two blocks six times; prints each block's
median ms per call.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    import torch

    from leti.predict import gcn_infer
    from leti.predict.base import load_predictor, make_predictor
    from leti.predict.data import load_dataset
    from leti.spaces.enumeration import enumerate_space

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="a saved GCN predictor (default: fit one)")
    ap.add_argument("--epochs", type=int, default=30)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.model:
        m = load_predictor(args.model)
    else:
        data = load_dataset(ROOT / "datasets" / "nb101_local_cpu.parquet")[0]
        m = make_predictor("gcn", epochs=args.epochs, threads=1).fit(data.cells, data.latency_ms)
    cells = enumerate_space().sample(400, seed=3)
    tables = [m.table([c]) for c in cells]
    ref = m.torch_predict(cells)
    m.fast_ = None  # the caps learnt from one-cell calls only
    got = np.array([m.predict(t)[0] for t in tables])
    print(f"400 one-cell calls: largest relative difference to the torch-geometric module {np.abs(got / ref - 1).max():.1e}; "
          f"caps widened {m.fast_._cap_version} times", flush=True)
    proved = gcn_infer.DenseGCN._units
    variants = {"proof": proved, "every unit": lambda self, layer, rows, spread: np.arange(len(self._biases_np[layer]))}
    times = {k: [] for k in variants}
    try:
        for r in range(6):
            for k in (list(variants) if r % 2 else list(variants)[::-1]):
                gcn_infer.DenseGCN._units = variants[k]
                ts = []
                for t in tables[:200]:
                    s = time.perf_counter()
                    m.predict(t)
                    ts.append(time.perf_counter() - s)
                times[k].append(np.median(ts) * 1e3)
    finally:
        gcn_infer.DenseGCN._units = proved
    print("ms per one-cell call, median of 200, six alternating blocks; load avg "
          f"{'%.2f %.2f %.2f' % os.getloadavg()}")
    for k, v in times.items():
        print(f"  {k:10s} " + " ".join(f"{x:.3f}" for x in v) + f"   (median {np.median(v):.3f})")


if __name__ == "__main__":
    main()
