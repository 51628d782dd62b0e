"""A paired A/B of one of the engine's native-kernel settings on whole models, inside one process.

    PYTHONPATH=. python benchmarks/bench_engine_ab.py --setting set_steal_chunks --a 8 --b 1 --threads 2 \\
        mobilenet_v2.tflite regnetx_002.tflite

Each model is imported into one engine session; the setting (a ``leti.engine.backends.cpu.ckernels.set_*``
switch taking an int or a bool) is flipped run by run between ``--a`` and ``--b``, in alternating order, for
``--pairs`` pairs, and the line per model gives both medians and the median of the per-pair ratios a/b. On a host
whose speed drifts between runs (a VM) only such pairs resolve effects of a few percent: a drift hits both halves of
a pair alike. Before timing, both settings' outputs are compared (``bit-equal``).

``--tflite`` also times TFLite (XNNPACK, the same thread count) on a ``.tflite`` model in every pair and prints each
setting's paired ratio to it. ``--competitor DUTY`` runs another process during the timing, pinned to the last core and
busy DUTY of every 10 ms (a tenant sharing the machine); ``mean`` gives each arm's mean time, which counts the runs
the competitor's bursts slow down (the medians pass over them).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def value(text: str):
    return {"true": True, "false": False}.get(text.lower(), int(text) if text.lstrip("-").isdigit() else text)


SPIN = """import os, sys, time
os.sched_setaffinity(0, {os.cpu_count() - 1})
duty = float(sys.argv[1])
while True:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < duty * 0.01: pass
    time.sleep(0.01 * (1 - duty))
"""


def competitor(duty: float):
    """Another process on the last core, busy ``duty`` of every 10 ms until killed (None for duty 0)."""
    return subprocess.Popen([sys.executable, "-c", SPIN, str(duty)]) if duty > 0 else None


def main(argv: list[str] | None = None) -> int:
    from leti.engine.backends.cpu import ckernels
    from leti.engine.session import Session
    from leti.engine.tools import load_graph

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", help="model files the engine imports (.tflite, .onnx, .leti)")
    ap.add_argument("--setting", required=True, help="a ckernels switch, e.g. set_steal_chunks, set_window_units")
    ap.add_argument("--a", required=True, type=value)
    ap.add_argument("--b", required=True, type=value)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=200)
    ap.add_argument("--tflite", action="store_true", help="also time TFLite on .tflite models, in every pair")
    ap.add_argument("--competitor", type=float, default=0.0, metavar="DUTY",
                    help="a process on the last core, busy DUTY (0-1) of every 10 ms, during the timing")
    args = ap.parse_args(argv)
    if not 0 <= args.competitor < 1:
        ap.error(f"--competitor {args.competitor}: a share of time, 0 <= DUTY < 1")
    if not args.setting.startswith("set_") or not callable(getattr(ckernels, args.setting, None)):
        ap.error(f"--setting {args.setting!r} is not one of ckernels' switches: "
                 f"{', '.join(n for n in dir(ckernels) if n.startswith('set_'))}")
    missing = [m for m in args.models if not Path(m).is_file()]
    if missing:
        ap.error(f"no such model file: {', '.join(missing)}")
    flip = getattr(ckernels, args.setting)
    default = flip(None)
    print(f"{args.setting}: a={args.a} b={args.b}, {args.threads} thread(s), {args.pairs} pairs; "
          f"load average {'%.2f %.2f %.2f' % os.getloadavg()}; competitor {args.competitor}", flush=True)
    if args.tflite:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_engine_cpu import tflite_runner
    spinner = competitor(args.competitor)
    try:
        for path in args.models:
            g = load_graph(path)
            s = Session(g, backends=("cpu",), threads=args.threads).resize()
            x = np.random.default_rng(0).standard_normal(s.shapes[g.inputs[0]]).astype(np.float32)
            outs = {}
            for v in (args.a, args.b):
                flip(v)
                outs[v] = np.array(next(iter(s.run(x).values())))
            arms = [(v, lambda v=v: (flip(v), s.run(copy=False))) for v in (args.a, args.b)]
            if args.tflite and path.endswith(".tflite"):
                arms.append(("tflite", tflite_runner(Path(path).read_bytes(), x, args.threads)[0]))
            times = {name: [] for name, _ in arms}
            for r in range(args.pairs):
                for name, run in (arms if r % 2 else arms[::-1]):
                    t0 = time.perf_counter()
                    run()
                    times[name].append(time.perf_counter() - t0)
            t = {name: np.array(v) for name, v in times.items()}
            a, b = (np.median(t[v]) * 1e3 for v in (args.a, args.b))
            line = (f"{Path(path).name:28s} a {a:8.3f} ms  b {b:8.3f} ms  paired a/b "
                    f"{np.median(t[args.a] / t[args.b]):.3f}  bit-equal {np.array_equal(outs[args.a], outs[args.b])}")
            if "tflite" in t:
                line += (f"  tflite {np.median(t['tflite']) * 1e3:8.3f} ms  paired a/tflite "
                         f"{np.median(t[args.a] / t['tflite']):.3f}  b/tflite {np.median(t[args.b] / t['tflite']):.3f}")
            # the runs' total times: what a competitor's bursts cost, which the medians pass over
            line += "  mean " + "  ".join(f"{name} {v.mean() * 1e3:.3f}" for name, v in t.items())
            print(line, flush=True)
    finally:
        flip(default)
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
