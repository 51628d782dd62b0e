"""What a product over a few pixels costs on LETI's engine once its weights have left L2 (issue 16's diagnosis).

Each 1×1 convolution (the kernel build's own single-kernel model, ``kernel_model``, written by ``KernelBench`` and run
by the engine device's ``runner``, one thread) is timed run after run (warm: its weights,
input and output in L1/L2) and right after 4 MB of other data were read (its weights pushed out of a 1 MB L2 into
L3), interleaved, on the thread's CPU clock; the medians of 300 of each. Why: inside a model of a few MB of weights
every product reads its weights from L3, while the kernel build times it alone from L2; the build's cache profile
(``leti/predict/kernels/cache.py``) prices the eviction to memory of one-pixel products only.

    PYTHONPATH=. python benchmarks/bench_l2_eviction.py
"""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

SHAPES = [(4, 256, 512), (8, 128, 256), (8, 256, 256), (16, 64, 128), (4, 480, 160), (8, 240, 80)]
FLUSH_FLOATS = 1 << 20  # 4 MB
RUNS = 300


def main() -> None:
    from leti.device.base import CLOCKS
    from leti.device.registry import open_device
    from leti.models.kernel_models import KernelConfig, kernel_model
    from leti.predict.kernels.bench import KernelBench

    junk = np.ones(FLUSH_FLOATS, np.float32)
    clock = CLOCKS["cpu"]
    print(f"load average {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as work, open_device("engine", threads=1) as dev:
        bench = KernelBench(dev, work)
        for hw, ci, co in SHAPES:
            cfg = KernelConfig("conv2d", hw, hw, ci, output_c=co, activation="relu")
            path, _ = bench.write(kernel_model(cfg, 0), f"l2-{hw}-{ci}-{co}")
            run = dev.runner(path)
            run()
            warm, cold = [], []
            for _ in range(RUNS):
                t = clock()
                run()
                warm.append(clock() - t)
                junk.sum()
                t = clock()
                run()
                cold.append(clock() - t)
            dev.release(path)
            w, c = np.median(warm) / 1e3, np.median(cold) / 1e3
            print(f"{hw}x{hw} {ci}->{co}, weights {ci * co * 4 / 1e6:.2f} MB: warm {w:.1f} us, after 4 MB {c:.1f} us, "
                  f"x{c / w:.2f}", flush=True)
        bench.close()


if __name__ == "__main__":
    main()
