"""Where the engine stands against TFLite inside one model (issue 20): both runtimes time the same prefixes of a
``.tflite`` model, interleaved in one process, and each segment between two cuts gets both runtimes' share.

A prefix is the model cut after its first ``k`` operators (``profile_tflite_prefix.prefix_tflite``: its outputs are
every tensor a later operator reads); the engine imports the same cut file. A segment's time is the difference of two
prefixes' medians, so it includes what the segment costs after the operators before it have run (their outputs in
the caches as in the whole model), plus the difference in what ending the run there costs. Cuts every ``--step``
operators; one operator per segment is below this host's noise (a segment of 30 µs moves by as much between rounds).

    PYTHONPATH=. python benchmarks/bench_engine_segments.py --model mobilenet_v1.tflite --threads 1 --step 4
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from profile_tflite_prefix import operator_count, prefix_tflite  # noqa: E402,F401  (operator_count: also the tests')


def both_runtimes(data: bytes, threads: int):
    """A TFLite interpreter and an engine session of the same ``.tflite`` bytes, each fed the same random input and run
    once (``bench_engine_cpu``'s runners): ``(tflite's invoke, the engine's run)``, each a call of no arguments that
    runs the model again."""
    from bench_engine_cpu import engine_runner, tflite_runner

    from leti.engine.convert.from_tflite import from_tflite

    g = from_tflite(data)
    x = np.random.default_rng(0).standard_normal(g.tensors[g.inputs[0]].shape).astype(np.float32)
    tflite = tflite_runner(data, x, threads)[0]
    tflite()
    return tflite, engine_runner(g, x, threads)[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, required=True, help="a float .tflite model")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--step", type=int, default=4, help="operators per segment")
    ap.add_argument("--rounds", type=int, default=30, help="interleaved rounds (10 runs per runtime and prefix each)")
    args = ap.parse_args(argv)
    if not args.model.is_file():
        ap.error(f"no such model file: {args.model}")
    data = args.model.read_bytes()
    n = operator_count(data)
    cuts = sorted(set(list(range(args.step, n, args.step)) + [n]))
    arms = []
    for k in cuts:
        arms.append((k, *both_runtimes(data if k == n else prefix_tflite(data, k), args.threads)))
    times = {(k, r): [] for k, _, _ in arms for r in ("tflite", "engine")}
    print(f"{args.model.name}: {n} operators, cuts {cuts}, {args.threads} thread(s), {args.rounds} rounds; "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    for r in range(args.rounds):
        for k, tfl, eng in arms:
            pair = (("tflite", tfl), ("engine", eng))
            for name, f in pair if r % 2 == 0 else pair[::-1]:
                for _ in range(3):
                    f()
                t0 = time.perf_counter()
                for _ in range(10):
                    f()
                times[(k, name)].append((time.perf_counter() - t0) / 10)
    print(f"{'ops':>9} {'tflite':>8} {'engine':>8} | {'segment':>8} {'tflite':>8} {'engine':>8} {'ratio':>6}   (ms)")
    prev_t = prev_e = 0.0
    prev_k = 0
    for k, _, _ in arms:
        t, e = (float(np.median(times[(k, name)])) * 1e3 for name in ("tflite", "engine"))
        dt, de = t - prev_t, e - prev_e
        ratio = f"{de / dt:6.2f}" if dt > 0.02 else "   n/a"
        print(f"{'<= %d' % k:>9} {t:8.3f} {e:8.3f} | {'%d-%d' % (prev_k + 1, k):>8} {dt:8.3f} {de:8.3f} {ratio}")
        prev_t, prev_e, prev_k = t, e, k
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
