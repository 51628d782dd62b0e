"""What one core can do: the single-precision FMA peak of this host, measured (issue 20's ceiling for products).

Compiles a loop of 24 independent fused multiply-adds on the widest vectors the CPU has (AVX-512 where it has avx512f,
else AVX2 + FMA) with the system's C compiler and runs it ``--repeats`` times on one thread; prints GFLOP/s (2 per FMA
lane) per repeat and their median. A product kernel at this figure has nothing left to gain on this host at the same
clock; the VM's clock moves by several percent within minutes, so compare it with kernels timed in the same minutes.

    python benchmarks/bench_fma_peak.py [--repeats 5] [--iterations 20000000]

Session 43 (Zen 5 VM): 228-230 GFLOP/s; MobileNet v1's 14×14×512 products ran at 229 in the network then.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE = r"""
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#ifdef WIDE
typedef __m512 V;
#define SET1 _mm512_set1_ps
#define FMA _mm512_fmadd_ps
#define LANES 16
static float sum(V v) { return _mm512_reduce_add_ps(v); }
#else
typedef __m256 V;
#define SET1 _mm256_set1_ps
#define FMA _mm256_fmadd_ps
#define LANES 8
static float sum(V v) { float t[8]; _mm256_storeu_ps(t, v); return t[0] + t[7]; }
#endif
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
int main(int argc, char **argv) {
    long n = atol(argv[1]);
    int repeats = atoi(argv[2]);
    V a[24], b = SET1(0.999999f), c = SET1(1e-7f);
    for (int i = 0; i < 24; ++i) a[i] = SET1((float)i);
    for (int r = 0; r < repeats; ++r) {
        double t = now();
        for (long k = 0; k < n; ++k) {
#pragma GCC unroll 24
            for (int i = 0; i < 24; ++i) a[i] = FMA(a[i], b, c);
        }
        t = now() - t;
        float s = 0;
        for (int i = 0; i < 24; ++i) s += sum(a[i]);
        printf("%.2f %g\n", n * 24.0 * LANES * 2 / t / 1e9, s);
    }
    return 0;
}
"""


def has_avx512() -> bool:
    try:
        return " avx512f" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def measure(repeats: int = 5, iterations: int = 20_000_000) -> list[float]:
    """GFLOP/s of each repeat, sorted; RuntimeError with the compiler's message where the loop cannot be built."""
    wide = has_avx512()
    with tempfile.TemporaryDirectory(prefix="leti_fma_") as d:
        src, exe = Path(d) / "peak.c", Path(d) / "peak"
        src.write_text(SOURCE)
        flags = ["-mavx512f", "-DWIDE"] if wide else ["-mavx2", "-mfma"]
        try:
            subprocess.run(["cc", "-O2", *flags, str(src), "-o", str(exe)], check=True, capture_output=True, text=True)
        except (OSError, subprocess.CalledProcessError) as e:
            raise RuntimeError(f"could not build the FMA loop with cc: {getattr(e, 'stderr', '') or e}".strip()) from e
        out = subprocess.run([str(exe), str(iterations), str(repeats)], check=True, capture_output=True,
                             text=True).stdout
    return sorted(float(line.split()[0]) for line in out.splitlines())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=20_000_000, help="loop trips per repeat (24 FMAs each)")
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.iterations < 1:
        ap.error("--repeats and --iterations must be positive")
    try:
        rates = measure(args.repeats, args.iterations)
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"load average {os.getloadavg()[0]:.2f}; {'AVX-512' if has_avx512() else 'AVX2'} FMAs, one thread")
    print("GFLOP/s per repeat: " + " ".join(f"{r:.1f}" for r in rates))
    print(f"FMA peak: {rates[len(rates) // 2]:.1f} GFLOP/s (median)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
