"""What LETI's engine holds and runs per kernel beyond the model's tensors (leti/predict/kernels/resident.py):
Winograd's transformed filters and packed panels as the weights a kernel reads, steps outside the native program;
applied by the cache term and the predictor on the engine's rows only."""

import numpy as np
import pandas as pd
import pytest

from leti.predict.kernels.cache import footprint_mb
from leti.predict.kernels.resident import STEPPED_MS, resident_weight_bytes, stepped, stepped_ms
from leti.predict.kernels.schema import normalize


def _conv(k: int, side: int = 32, ic: int = 64, oc: int = 64, runtime: str = "leti-engine-cpu", stride: int = 1,
          model: str = "m") -> dict:
    out = -(-side // stride)
    return {"model": model, "kernel_type": "conv2d", "input_h": side, "input_w": side, "input_c": ic, "output_h": out,
            "output_w": out, "output_c": oc, "kernel_h": k, "kernel_w": k, "stride": stride, "runtime": runtime}


def _rows(*rows: dict) -> pd.DataFrame:
    return normalize(pd.DataFrame(list(rows)), "t")


def test_engine_reads_winograd_filters_and_padded_panels():
    rows = _rows(_conv(3), _conv(7), _conv(1, side=8, oc=20), _conv(3, stride=2),
                 {**_conv(1, side=1, ic=1024, oc=1000), "kernel_type": "dense"})
    w = resident_weight_bytes(rows)
    assert w[0] == 36 * 64 * 64 * 4  # F(4×4, 3×3): α = 6, 4× the 3×3 filter
    assert w[1] == 100 * 64 * 64 * 4  # F(4×4, 7×7): α = 10
    assert w[2] == 64 * 32 * 4  # 20 output channels in two panels of 16
    assert w[3] == 9 * 64 * 64 * 4  # strided: im2col over the filter as it is
    assert w[4] == 1024 * 1008 * 4  # a classifier's 1,000 outputs in 63 panels
    tflite = _rows(*(dict(r, runtime="tflite-xnnpack") for r in rows.to_dict("records")))
    assert np.array_equal(resident_weight_bytes(tflite), tflite.bytes_weights.to_numpy())  # XNNPACK: unchanged


def test_footprint_counts_the_transformed_filters_on_the_engine_only():
    engine = _rows(*(_conv(3, ic=256, oc=256, side=16) for _ in range(4)))
    tflite = engine.assign(runtime="tflite-xnnpack")
    maps = (engine.bytes_in + engine.bytes_out).max() / 1e6
    assert footprint_mb(tflite)[0] == pytest.approx(tflite.bytes_weights.sum() / 1e6 + maps)
    assert footprint_mb(engine)[0] == pytest.approx(4 * 36 * 256 * 256 * 4 / 1e6 + maps)  # ~4× the filters: 37.7 MB


def test_steps_outside_the_native_program_pay_their_cost_in_a_model():
    from leti.predict.kernels.model import KernelLatencyPredictor
    from leti.predict.kernels.overhead import Overhead
    from leti.predict.kernels.predictor import KernelRegressors

    rows = _rows(_conv(7), _conv(5), _conv(3), _conv(7, stride=2), _conv(7, side=4))
    assert list(stepped(rows)) == [True, False, False, False, False]  # only α = 10 leaves the program
    assert list(stepped_ms(rows)) == [STEPPED_MS, 0.0, 0.0, 0.0, 0.0]
    assert not stepped(rows.assign(runtime="tflite-xnnpack")).any()
    kp = KernelLatencyPredictor(KernelRegressors(), Overhead(), "engine", "leti-engine-cpu", "float")
    inside = kp.in_model(rows.assign(predicted_ms=1.0))  # no cache profile: the step's cost all the same
    assert list(inside.predicted_ms) == pytest.approx([1.0 + STEPPED_MS, 1.0, 1.0, 1.0, 1.0])
    assert list(inside.cold_ms) == [0.0] * 5
    other = KernelLatencyPredictor(KernelRegressors(), Overhead(), "local", "tflite-xnnpack", "float")
    plain = rows.assign(runtime="tflite-xnnpack", predicted_ms=1.0)
    assert other.in_model(plain) is plain  # nothing to add off the engine
