"""Every kernel of a model timed alone (issue 16): where a kernel predictor's error on a model comes from.

For each model file the script splits the graph into the kernels the predictor's runtime runs, builds each kernel
as a single-kernel model (:func:`~leti.predict.kernels.sampler.config_from_row`), times it with the kernel build's
protocol against the build's reference kernel (:class:`~leti.predict.kernels.bench.KernelBench`) and turns the
ratio into ms the way the build does (:func:`~leti.predict.kernels.build_fit.kernel_ms`). It prints, per
model, the measured latency (when ``--dataset`` gives it), the sum of its kernels timed alone and the predictor's
sum of the same kernels: a model far from the sum of its own kernels points at the overhead model (what a network
costs beyond its kernels: caches, invokes); a predicted sum far from the measured one points at the kernel
regressors. ``--out`` keeps every kernel's row (predicted and measured ms) as Parquet.

    PYTHONPATH=. python benchmarks/bench_kernels_alone.py --predictor kp/ --models zoo/a.tflite zoo/b.tflite \\
        --dataset datasets/zoo_local_cpu_quiet.parquet --out alone.parquet

Look only at models a predictor's choices may see (the zoo's ``dev`` split, or models outside the zoo): this times
real kernels of the models it is given. Session 13 used it on 15 dev-split zoo models; what it found is in
``benchmarks/results/zoo_kernels_local_cpu.md``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--predictor", type=Path, required=True, help="a kernel build's folder (its kernels.sqlite too)")
    ap.add_argument("--models", type=Path, nargs="+", required=True)
    ap.add_argument("--dataset", type=Path, default=None, help="measured latencies (a leti export with corrected_ms)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)

    from leti.device.registry import open_device
    from leti.errors import LetiError
    from leti.predict.kernels.bench import KernelBench
    from leti.predict.kernels.build_fit import invoke_ms, kernel_ms, reference_ms
    from leti.predict.kernels.build_store import BuildStore
    from leti.predict.kernels.model import load_kernel_predictor
    from leti.predict.kernels.sampler import config_from_row
    from leti.predict.kernels.split import split_model

    pred = load_kernel_predictor(args.predictor)
    with BuildStore(args.predictor / "kernels.sqlite") as store:
        ref = reference_ms(store)
        empty = invoke_ms(store, ref)
    measured = {}
    if args.dataset is not None:
        df = pd.read_parquet(args.dataset)
        measured = df.groupby("model")["corrected_ms"].median().to_dict()
    load0 = os.getloadavg()[0]
    dev = open_device(pred.device, threads=1)
    bench = KernelBench(dev, Path(os.environ.get("TMPDIR", "/tmp")) / f"kernels_alone_{os.getpid()}")
    rows = []
    print(f"{'model':<44}{'measured':>10}{'alone sum':>11}{'pred sum':>10}{'model/alone':>13}{'pred/alone':>12}"
          f"{'built':>8}")
    for path in args.models:
        table = split_model(path, pred.rules, device=pred.device)
        kern = pred.predict_kernels(table, allow_unknown=True, where=str(path))
        alone = np.full(len(kern), np.nan)
        for i, r in enumerate(kern.to_dict("records")):
            cfg = config_from_row(r)
            if cfg is None:
                continue
            try:
                alone[i] = kernel_ms(bench.kernel(cfg, seed=i, stem=f"k{i}").ratio, ref, empty)
            except LetiError as exc:
                print(f"  {path.name} kernel {i} ({r['kernel_type']}): {exc}", file=sys.stderr)
        kern = kern.assign(alone_ms=alone, file=path.name)
        rows.append(kern)
        ok = np.isfinite(alone)
        m = measured.get(path.name, np.nan)
        a, p = float(alone[ok].sum()), float(kern.predicted_ms.to_numpy()[ok].sum())
        print(f"{path.name:<44}{m:>10.3f}{a:>11.3f}{p:>10.3f}{m / a:>13.3f}{p / a:>12.3f}{f'{ok.sum()}/{len(ok)}':>8}",
              flush=True)
    bench.close()
    print(f"reference {ref:.4f} ms, per-invoke {empty * 1e3:.2f} µs; load average {load0:.1f} -> {os.getloadavg()[0]:.1f}; "
          f"{time.process_time():.0f} s of CPU")
    if args.out is not None:
        pd.concat(rows, ignore_index=True).to_parquet(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
