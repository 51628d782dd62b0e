"""What a product over a few pixels costs on LETI's engine once its weights have left L2 (issue 16's diagnosis).

Each 1×1 convolution (a Keras layer imported into the engine, one thread) is timed run after run (warm: its weights,
input and output in L1/L2) and right after 4 MB of other data were read (its weights pushed out of a 1 MB L2 into
L3), interleaved, on the thread's CPU clock; the medians of 300 of each. Why: inside a model of a few MB of weights
every product reads its weights from L3, while the kernel build times it alone from L2; the build's cache profile
(``leti/predict/kernels/cache.py``) prices the eviction to memory of one-pixel products only.

    PYTHONPATH=. python benchmarks/bench_l2_eviction.py
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

SHAPES = [(4, 256, 512), (8, 128, 256), (8, 256, 256), (16, 64, 128), (4, 480, 160), (8, 240, 80)]
FLUSH_FLOATS = 1 << 20  # 4 MB


def main() -> None:
    import keras

    from leti.engine.convert.from_tflite import from_tflite
    from leti.engine.session import Session
    from leti.models.tflite import convert_keras

    junk = np.ones(FLUSH_FLOATS, np.float32)
    print(f"load average {os.getloadavg()}")
    for hw, ci, co in SHAPES:
        inp = keras.Input((hw, hw, ci))
        graph = from_tflite(convert_keras(keras.Model(inp, keras.layers.Conv2D(co, 1, activation="relu")(inp))))
        keras.backend.clear_session()
        s = Session(graph, backends=("cpu",), threads=1).resize()
        x = np.random.default_rng(0).standard_normal(s.shapes[graph.inputs[0]]).astype(np.float32)
        s.run({graph.inputs[0]: x})
        warm, cold = [], []
        for _ in range(300):
            t = time.thread_time_ns()
            s.run(copy=False)
            warm.append(time.thread_time_ns() - t)
            junk.sum()
            t = time.thread_time_ns()
            s.run(copy=False)
            cold.append(time.thread_time_ns() - t)
        w, c = np.median(warm) / 1e3, np.median(cold) / 1e3
        print(f"{hw}x{hw} {ci}->{co}, weights {ci * co * 4 / 1e6:.2f} MB: warm {w:.1f} us, after 4 MB {c:.1f} us, "
              f"x{c / w:.2f}", flush=True)


if __name__ == "__main__":
    main()
