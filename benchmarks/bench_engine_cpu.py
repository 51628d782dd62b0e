"""Engine CPU latency side by side with TFLite (ai-edge-litert, XNNPACK) on the same models.

Each model is built in Keras from a NB101 cell (``leti.generate.keras_builder``), converted to
TFLite, and the *same* ``.tflite`` is converted to the engine — so both run identical weights, and
the script checks the outputs agree (1e-4 relative) before timing. Columns: median ms per run for
TFLite, the engine (schemes chosen by pre-inference), and the engine forced to the im2col scheme
(the plain sliding-window baseline), at 1 and 2 threads; ``ratio`` is engine / TFLite.

    .venv/bin/python benchmarks/bench_engine_cpu.py [--networks 2] [--runs 30] [--mobilenet]

Peers that are not installed here (ONNX Runtime, MNN, OpenVINO) are not measured.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from leti.engine.convert.from_tflite import from_tflite
from leti.engine.session import Session
from leti.generate.network import NetworkConfig
from leti.generate.space import enumerate_space


def median_ms(fn, runs: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts) * 1e3)


def models(n_networks: int, mobilenet: bool):
    import keras

    from leti.generate.keras_builder import cell_model, network_model, randomize_weights
    from leti.generate.tflite import convert_keras

    space = enumerate_space()
    cells = [space.sample(n_networks + 1, seed=1).cell(i) for i in range(n_networks + 1)]
    for c in cells[:n_networks]:
        m = randomize_weights(network_model(c, NetworkConfig()), seed=0)
        yield f"nb101 net 32x32 {c.hash[:8]}", convert_keras(m)
        keras.backend.clear_session()
    c = cells[-1]
    m = randomize_weights(cell_model(c, (96, 96, 128), 128), seed=0)
    yield f"nb101 cell 96x96x128 {c.hash[:8]}", convert_keras(m)
    keras.backend.clear_session()
    if mobilenet:
        for name, ctor in (("mobilenet_v1 224", keras.applications.MobileNet),
                           ("mobilenet_v2 224", keras.applications.MobileNetV2)):
            yield name, convert_keras(ctor(input_shape=(224, 224, 3), weights=None))
            keras.backend.clear_session()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--networks", type=int, default=2)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--mobilenet", action="store_true", help="also MobileNet v1/v2 at 224 (slow to convert)")
    args = ap.parse_args()
    from ai_edge_litert.interpreter import Interpreter

    hdr = f"{'model':30s} {'thr':>3s} {'tflite ms':>10s} {'engine ms':>10s} {'im2col ms':>10s} {'ratio':>6s}  rel.err"
    print(hdr)
    for name, data in models(args.networks, args.mobilenet):
        g = from_tflite(data)
        for threads in (1, 2):
            it = Interpreter(model_content=data, num_threads=threads)
            it.allocate_tensors()
            inp, out = it.get_input_details()[0], it.get_output_details()[0]
            x = np.random.default_rng(0).standard_normal(inp["shape"]).astype(np.float32)
            it.set_tensor(inp["index"], x)

            def tfl():
                it.invoke()

            s = Session(g, backends=("cpu",), threads=threads).resize()
            base = Session(g, backends=("cpu",), threads=threads, conv_scheme="im2col").resize()
            s._feed(x)
            base._feed(x)
            tfl()
            ref = it.get_tensor(out["index"])
            y = next(iter(s.run(x).values()))
            yb = next(iter(base.run(x).values()))
            err = max(float(np.abs(v - ref).max() / max(np.abs(ref).max(), 1e-12)) for v in (y, yb))
            t_tfl = median_ms(tfl, args.runs)
            t_eng = median_ms(lambda: s.run(copy=False), args.runs)
            t_base = median_ms(lambda: base.run(copy=False), args.runs)
            print(f"{name:30s} {threads:3d} {t_tfl:10.2f} {t_eng:10.2f} {t_base:10.2f} {t_eng / t_tfl:6.2f}  {err:.1e}")
            for b in s.backends + base.backends:
                getattr(b, "close", lambda: None)()


if __name__ == "__main__":
    main()
