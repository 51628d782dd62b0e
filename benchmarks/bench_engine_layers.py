"""MobileNet v1/v2's (or RegNetX-200MF's) layers one at a time: LETI's engine against TFLite (XNNPACK), paired in one process.

    PYTHONPATH=. python benchmarks/bench_engine_layers.py --model v1 --threads 1 --pairs 60

Each distinct layer of the model at 224 pixels (the stem, every depthwise and pointwise convolution, ReLU6 fused where
the model has it) becomes a single-layer ``.tflite`` (LETI's kernel models, ``leti.models.kernel_models``); the
engine imports that file. The two run in alternating blocks of about 2 ms, ``--pairs`` times, and the line per layer
gives both medians (µs) and the median of the per-pair ratios engine/TFLite. Each side's time includes its call from
Python (the engine's ``Session.run``: ~3 µs on one thread, ~6 µs on two, with the OpenMP region's start; TFLite's
``invoke`` under 1 µs), which is most of a small layer's difference.

What it tells and what it does not (session 34, ``docs/engine.md``): the kernel gaps of single layers (MobileNet v2's
112 × 112 × 16 → 96 product, 1.44× TFLite's time on one thread); not the whole model's, where the engine's steps
timed inside the network (``leti engine profile --in-run``) take less than alone and its fused residual adds and
memory plan count. Two-thread layer times on a 2-vCPU VM are unsteady: compare several runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def layers(model: str):
    from leti.models.kernel_models import KernelConfig as K

    r6 = "relu6"
    if model == "v1":
        out = [K("conv2d", 224, 224, 3, 32, 3, 2, activation=r6)]
        # (map, channels, depthwise stride, pointwise outputs) of each depthwise + pointwise pair
        for h, c, st, o in ((112, 32, 1, 64), (112, 64, 2, 128), (56, 128, 1, 128), (56, 128, 2, 256),
                            (28, 256, 1, 256), (28, 256, 2, 512), (14, 512, 1, 512), (14, 512, 2, 1024),
                            (7, 1024, 1, 1024)):
            out += [K("depthwise_conv2d", h, h, c, 0, 3, st, activation=r6),
                    K("conv2d", h // st, h // st, c, o, activation=r6)]
        return out
    if model not in ("v2", "regnetx"):
        raise ValueError(f"no such model: {model}")
    # MobileNet v2: (map, expanded channels, stride, projected channels) of each block's depthwise and products
    out = [K("conv2d", 224, 224, 3, 32, 3, 2, activation=r6),
           K("depthwise_conv2d", 112, 112, 32, 0, 3, 1, activation=r6), K("conv2d", 112, 112, 32, 16)]
    for h, cin, e, s, cout in ((112, 16, 96, 2, 24), (56, 24, 144, 1, 24), (56, 24, 144, 2, 32), (28, 32, 192, 1, 32),
                               (28, 32, 192, 2, 64), (14, 64, 384, 1, 64), (14, 64, 384, 1, 96), (14, 96, 576, 1, 96),
                               (14, 96, 576, 2, 160), (7, 160, 960, 1, 160), (7, 160, 960, 1, 320)):
        o = h // s
        out += [K("conv2d", h, h, cin, e, activation=r6), K("depthwise_conv2d", h, h, e, 0, 3, s, activation=r6),
                K("conv2d", o, o, e, cout)]
    if model == "v2":
        return out + [K("conv2d", 7, 7, 320, 1280, activation=r6)]
    # RegNetX-200MF (the zoo's builder): per stage (input map, channels in, channels out) of its first block, which
    # strides by 2 (1x1 to the new width, 3x3 grouped in groups of 8, 1x1, and the 1x1 / 2 shortcut), then the later
    # blocks' layers at the stage's map
    out = [K("conv2d", 224, 224, 3, 32, 3, 2, activation="relu")]
    for h, cin, c in ((112, 32, 24), (56, 24, 56), (28, 56, 152), (14, 152, 368)):
        o = h // 2
        out += [K("conv2d", h, h, cin, c, activation="relu"), K("grouped_conv2d", h, h, c, c, 3, 2, groups=c // 8,
                                                                 activation="relu"),
                K("conv2d", o, o, c, c), K("conv2d", h, h, cin, c, 1, 2),
                K("grouped_conv2d", o, o, c, c, 3, 1, groups=c // 8, activation="relu")]
    return out


def timed(fn, block: int) -> float:
    """µs per run of ``fn`` over ``block`` runs after two untimed ones."""
    fn()
    fn()
    start = time.perf_counter_ns()
    for _ in range(block):
        fn()
    return (time.perf_counter_ns() - start) / block / 1e3


def main() -> None:
    import keras

    from bench_engine_cpu import tflite_runner
    from leti.engine.tools import open_session, random_feeds
    from leti.models.kernel_models import kernel_model
    from leti.models.tflite import convert_keras

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=("v1", "v2", "regnetx"), default="v1")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--pairs", type=int, default=60)
    ap.add_argument("--work", default="", help="folder for the single-layer .tflite files (default: a temporary one)")
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="leti_layers_"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"MobileNet {args.model} layers, {args.threads} thread(s), {args.pairs} pairs; load average "
          f"{'%.2f %.2f %.2f' % os.getloadavg()}", flush=True)
    seen, total = set(), [0.0, 0.0]
    for c in layers(args.model):
        if c.name in seen:
            continue
        seen.add(c.name)
        data = convert_keras(kernel_model(c, 0))
        keras.backend.clear_session()
        path = work / f"{c.name}.tflite"
        path.write_bytes(data)
        s = open_session(path, "cpu", args.threads, None)
        feeds = random_feeds(s)
        s.run(feeds)
        x = next(iter(feeds.values())) if isinstance(feeds, dict) else feeds
        runners = {"engine": lambda: s.run(copy=False), "tflite": tflite_runner(data, x, args.threads)[0]}
        t0 = time.perf_counter()
        runners["engine"]()
        block = max(3, int(2e-3 / max(time.perf_counter() - t0, 1e-6)))

        times = {"engine": [], "tflite": []}
        for i in range(args.pairs):
            for k in (("tflite", "engine") if i % 2 else ("engine", "tflite")):
                times[k].append(timed(runners[k], block))
        e, t = (float(np.median(times[k])) for k in ("engine", "tflite"))
        ratio = float(np.median(np.array(times["engine"]) / np.array(times["tflite"])))
        total[0] += e
        total[1] += t
        act = c.activation or "-"
        shape = f"{c.input_h:3d}x{c.input_w:3d}x{c.input_c:4d} -> {c.out_c:4d} k{c.kernel} s{c.stride}"
        print(f"{c.kernel_type:16s} {shape} {act:5s}  engine {e:8.1f} us  tflite {t:8.1f} us  "
              f"engine/tflite {ratio:.3f}", flush=True)
    print(f"distinct layers, one each: engine {total[0]:.1f} us, tflite {total[1]:.1f} us; load average after "
          f"{os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
