"""What an element-wise step costs in place inside a program against alone (issue 16's engine predictor).

A squeeze-excite scale (``mul`` of a map by a per-channel vector) timed as a single-kernel model writes a new buffer;
inside a network LETI's engine runs it in place (the memory plan gives its output the map's buffer when the ``mul`` is
the map's last reader), on a map the step before has just written. This script times the same ``mul`` both ways with
the native program's step clock (``Session.profile(in_run=True)``): alone (``x → mul``) and between two 1×1
convolutions (``x → conv → mul → conv``, where it runs in place), for a few map sizes, one thread, and prints the
median of each and their ratio.

    PYTHONPATH=. python benchmarks/bench_engine_inplace.py [--runs 200]
"""

from __future__ import annotations

import argparse
import os

import numpy as np


def graph(h: int, c: int, between_convs: bool, rng):
    """``x → mul(x, s)`` or ``x → conv 1×1 → mul → conv 1×1`` on an h × h × c map, ``s`` a per-channel
    vector."""
    from leti.engine.graph import Graph

    g = Graph()
    g.add_tensor("x", (1, h, h, c))
    g.inputs, last = ["x"], "x"

    def conv(src: str, out: str) -> str:
        w = g.add_constant(f"{out}_w", (rng.standard_normal((1, 1, c, c)) * 0.1).astype(np.float32))
        b = g.add_constant(f"{out}_b", np.zeros(c, np.float32))
        g.add_tensor(out, (1, h, h, c))
        g.add_node("conv2d", [src, w, b], [out], padding="same")
        return out

    if between_convs:
        last = conv(last, "y")
    s = g.add_constant("s", rng.standard_normal((1, 1, 1, c)).astype(np.float32))
    g.add_tensor("z", (1, h, h, c))
    g.add_node("mul", [last, s], ["z"])
    last = "z"
    if between_convs:
        last = conv(last, "o")
    g.outputs = [last]
    return g


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--sizes", nargs="+", default=["56x144", "28x240", "14x480", "112x32"], help="HxC maps")
    args = ap.parse_args()
    from leti.engine.session import Session

    rng = np.random.default_rng(0)
    print(f"load average {os.getloadavg()[0]:.2f}; one thread; {args.runs} runs, medians")
    for size in args.sizes:
        h, c = (int(v) for v in size.split("x"))
        ms, in_place = [], []
        for between in (False, True):
            s = Session(graph(h, c, between, rng), backends=("cpu",), threads=1).resize()
            x = rng.standard_normal((1, h, h, c)).astype(np.float32)
            s.run(x)
            rows = s.profile(x, runs=args.runs, in_run=True)
            ms.append(next(r["ms"] for r in rows if r["op"] == "mul"))
            in_place.append("z" in s.memory["host"].inplace)
        print(f"{h}x{h}x{c} ({h * h * c * 4 / 1e6:.2f} MB): mul alone {ms[0]:.4f} ms (in place: {in_place[0]}), "
              f"between two convolutions {ms[1]:.4f} ms (in place: {in_place[1]}), ratio {ms[1] / ms[0]:.2f}")


if __name__ == "__main__":
    main()
