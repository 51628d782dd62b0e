"""The CPU backend's two GEMM paths side by side on MobileNet v2's 1×1 convolution shapes.

OpenBLAS (scipy's, weights column-major) against MKL's SGEMM (torch's bundled MKL, see
``leti/engine/backends/cpu/blas.py``), both as the engine runs them:
row blocks in numba's pool with the bias + ReLU6 epilogue. Timings are interleaved per shape so
that CPU drift hits both paths alike; the figure per shape is the median.

    .venv/bin/python benchmarks/bench_cpu_gemm.py [--threads 1] [--rounds 15]
"""

from __future__ import annotations

import argparse
import time
from functools import partial

import numba
import numpy as np

from leti.engine.backends.cpu import blas
from leti.engine.backends.cpu import kernels as K

# (rows, k, n) of MobileNet v2 224's pointwise convolutions (one per distinct shape)
SHAPES = [(112 * 112, 32, 16), (112 * 112, 16, 96), (56 * 56, 96, 24), (56 * 56, 24, 144), (56 * 56, 144, 24),
          (28 * 28, 144, 32), (28 * 28, 32, 192), (28 * 28, 192, 32), (14 * 14, 192, 64), (14 * 14, 64, 384),
          (14 * 14, 384, 96), (14 * 14, 96, 576), (7 * 7, 576, 160), (7 * 7, 160, 960), (7 * 7, 960, 320),
          (7 * 7, 320, 1280)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    if blas.mkl() is None:
        raise SystemExit("no MKL found (torch without MKL, or LETI_BLAS=openblas): nothing to compare")
    numba.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    print(f"threads {args.threads}; GFLOP/s per path (median of {args.rounds} interleaved rounds)")
    print(f"{'rows':>6} {'k':>4} {'n':>5} {'openblas':>9} {'mkl':>7} {'speed-up':>8}")
    total = {"openblas": 0.0, "mkl": 0.0}
    for m, k, n in SHAPES:
        a = rng.standard_normal((m, k)).astype(np.float32)
        w = rng.standard_normal((k, n)).astype(np.float32)
        bias = rng.standard_normal(n).astype(np.float32)
        wf = np.asfortranarray(w)
        y = {p: np.empty((m, n), np.float32) for p in total}
        run = {"openblas": partial(K.gemm_bias_act, a, wf, y["openblas"], bias, True, 2, args.threads),
               "mkl": partial(K.gemm_mkl_bias_act, a, w, y["mkl"], bias, True, 2, args.threads, blas.ONE_THREAD)}
        for f in run.values():
            f()
        assert np.allclose(y["openblas"], y["mkl"], rtol=1e-3, atol=1e-3)
        times = {p: [] for p in run}
        for _ in range(args.rounds):
            for p, f in run.items():
                t0 = time.perf_counter()
                f()
                times[p].append(time.perf_counter() - t0)
        med = {p: float(np.median(v)) for p, v in times.items()}
        for p in total:
            total[p] += med[p]
        gf = {p: 2 * m * k * n / med[p] / 1e9 for p in med}
        print(f"{m:6d} {k:4d} {n:5d} {gf['openblas']:9.1f} {gf['mkl']:7.1f} {med['openblas'] / med['mkl']:7.2f}x")
    print(f"sum of medians: openblas {total['openblas'] * 1e3:.2f} ms, mkl {total['mkl'] * 1e3:.2f} ms "
          f"({total['openblas'] / total['mkl']:.2f}x)")


if __name__ == "__main__":
    main()
