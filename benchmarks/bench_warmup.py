"""How long a runtime runs slow after a pause: the evidence for ``bench_engine_cpu.py``'s warm-up (issue 20).

``bench_engine_cpu.py`` interleaves the runtimes in blocks, each after a 50 ms pause (so that the workers of the
runtime before it stop spinning). On a VM whose vCPUs idle in that pause, a runtime may then run slow for a while,
and not every runtime alike. This script times TFLite (XNNPACK) and LETI's engine on one ``.tflite`` model at each
thread count, blocks of ``--runs`` timed runs after a pause of ``--pause`` seconds and either one untimed run (the
bench's protocol until session 33) or the bench's ``warm`` (untimed runs for ``WARM_S``), and prints the median of
each run position over ``--blocks`` blocks and the median over blocks of each block's median. With ``--after``, it
then times each of them right after runs of another runtime of the bench (the NumPy baseline, ncnn, ...), once after
the fixed pause and once after the bench's ``quiesce`` (the pause, then on until no thread of the process spins),
both followed by ``warm``.

    PYTHONPATH=. python benchmarks/bench_warmup.py MODEL.tflite [--threads 1 2] [--blocks 30] [--after numpy ncnn]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_engine_cpu as bench  # noqa: E402


def blocks(fn, n_blocks: int, runs: int, pause: float, warm) -> tuple[float, np.ndarray]:
    """(median over blocks of the block's median ms, median ms of each run position)."""
    times = np.zeros((n_blocks, runs))
    for b in range(n_blocks):
        time.sleep(pause)
        warm(fn)
        for r in range(runs):
            t0 = time.perf_counter()
            fn()
            times[b, r] = time.perf_counter() - t0
    times *= 1e3
    return float(np.median(np.median(times, axis=1))), np.median(times, axis=0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--blocks", type=int, default=30)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--pause", type=float, default=bench.PAUSE_S)
    ap.add_argument("--after", nargs="*", default=[], help="runtimes of the bench to time tflite and engine after")
    args = ap.parse_args()

    from leti.engine.convert.from_tflite import from_tflite
    from leti.engine.session import Session

    data = args.model.read_bytes()
    g = from_tflite(data)
    shape = Session(g, backends=("cpu",)).contexts()[0].in_shapes[0]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    print(f"{args.model.name}; load average before {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; pause "
          f"{1e3 * args.pause:.0f} ms, {args.runs} timed runs per block, {args.blocks} blocks")
    protocols = {"1 untimed run": lambda fn: fn(),
                 f"warm ({bench.WARM_RUNS}+ runs, {1e3 * bench.WARM_S:.0f} ms)": bench.warm}
    for threads in args.threads:
        runners = {"tflite": bench.tflite_runner(data, x, threads)[0], "engine": bench.engine_runner(g, x, threads)[0]}
        for fn in runners.values():
            for _ in range(10):
                fn()
        for proto, warm in protocols.items():
            for name, fn in runners.items():
                med, pos = blocks(fn, args.blocks, args.runs, args.pause, warm)
                print(f"{threads} thread(s)  {name:7s} after {proto:24s} {med:7.3f} ms   by position: "
                      + " ".join(f"{v:.3f}" for v in pos), flush=True)
        if args.after:
            after(data, g, x, threads, runners, args)
    print(f"load average after {os.getloadavg()[0]:.2f}")


def after(data: bytes, g, x: np.ndarray, threads: int, runners: dict, args) -> None:
    """Time each of ``runners`` in blocks that follow ``args.runs`` runs of another runtime of the bench, after the
    fixed pause and after ``quiesce``, both then ``warm``."""
    import tempfile

    from leti.engine import passes

    errors: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        g_opt, _ = passes.optimize(g)
        files = bench.peer_files(g_opt, Path(tmp), "m", errors)
        peers = bench.make_runners(data, g, g_opt, files, x, threads, errors)
        for prev in args.after:
            if prev not in peers:
                print(f"{prev}: not available ({errors.get(prev) or errors})")
                continue
            before = peers[prev][0]
            for label, pause in (("the 50 ms pause", lambda: time.sleep(bench.PAUSE_S)), ("quiesce", bench.quiesce)):
                for name, fn in runners.items():
                    times = []
                    for _ in range(args.blocks):
                        for _ in range(args.runs):
                            before()
                        pause()
                        bench.warm(fn)
                        t0 = time.perf_counter()
                        for _ in range(args.runs):
                            fn()
                        times.append((time.perf_counter() - t0) / args.runs)
                    print(f"{threads} thread(s)  {name:7s} after {prev} and {label:16s} "
                          f"{1e3 * float(np.median(times)):7.3f} ms", flush=True)


if __name__ == "__main__":
    main()
