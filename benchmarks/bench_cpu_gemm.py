"""The CPU backend's GEMM paths side by side: LETI's own kernel (``csrc/gemm.c``, weights packed once),
MKL's SGEMM (torch's bundled MKL, see ``leti/engine/backends/cpu/blas.py``) and OpenBLAS (scipy's,
weights column-major), each as the engine runs it: row (or panel) blocks in numba's pool, BLAS held to
one thread per block, with the bias + ReLU6 epilogue. Shapes: MobileNet v2 224's pointwise convolutions, ResNet50's and NB101's
larger products (an im2col included). Timings are interleaved per shape so that CPU drift hits every
path alike; the figure per shape is the median. A path that is unavailable prints ``n/a``. ``narrow`` is LETI's kernel
with one panel per AVX2 tile (``ckernels.set_pair_panels(False)``, ``set_wide_tail(False)``); ``narrow/leti`` is the
median of its per-round time ratios to the default tiles (two full panels, 4 x 24 over a last panel and a half one).

    .venv/bin/python benchmarks/bench_cpu_gemm.py [--threads 1] [--rounds 15]
"""

from __future__ import annotations

import argparse
import os
import time
from functools import partial

import numba
import numpy as np
from threadpoolctl import threadpool_limits

from leti.engine.backends.cpu import blas, ckernels
from leti.engine.backends.cpu import gemm as G
from leti.engine.backends.cpu import kernels as K

# (rows, k, n): MobileNet v2 224's pointwise convolutions (one per distinct shape), then larger products
SHAPES = [(112 * 112, 32, 16), (112 * 112, 16, 96), (56 * 56, 96, 24), (56 * 56, 24, 144), (56 * 56, 144, 24),
          (28 * 28, 144, 32), (28 * 28, 32, 192), (28 * 28, 192, 32), (14 * 14, 192, 64), (14 * 14, 64, 384),
          (14 * 14, 384, 96), (14 * 14, 96, 576), (7 * 7, 576, 160), (7 * 7, 160, 960), (7 * 7, 960, 320),
          (7 * 7, 320, 1280),
          (56 * 56, 64, 256), (28 * 28, 512, 128), (14 * 14, 1024, 256), (7 * 7, 2048, 512), (32 * 32, 1152, 128),
          (8 * 8, 4608, 512)]


def wide_tiles(on: bool, fn) -> None:
    """fn with the AVX2 tiles wider than one panel on or off (``ckernels.set_pair_panels``, ``set_wide_tail``; both
    paths pay the switches)"""
    ckernels.set_pair_panels(on)
    ckernels.set_wide_tail(on)
    fn()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    numba.set_num_threads(args.threads)
    threadpool_limits(1, user_api="blas")  # as the engine runs them: one BLAS thread per numba block
    rng = np.random.default_rng(0)
    paths = ["leti", "narrow", "mkl", "openblas"]
    lib = ckernels.library() is not None
    avail = {"leti": lib, "narrow": lib, "mkl": blas.mkl() is not None, "openblas": True}
    print(f"load average before: {os.getloadavg()[0]:.2f}; threads {args.threads}; GFLOP/s per path "
          f"(median of {args.rounds} interleaved rounds)")
    for p in paths:
        if not avail[p]:
            print(f"n/a {p}: {ckernels.reason if p.startswith('leti') else 'no MKL (torch without MKL, or LETI_BLAS)'}")
    print(f"{'rows':>6} {'k':>5} {'n':>5} " + " ".join(f"{p:>9}" for p in paths) + f" {'mkl/leti':>9} {'narrow/leti':>11}")
    total = dict.fromkeys(paths, 0.0)
    for m, k, n in SHAPES:
        a = rng.standard_normal((m, k)).astype(np.float32)
        w = rng.standard_normal((k, n)).astype(np.float32)
        bias = rng.standard_normal(n).astype(np.float32)
        y = {p: np.empty((m, n), np.float32) for p in paths}
        run = {"openblas": partial(K.gemm_bias_act, a, np.asfortranarray(w), y["openblas"], bias, True, 2, args.threads)}
        if avail["mkl"]:
            run["mkl"] = partial(K.gemm_mkl_bias_act, a, w, y["mkl"], bias, True, 2, args.threads, blas.ONE_THREAD)
        if avail["leti"]:
            for p, pairs in (("leti", True), ("narrow", False)):
                run[p] = partial(wide_tiles, pairs, partial(G.gemm_leti_bias_act, a, ckernels.pack(w), y[p],
                                                               ckernels.pad_bias(bias, n), True, 2, args.threads,
                                                               np.zeros((1, 1), np.float32), False))
        for p, f in run.items():
            f()
            assert np.allclose(y[p], y["openblas"], rtol=1e-3, atol=1e-3), p
        times = {p: [] for p in run}
        for _ in range(args.rounds):
            for p, f in run.items():
                t0 = time.perf_counter()
                f()
                times[p].append(time.perf_counter() - t0)
        med = {p: float(np.median(v)) for p, v in times.items()}
        for p in med:
            total[p] += med[p]
        cells = " ".join(f"{2 * m * k * n / med[p] / 1e9:9.1f}" if p in med else f"{'n/a':>9}" for p in paths)
        ratio = f"{med['mkl'] / med['leti']:8.2f}x" if "mkl" in med and "leti" in med else f"{'':>9}"
        pair = f"{float(np.median(np.array(times['narrow']) / np.array(times['leti']))):10.2f}x" if "leti" in med else ""
        print(f"{m:6d} {k:5d} {n:5d} {cells} {ratio} {pair}")
    ckernels.set_pair_panels(True)
    ckernels.set_wide_tail(True)
    print("sum of medians (ms): " + ", ".join(f"{p} {total[p] * 1e3:.2f}" for p in paths if avail[p]))
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
