"""A paired A/B of one of the engine's native-kernel settings on whole models, inside one process.

    PYTHONPATH=. python benchmarks/bench_engine_ab.py --setting set_steal_chunks --a 8 --b 1 --threads 2 \\
        mobilenet_v2.tflite regnetx_002.tflite

Each model is imported into one engine session; the setting (a ``leti.engine.backends.cpu.ckernels.set_*``
switch taking an int or a bool) is flipped run by run between ``--a`` and ``--b``, in alternating order, for
``--pairs`` pairs, and the line per model gives both medians and the median of the per-pair ratios a/b. On a host
whose speed drifts between runs (a VM) only such pairs resolve effects of a few percent: a drift hits both halves of
a pair alike. Before timing, both settings' outputs are compared (``bit-equal``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def value(text: str):
    return {"true": True, "false": False}.get(text.lower(), int(text) if text.lstrip("-").isdigit() else text)


def main() -> None:
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
    args = ap.parse_args()
    if not args.setting.startswith("set_") or not callable(getattr(ckernels, args.setting, None)):
        ap.error(f"--setting {args.setting!r} is not one of ckernels' switches: "
                 f"{', '.join(n for n in dir(ckernels) if n.startswith('set_'))}")
    missing = [m for m in args.models if not Path(m).is_file()]
    if missing:
        ap.error(f"no such model file: {', '.join(missing)}")
    flip = getattr(ckernels, args.setting)
    default = flip(None)
    print(f"{args.setting}: a={args.a} b={args.b}, {args.threads} thread(s), {args.pairs} pairs; "
          f"load average {'%.2f %.2f %.2f' % os.getloadavg()}", flush=True)
    try:
        for path in args.models:
            g = load_graph(path)
            s = Session(g, backends=("cpu",), threads=args.threads).resize()
            x = np.random.default_rng(0).standard_normal(s.shapes[g.inputs[0]]).astype(np.float32)
            outs = {}
            for v in (args.a, args.b):
                flip(v)
                outs[v] = np.array(next(iter(s.run(x).values())))
            times = {args.a: [], args.b: []}
            for r in range(args.pairs):
                for v in ((args.a, args.b) if r % 2 else (args.b, args.a)):
                    flip(v)
                    t0 = time.perf_counter()
                    s.run(copy=False)
                    times[v].append(time.perf_counter() - t0)
            a, b = (np.median(times[v]) * 1e3 for v in (args.a, args.b))
            ratio = float(np.median(np.array(times[args.a]) / np.array(times[args.b])))
            print(f"{Path(path).name:28s} a {a:8.3f} ms  b {b:8.3f} ms  paired a/b {ratio:.3f}  "
                  f"bit-equal {np.array_equal(outs[args.a], outs[args.b])}", flush=True)
    finally:
        flip(default)


if __name__ == "__main__":
    main()
