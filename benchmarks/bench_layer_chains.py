"""TFLite (XNNPACK) against LETI's engine on chains of one layer type (issue 20): which kernels trail, layer by layer.

A chain is a Keras model of a few layers of one shape (random weights, ReLU6), converted to ``.tflite`` in memory, run
by both runtimes interleaved in one process (``--rounds`` rounds of 10 runs each, the order alternating); printed:
each runtime's median milliseconds and the median over rounds of the engine's time over TFLite's. ``--switch
NAME=VALUE`` adds an engine arm with one of the C library's ``leti_set_NAME`` switches set around its runs (an A/B of a
kernel choice, e.g. ``dw_packed=0``), paired against the default engine.

    PYTHONPATH=. python benchmarks/bench_layer_chains.py [--threads 1,2] [--rounds 30] [--chain 14,512,d1*10 ...]

A chain is ``SIZE,CHANNELS,LAYERS``: LAYERS a comma list of ``pN`` (a 1×1 convolution to N channels) and ``dS`` (a 3×3
depthwise convolution at stride S), ``*K`` repeating the list K times. Session 43 (Zen 5): five 14×14×512 products
1.03 / 1.06 (one / two threads), ten 14×14×512 depthwise steps 1.27 / 1.30 before the packed depthwise path.
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

#: MobileNet v1's layer shapes at 224 pixels: its products and depthwise steps by map size
CHAINS = ("14,512,p512*5", "14,512,d1*10", "7,1024,d1*10", "7,512,p1024", "56,128,p128", "56,128,d2", "28,256,d1",
          "28,256,d2", "56,128,p128,d2,p256,d1,p256,d2")


def parse_chain(spec: str) -> tuple[int, int, list[tuple[str, int]]]:
    """``SIZE,CHANNELS,LAYERS`` → (size, channels, [(kind, value)]); ValueError with the reason where malformed."""
    parts = spec.split(",")
    if len(parts) < 3 or not (parts[0].isdigit() and parts[1].isdigit()):
        raise ValueError(f"chain {spec!r}: expected SIZE,CHANNELS,LAYERS (SIZE and CHANNELS whole numbers)")
    size, channels = int(parts[0]), int(parts[1])
    body, _, times = ",".join(parts[2:]).partition("*")
    if times and not times.isdigit():
        raise ValueError(f"chain {spec!r}: the repeat after '*' is not a whole number")
    layers = []
    for item in body.split(","):
        if len(item) < 2 or item[0] not in "pd" or not item[1:].isdigit():
            raise ValueError(f"chain {spec!r}: layer {item!r} is neither pN nor dS")
        layers.append((item[0], int(item[1:])))
    return size, channels, layers * (int(times) if times else 1)


def chain_tflite(size: int, channels: int, layers: list[tuple[str, int]]) -> bytes:
    """The chain as ``.tflite`` bytes (Keras, converted in memory by LETI's converter)."""
    import keras

    from leti.models.tflite import convert_keras

    inp = keras.Input((size, size, channels), batch_size=1)
    x = inp
    for kind, v in layers:
        if kind == "p":
            x = keras.layers.Conv2D(v, 1, activation="relu6", bias_initializer="random_normal")(x)
        else:
            x = keras.layers.DepthwiseConv2D(3, strides=v, padding="same", activation="relu6",
                                             bias_initializer="random_normal")(x)
    data = convert_keras(keras.Model(inp, x))
    keras.backend.clear_session()
    return data


def switched(run, name: str, value: int):
    """``run`` with the C library's ``leti_set_NAME`` at ``value`` during the call, its old value after."""
    from leti.engine.backends.cpu import ckernels

    try:
        f = ckernels.setter(f"leti_set_{name}")
    except AttributeError:
        raise SystemExit(f"error: --switch {name}: the C library has no leti_set_{name}") from None
    if f is None:
        raise SystemExit("error: LETI's C kernels are not available here; --switch needs them")

    def call():
        old = f(-1)
        f(value)
        try:
            run()
        finally:
            f(old)
    return call


def time_arms(arms: dict, rounds: int) -> dict[str, list[float]]:
    """Milliseconds per run of each arm, one figure per round (3 untimed runs, then 10 timed), the order alternating."""
    out = {k: [] for k in arms}
    names = list(arms)
    for r in range(rounds):
        for k in names if r % 2 else names[::-1]:
            f = arms[k]
            for _ in range(3):
                f()
            t = time.perf_counter()
            for _ in range(10):
                f()
            out[k].append((time.perf_counter() - t) / 10 * 1e3)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chain", action="append", help="SIZE,CHANNELS,LAYERS (repeatable; default: MobileNet v1's)")
    ap.add_argument("--threads", default="1,2", help="comma list of thread counts")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--switch", action="append", default=[], help="NAME=VALUE: an engine arm with leti_set_NAME(VALUE)")
    args = ap.parse_args(argv)
    try:
        chains = [(spec, *parse_chain(spec)) for spec in (args.chain or CHAINS)]
    except ValueError as e:
        ap.error(str(e))
    try:
        threads = [int(t) for t in args.threads.split(",")]
        switches = [(s.split("=")[0], int(s.split("=")[1])) for s in args.switch]
    except (ValueError, IndexError):
        ap.error(f"--threads takes a comma list of numbers ({args.threads!r}), --switch NAME=VALUE ({args.switch})")
    if args.rounds < 1 or min(threads) < 1:
        ap.error("--rounds and every thread count must be at least 1")
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; {args.rounds} rounds")
    head = f"{'chain':>36} {'thr':>3} {'tflite':>8} {'engine':>8} {'eng/tfl':>8}"
    print(head + "".join(f" {n + '=' + str(v):>14}" for n, v in switches), flush=True)
    for spec, size, channels, layers in chains:
        data = chain_tflite(size, channels, layers)
        for t in threads:
            tfl, eng = both_runtimes(data, t)
            arms = {"tflite": tfl, "engine": eng}
            for n, v in switches:
                arms[f"{n}={v}"] = switched(eng, n, v)
            ms = time_arms(arms, args.rounds)
            base, e = np.array(ms["tflite"]), np.array(ms["engine"])
            row = (f"{spec:>36} {t:>3} {np.median(base):8.3f} {np.median(e):8.3f} "
                   f"{np.median(e / base):8.3f}")
            row += "".join(f" {np.median(np.array(ms[f'{n}={v}']) / e):14.3f}" for n, v in switches)
            print(row, flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    if switches:
        print("switch columns: the arm's time over the default engine's, median over rounds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
