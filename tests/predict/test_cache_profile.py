"""A device's cache profile (leti/predict/kernels/cache.py): what a one-pixel kernel's weights cost inside a model that
has pushed them out of the cache, from warm and cold times; applied to kernel rows, kept with the predictor."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from leti.predict.kernels.cache import CacheProfile, measure_cache_profile
from leti.predict.kernels.model import KernelLatencyPredictor, load_kernel_predictor
from leti.predict.kernels.overhead import Overhead
from leti.predict.kernels.predictor import KernelRegressors
from leti.predict.kernels.schema import normalize

ROOT = Path(__file__).resolve().parents[2]


def _profile() -> CacheProfile:
    """A device whose cache holds ~16 MB: weights come from memory at 0.015 ms/MB more once 16-32 MB are in play."""
    sizes, flush = (1.0, 2.0, 4.0, 8.0), (4.0, 8.0, 16.0, 32.0, 64.0)
    warm = {w: 0.01 * w for w in sizes}
    share = lambda t: float(np.clip((t - 16.0) / 16.0, 0.0, 1.0))  # noqa: E731
    cold = {(w, x): 0.01 * w + 0.015 * w * share(w + x) for w in sizes for x in flush}
    return CacheProfile.from_times(warm, cold)


def test_profile_reads_the_excess_and_the_share_lost_from_warm_and_cold_times():
    p = _profile()
    assert p.excess_ms == pytest.approx([0.015, 0.03, 0.06, 0.12])
    assert p.excess(np.array([0.5, 16.0]))[0] == pytest.approx(0.0075)  # through 0 below the smallest size
    assert p.excess(np.array([16.0]))[0] == pytest.approx(0.24)  # the last slope beyond the largest
    assert p.share_lost(np.array([10.0, 24.0, 40.0, 100.0])) == pytest.approx([0.0, 0.5, 1.0, 1.0], abs=0.07)
    assert np.all(np.diff(p.lost) >= 0) and p.lost[0] == 0.0
    flat = CacheProfile.from_times({1.0: 0.01}, {(1.0, 64.0): 0.009})  # colder is not slower: nothing lost
    assert flat.excess_ms == [0.0] and flat.share_lost(np.array([500.0]))[0] == 0.0


def _rows(model: str, kernels: list[tuple[int, float]]) -> list[dict]:
    """Kernels of ``model``: (output pixels per side, MB of weights)."""
    return [{"model": model, "kernel_type": "dense" if side == 1 else "conv2d", "input_h": side, "input_w": side,
             "input_c": 256, "output_h": side, "output_w": side, "output_c": 256, "kernel_h": 1, "kernel_w": 1,
             "bytes_weights": mb * 1e6} for side, mb in kernels]


def test_only_one_pixel_kernels_of_models_that_evict_them_pay():
    p = _profile()
    rows = normalize(pd.DataFrame(_rows("small", [(7, 3.0), (1, 2.0)]) + _rows("big", [(7, 30.0), (1, 2.0)])
                                  + _rows("huge", [(1, 80.0)]) + _rows("maps", [(180, 0.1), (1, 2.0)])), "t")
    extra = p.in_model_ms(rows)
    assert extra[0] == 0.0 and extra[1] == 0.0  # 5 MB in all: the cache holds every weight
    assert extra[2] == 0.0  # many output pixels: no one-pixel kernel
    assert extra[3] == pytest.approx(0.03, rel=0.15)  # 32 MB in play: its 2 MB come from memory
    assert extra[4] == pytest.approx(0.0, abs=1e-9)  # 80 MB alone already streams from memory
    assert rows.bytes_out[5] > 30e6 and extra[6] == pytest.approx(0.03, rel=0.15)  # 33 MB of feature maps evict it too


def test_predictor_keeps_its_profile_and_adds_it_to_the_model_not_the_kernel(tmp_path):
    table = pd.read_parquet(ROOT / "datasets" / "kernels_local_cpu.parquet")
    dense = table[table.kernel_type == "dense"].head(40).reset_index(drop=True)
    reg = KernelRegressors(n_members=2, n_estimators=30, max_depth=3).fit(dense)
    plain = KernelLatencyPredictor(reg, Overhead(), "local", "tflite-xnnpack", "float")
    KernelLatencyPredictor(reg, Overhead(), "local", "tflite-xnnpack", "float", cache=_profile()).save(tmp_path / "p")
    back = load_kernel_predictor(tmp_path / "p")
    assert back.cache is not None and back.cache.to_dict() == _profile().to_dict()
    model = normalize(pd.DataFrame(_rows("net", [(7, 30.0), (1, 4.0)])).assign(device="local",
                                                                               runtime="tflite-xnnpack"), "t")
    model.loc[0, "kernel_type"] = "dense"  # a type the regressors know
    with_cache, without = back.predict_models(model)[0], plain.predict_models(model)[0]
    assert list(with_cache.kernels.cold_ms) == pytest.approx([0.0, float(_profile().in_model_ms(model)[1])])
    assert with_cache.latency_ms == pytest.approx(without.latency_ms + with_cache.kernels.cold_ms.sum())
    # one kernel alone is no model: predict_kernels is the kernel's own time
    assert np.allclose(back.predict_kernels(model).predicted_ms, plain.predict_kernels(model).predicted_ms)


def test_probe_times_the_local_cpu(tmp_path):
    from leti.device.registry import open_device
    from leti.predict.kernels.bench import KernelBench

    with open_device("local", threads=1) as dev:
        p = measure_cache_profile(KernelBench(dev, tmp_path))
    assert p.weights_mb == [1.0, 2.0, 4.0, 8.0] and all(e >= 0 for e in p.excess_ms)
    assert p.lost[0] == 0.0 and np.all(np.diff(p.lost) >= 0) and max(p.lost) <= 1.0
    assert not list(tmp_path.glob("cache-*"))  # the target models are removed
