"""What a model's run costs after the host has left its data alone for a while (issues 16 and 20): TFLite and LETI's
engine run the same ``.tflite`` model right after their previous run, or after the calling thread has busy-waited
``--gaps`` milliseconds (no memory traffic of its own), interleaved in one process; the median of single timed runs.

Why: on the 2-vCPU Zen 5 VMs of sessions 34-42 a run is slower when its data was last touched a few milliseconds
earlier, even when nothing of this process touched memory in between, so other tenants of the shared L3 are the
likely cause; that is one reason why a model costs more than the sum of its kernels timed back to back, by an amount
that differs between VMs. Session 42 (MobileNet v1's first five layers, per-step clock): no penalty after 1 ms, ~+45
µs after 3 ms, ~+200 µs after 10 ms, whatever ran in between (busy-waiting, 10 ms of AVX-512 products on cached data,
a sweep of 24 MB); reading the engine's arena back in before the run removed the engine's penalty.

    PYTHONPATH=. python benchmarks/bench_cache_decay.py --model mobilenet_v1.tflite --threads 1
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
from bench_engine_segments import both_runtimes  # noqa: E402


def busy_wait(ms: float) -> None:
    """Keep the thread busy for ``ms`` milliseconds without touching memory (no sleep: an idle vCPU changes more)."""
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, required=True, help="a float .tflite model")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--gaps", default="0,1,3,10,30", help="milliseconds of busy-waiting before a timed run")
    ap.add_argument("--rounds", type=int, default=100)
    args = ap.parse_args(argv)
    if not args.model.is_file():
        ap.error(f"no such model file: {args.model}")
    try:
        gaps = [float(g) for g in args.gaps.split(",")]
    except ValueError:
        ap.error(f"--gaps takes comma-separated milliseconds, not {args.gaps!r}")
    runs = dict(zip(("tflite", "engine"), both_runtimes(args.model.read_bytes(), args.threads)))
    times = {(r, g): [] for r in runs for g in gaps}
    print(f"{args.model.name}: {args.threads} thread(s), {args.rounds} rounds; load average {os.getloadavg()[0]:.2f}",
          flush=True)
    for k in range(args.rounds):
        for g in gaps:
            for name, run in (list(runs.items()) if k % 2 else list(runs.items())[::-1]):
                run()
                run()
                busy_wait(g)
                t0 = time.perf_counter()
                run()
                times[(name, g)].append(time.perf_counter() - t0)
    print(f"{'runtime':>8} " + " ".join(f"{'after %g ms' % g:>13}" for g in gaps) + "   (ms, medians; + over no gap)")
    for name in runs:
        ms = [float(np.median(times[(name, g)])) * 1e3 for g in gaps]
        cells = [f"{ms[0]:13.3f}"] + [f"{m:7.3f} {m - ms[0]:+5.2f}" for m in ms[1:]]
        print(f"{name:>8} " + " ".join(cells))
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
