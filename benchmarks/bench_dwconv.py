"""The engine's 3×3 depthwise C kernel alone (issue 20): MobileNet v1/v2's depthwise shapes, one thread.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_dwconv.py [--against REV] [--rounds 7]

Builds ``leti/engine/backends/cpu/csrc/dwconv.c`` of the working tree (and, with ``--against``, the same file
at a git revision) into shared libraries of their own and calls ``leti_dwconv3x3`` through ctypes on each
shape, padded ('same', as the networks run it) and on an input already two pixels larger (no border pixels),
the libraries interleaved in one process: best of ``--rounds`` blocks of repeated calls. Prints milliseconds
and GFLOP/s per shape (18 FLOP per output value), the new / old ratio, and checks that the outputs agree.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from leti.engine.backends.cpu.ckernels import dw3x3_weights

ROOT = Path(__file__).resolve().parents[1]
CSRC = ROOT / "leti/engine/backends/cpu/csrc"
#: (map, channels, stride): MobileNet v2's depthwise shapes at 224, then v1's that v2 does not have
SHAPES = ((112, 32, 1), (112, 96, 2), (56, 144, 1), (56, 144, 2), (28, 192, 1), (28, 192, 2), (14, 384, 1),
          (14, 576, 1), (14, 576, 2), (7, 960, 1), (112, 64, 2), (56, 128, 1), (56, 128, 2), (28, 256, 1),
          (28, 256, 2), (14, 512, 1), (14, 512, 2), (7, 1024, 1))


def build(source: str, tmp: Path, name: str):
    src = tmp / f"{name}.c"
    src.write_text(source)
    lib = tmp / f"{name}.so"
    # gemm.c of the working tree: the switch between the AVX2 and AVX-512 kernels (leti_set_avx512) lives there, and
    # it calls window512.c's tiles. -Bsymbolic: the library's calls to its own functions (leti_dwconv3x3_band) stay in
    # it; without, they went to the engine's library, which importing leti loads into the process's global scope
    subprocess.run(["cc", "-O3", "-mavx2", "-mfma", "-std=gnu11", "-shared", "-fPIC", "-Wl,-Bsymbolic", "-I", str(CSRC),
                    str(src), str(CSRC / "gemm.c"), str(CSRC / "window512.c"), "-o", str(lib)], check=True)
    f = ctypes.CDLL(str(lib)).leti_dwconv3x3
    f.restype, f.argtypes = None, [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 14
    return f


def time_call(f, args, reps: int) -> float:
    t = time.perf_counter()
    for _ in range(reps):
        f(*args)
    return (time.perf_counter() - t) / reps * 1e3


def aligned(a: np.ndarray) -> np.ndarray:
    """``a`` copied to a 64-byte boundary, as the engine's arena places every tensor (a 512-bit load from a pointer
    only 16 bytes aligned spans two cache lines)."""
    raw = np.empty(a.nbytes + 64, np.uint8)
    off = -raw.ctypes.data % 64
    out = raw[off:off + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", default=None, help="a git revision whose dwconv.c is timed beside the working tree's")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; one thread")
    with tempfile.TemporaryDirectory(prefix="leti_dw_") as d:
        tmp = Path(d)
        libs = [("new", build((CSRC / "dwconv.c").read_text(), tmp, "new"))]
        if args.against:
            old = subprocess.run(["git", "show", f"{args.against}:leti/engine/backends/cpu/csrc/dwconv.c"], cwd=ROOT,
                                 check=True, capture_output=True, text=True).stdout
            libs.insert(0, (args.against, build(old, tmp, "old")))
        names = " / ".join(n for n, _ in libs)
        print(f"{'shape':>18} {'padding':>8}  ms ({names}){'':8} GFLOP/s" + ("   new/old" if args.against else ""))
        rng = np.random.default_rng(0)
        for h, c, s in SHAPES:
            for pad in (1, 0):
                hh = h if pad else h + 2
                oh = (h - 1) // s + 1
                x = aligned(rng.random((1, hh, hh, c), dtype=np.float32))
                b = aligned(rng.random(c, dtype=np.float32))
                # the taps, then their packed copy (ckernels.dw3x3_weights); a revision before the packed path reads
                # the first 9 c floats only
                w = aligned(dw3x3_weights(rng.random((9, c), dtype=np.float32), b))
                ys = [aligned(np.full((1, oh, oh, c), np.nan, np.float32)) for _ in libs]
                calls = [(x.ctypes.data, y.ctypes.data, w.ctypes.data, b.ctypes.data, hh, hh, c, oh, oh, s, s, 1, 1,
                          pad, pad, 2, 0, oh) for y in ys]
                reps = max(20, int(4e6 / (oh * oh * c)))
                best = [float("inf")] * len(libs)
                for _ in range(args.rounds):
                    for i, (_, f) in enumerate(libs):
                        best[i] = min(best[i], time_call(f, calls[i], reps))
                for y in ys[1:]:
                    assert np.allclose(y, ys[0], rtol=1e-5, atol=1e-5), f"outputs differ on {h}x{h}x{c} s{s}"
                gf = oh * oh * c * 18 / 1e6
                ms = " / ".join(f"{v:.4f}" for v in best)
                rate = " / ".join(f"{gf / v:.0f}" for v in best)
                ratio = f"   {best[-1] / best[0]:.2f}" if args.against else ""
                print(f"{f'{h}x{h}x{c} s{s}':>18} {'same' if pad else 'none':>8}  {ms:>24} {rate:>10}{ratio}", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
