"""Throughput of the predictor API: cells per second in batch, and single-cell latency.

Every predictor is fitted on 1,000 raspi4 cells of datasets/nb201_latency.parquet (the GCN with the
paper's 4×600 layers but few epochs: training length does not change prediction cost), then asked for
* batch, table: ``predict(table)`` on a prebuilt CellTable of all 15,625 NB201 cells (features + model);
* batch, raw: ``predict(list_of_arch_strings)`` (parsing and costs included);
* single: ``predict([arch])`` for one cell, median of repeated calls;
and, for NB101, ``predict(space)`` on 100,000 cells of the enumerated space (a separate fit on NASLib cells
with a synthetic target, since no NB101 latency data ships with LETI: only the speed is measured).
Batch figures are the best of ``--repeat`` wall-clock runs with 1 thread ("1t") and 2 threads ("2t":
``n_jobs``/``threads`` = 2); "1t cpu" divides by the process CPU time of the best 1-thread run instead,
which is what the code costs when the shared machine's other jobs preempt it. ``gcn:precision=bfloat16``
is the opt-in bfloat16 GCN.

Run: .venv/bin/python benchmarks/bench_predict_api.py [--predictors flops,xgboost,...] [--repeat 3]
(a predictor may carry parameters, ``gcn:hidden=128``; separate such specs with ';').
Targets (issue 4): >= 100,000 cells/s in batch for the boosting predictors, >= 10,000 for the GCN,
single-cell prediction under 1 ms.

``--gcn-nb101 N`` (default 100,000; 0 skips) adds the GCN line of issue 20: the default 4×600 GCN fitted
on the measured NB101 cells of datasets/nb101_local_cpu.parquet (``--gcn-epochs``, default 30: the
fast path leaves dead ReLU units out of its products, so the weights, not only the shapes, set the
cost; or ``--gcn-model`` a saved predictor), then ``predict`` on a prebuilt CellTable of N NB101 cells
on one thread, printed as cells per wall second and per CPU second of the thread, with the load
average. ``--only-gcn-nb101`` prints just that line.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd

from leti.predict.base import make_predictor
from leti.spaces.search_space import NB101Space, as_table

ROOT = Path(__file__).resolve().parents[1]
NAMES = ["flops", "ransac", "ransac_cluster", "xgboost", "xgboost-rich", "lightgbm", "lightgbm-rich", "catboost",
         "catboost-rich", "gcn", "gcn-flops", "gcn:precision=bfloat16", "gcn:hidden=128"]
FAST_FIT = {"gcn": {"epochs": 3}, "gcn-flops": {"epochs": 3}}


def build(spec: str):
    """``name`` or ``name:param=value,...`` (values as int/float when they parse)."""
    name, _, rest = spec.partition(":")
    params = dict(FAST_FIT.get(name, {}))
    for item in filter(None, rest.split(",")):
        k, _, v = item.partition("=")
        for cast in (int, float, str):
            try:
                params[k] = cast(v)
                break
            except ValueError:
                pass
    return make_predictor(name, **params)


def best_of(fn, repeat: int) -> float:
    return best_with_cpu(fn, repeat)[0]


def best_with_cpu(fn, repeat: int) -> tuple[float, float]:
    """(best wall seconds, process CPU seconds of that run)."""
    best = (float("inf"), float("inf"))
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        fn()
        best = min(best, (time.perf_counter() - t, time.process_time() - c))
    return best


def set_threads(model, n: int) -> None:
    params = model.get_params()
    for key in ("n_jobs", "threads"):
        if key in params:
            model.set_params(**{key: n})


def gcn_nb101(n: int, epochs: int, model_path: str | None, repeat: int) -> None:
    """Issue 20's figure: GCN ``predict`` on a CellTable of ``n`` NB101 cells, one thread."""
    import os

    import torch

    from leti.predict.base import load_predictor
    from leti.predict.data import load_dataset
    from leti.spaces.enumeration import enumerate_space

    torch.set_num_threads(1)
    if model_path:
        model, source = load_predictor(model_path), model_path
    else:
        data = load_dataset(ROOT / "datasets" / "nb101_local_cpu.parquet")[0]
        t0 = time.perf_counter()
        model = make_predictor("gcn", epochs=epochs, threads=1).fit(data.cells, data.latency_ms)
        source = f"fitted on {len(data.cells)} cells of nb101_local_cpu.parquet, {epochs} epochs, {time.perf_counter() - t0:.0f} s"
    table = model.table(enumerate_space().sample(n, seed=0))
    model.predict(table.take(np.arange(min(n, 2000))))  # compile / warm up
    best = (float("inf"), float("inf"))
    for _ in range(repeat):
        t, c = time.perf_counter(), time.thread_time()
        model.predict(table)
        best = min(best, (time.perf_counter() - t, time.thread_time() - c), key=lambda b: b[1])
    print(f"GCN NB101 predict(CellTable of {n:,}), 1 thread: {n / best[0]:,.0f} cells/s wall, "
          f"{n / best[1]:,.0f} cells/s CPU (thread)  [{source}; load avg {'%.2f %.2f %.2f' % os.getloadavg()}; "
          f"target >= 10,000]", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--predictors", default=";".join(NAMES))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--nb101", type=int, default=100_000, help="NB101 cells for the Space batch (0: skip)")
    ap.add_argument("--gcn-nb101", type=int, default=100_000, help="NB101 cells for the GCN line of issue 20 (0: skip)")
    ap.add_argument("--gcn-epochs", type=int, default=30, help="epochs of that GCN's fit")
    ap.add_argument("--gcn-model", default=None, help="a saved GCN predictor to use instead of fitting one")
    ap.add_argument("--only-gcn-nb101", action="store_true", help="print only the GCN NB101 line")
    args = ap.parse_args()
    if args.gcn_nb101:
        gcn_nb101(args.gcn_nb101, args.gcn_epochs, args.gcn_model, max(2, args.repeat))
    if args.only_gcn_nb101:
        return
    names = [n for part in args.predictors.split(";") for n in ([part] if ":" in part else part.split(",")) if n]

    d = pd.read_parquet(ROOT / "datasets" / "nb201_latency.parquet")
    d = d[d.device == "raspi4"].reset_index(drop=True)
    archs = list(d.arch)
    y = d.latency_ms.to_numpy()
    train = np.random.default_rng(0).permutation(len(y))[:1000]
    n = len(archs)
    t_table = best_of(lambda: as_table(archs), args.repeat)
    table = as_table(archs)
    print(f"NB201 CellTable from {n} arch strings: {n / t_table:,.0f} cells/s")

    space101 = None
    if args.nb101:
        from leti.spaces.cell import Cell
        from leti.spaces.enumeration import enumerate_space

        space101 = enumerate_space().sample(args.nb101, seed=0)
        t101 = best_of(lambda: NB101Space().table(space101), 1)
        print(f"NB101 CellTable from a Space of {args.nb101}: {args.nb101 / t101:,.0f} cells/s")
        nas = pd.read_parquet(ROOT / "datasets" / "nb101_naslib500.parquet")
        cells101 = [Cell([list(r) for r in m], list(o)) for m, o in zip(nas.matrix, nas.ops)]
        t = as_table(cells101)
        y101 = 1.0 + t.flops / 1e8 + t.peak_memory / 1e7  # synthetic: for timing only

    print(f"\n{'predictor':22s} {'fit s':>6s} {'table 1t':>10s} {'1t cpu':>10s} {'table 2t':>10s} {'raw 1t':>10s} "
          f"{'single ms':>9s}" + (f" {'NB101 1t':>10s} {'NB101 2t':>10s}" if space101 is not None else ""))
    for name in names:
        t0 = time.perf_counter()
        model = build(name).fit(table.take(train), y[train])
        fit_s = time.perf_counter() - t0
        model.predict(table)  # compile / warm up
        tb, cpu = best_with_cpu(lambda: model.predict(table), args.repeat)
        raw = best_of(lambda: model.predict(archs), args.repeat)
        set_threads(model, 2)
        tb2 = best_of(lambda: model.predict(table), args.repeat)
        set_threads(model, 1)
        one = [archs[0]]
        model.predict(one)
        singles = []
        for i in range(200):
            t = time.perf_counter()
            model.predict([archs[i]])
            singles.append(time.perf_counter() - t)
        line = (f"{name:22s} {fit_s:6.1f} {n / tb:10,.0f} {n / cpu:10,.0f} {n / tb2:10,.0f} {n / raw:10,.0f} "
                f"{1e3 * np.median(singles):9.3f}")
        if space101 is not None:
            m101 = build(name).fit(cells101, y101)
            m101.predict(cells101[:20])
            t101 = best_of(lambda: m101.predict(space101), 2)
            set_threads(m101, 2)
            t101b = best_of(lambda: m101.predict(space101), 2)
            line += f" {args.nb101 / t101:10,.0f} {args.nb101 / t101b:10,.0f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
