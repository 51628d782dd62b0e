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


def test_kernels_pay_for_the_weights_their_model_evicts_as_far_as_their_work_does_not_hide_them():
    p, warm = _profile(), (lambda w: 0.01 * np.asarray(w))  # the profile's warm time: 0.01 ms per MB
    rows = normalize(pd.DataFrame(_rows("small", [(7, 3.0), (1, 2.0)]) + _rows("big", [(7, 30.0), (1, 2.0)])
                                  + _rows("huge", [(1, 80.0)]) + _rows("maps", [(180, 0.1), (1, 2.0)])
                                  + _rows("few", [(2, 4.0), (2, 4.0), (7, 30.0)])), "t")
    alone = np.array([0.5, 0.02, 2.0, 0.02, 0.8, 3.0, 0.02, 0.1, 5.0, 2.0])
    extra = p.in_model_ms(rows, alone, warm)
    assert extra[0] == 0.0 and extra[1] == 0.0  # 5 MB in all: the cache holds every weight
    assert extra[2] == 0.0  # its 30 MB stream from memory alone too
    assert extra[3] == pytest.approx(0.03, rel=0.15)  # one pixel, 34 MB in play: its 2 MB come from memory, unhidden
    assert extra[4] == pytest.approx(0.0, abs=1e-9)  # 80 MB alone already streams from memory
    assert rows.bytes_out[5] > 30e6 and extra[6] == pytest.approx(0.03, rel=0.15)  # 33 MB of feature maps evict it too
    # four pixels of 4 MB: 0.06 ms of work beside a 0.04 + 0.06 ms stream, which it hides in part
    stream, work = 0.04 + 0.06 * (1 - float(p.share_lost(np.array([4.0]))[0])), 0.1 - 0.04
    assert extra[7] == pytest.approx(np.hypot(work, stream) - 0.1, rel=1e-6) and 0.0 < extra[7] < p.excess(4.0)
    assert extra[8] == 0.0  # the same weights under 5 ms of work: hidden
    assert np.all(p.in_model_ms(rows.assign(kernel_type="depthwise_conv2d"), alone, warm) == 0.0)  # not streamed


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
    alone = back.predict_kernels(model).predicted_ms.to_numpy()
    assert list(with_cache.kernels.cold_ms) == pytest.approx(list(_profile().in_model_ms(model, alone, back.warm_ms)))
    assert with_cache.kernels.cold_ms[1] > 0.01  # its 4 MB come from memory in a 34 MB model
    assert with_cache.latency_ms == pytest.approx(without.latency_ms + with_cache.kernels.cold_ms.sum())
    # one kernel alone is no model: predict_kernels is the kernel's own time
    assert np.allclose(back.predict_kernels(model).predicted_ms, plain.predict_kernels(model).predicted_ms)
    # reading weights warm: the predictor's own one-pixel dense kernel, growing with the weights
    warm = back.warm_ms(np.array([0.5, 2.0, 8.0, 32.0]))
    assert np.all(warm > 0) and np.all(np.diff(warm) >= 0) and warm[-1] > 2 * warm[0]
    convs = table[table.kernel_type == "conv2d"].head(40).reset_index(drop=True)
    no_dense = KernelLatencyPredictor(KernelRegressors(n_members=2, n_estimators=30, max_depth=3).fit(convs),
                                      Overhead(), "local", "tflite-xnnpack", "float", cache=_profile())
    assert np.all(no_dense.warm_ms(np.array([1.0, 8.0])) == 0.0)  # no dense regressor: nothing known


def test_probe_times_the_local_cpu(tmp_path):
    from leti.device.registry import open_device
    from leti.predict.kernels.bench import KernelBench

    with open_device("local", threads=1) as dev:
        p = measure_cache_profile(KernelBench(dev, tmp_path))
    assert p.weights_mb == [1.0, 2.0, 4.0, 8.0] and all(e >= 0 for e in p.excess_ms)
    assert p.lost[0] == 0.0 and np.all(np.diff(p.lost) >= 0) and max(p.lost) <= 1.0
    assert not list(tmp_path.glob("cache-*"))  # the target models are removed


def test_feature_maps_count_as_their_largest_step_or_half_of_what_is_written():
    """A model passes its weights through the cache, and its feature maps: its largest step's (the arena its steps
    reuse) or, where more, half of every map it writes (each map written into a reused buffer still leaves the core's
    cache for the shared one: :data:`cache.TRAFFIC_SHARE`). A model of one large step counts that step; a model of
    many steps over a small arena counts half its traffic."""
    from leti.predict.kernels.cache import TRAFFIC_SHARE, footprint_mb

    assert TRAFFIC_SHARE == 0.5
    p, warm = _profile(), (lambda w: 0.01 * np.asarray(w))
    relus = [{"model": "swish", "kernel_type": "relu", "input_h": 32, "input_w": 32, "input_c": 256, "output_h": 32,
              "output_w": 32, "output_c": 256, "kernel_h": 1, "kernel_w": 1, "bytes_weights": 0.0}]
    rows = normalize(pd.DataFrame(_rows("few", [(1, 2.0)]) + relus * 2 + _rows("swish", [(1, 2.0)]) + relus * 40
                                  + _rows("maps", [(180, 0.1), (1, 2.0)])).assign(
        model=["few"] * 3 + ["swish"] * 41 + ["maps"] * 2), "t")
    few, swish, maps = (rows.model == m for m in ("few", "swish", "maps"))
    assert rows.bytes_out[swish].sum() > 40e6  # 40 steps write 42 MB of maps through 2 MB of live maps
    written = rows.bytes_out[swish].sum() / 1e6
    assert footprint_mb(rows)[swish] == pytest.approx(2.0 + written / 2)
    assert footprint_mb(rows)[few] == pytest.approx(2.0 + 2 * 1.048576)  # two steps: the largest one's maps
    assert footprint_mb(rows)[maps][0] == pytest.approx(0.1 + 2.0 + 2 * 33.1776)  # one 66 MB step
    alone = np.where(rows.kernel_type == "relu", 0.01, 0.02)
    alone[np.flatnonzero(maps)[0]] = 3.0
    extra = p.in_model_ms(rows, alone, warm)
    assert extra[np.flatnonzero(few)[0]] == 0.0  # the classifier's 2 MB stay in the 16 MB cache beside 2 MB of maps
    assert extra[np.flatnonzero(swish)[0]] > 0.0  # 21 MB written past them push them out in part
    assert extra[np.flatnonzero(maps)[1]] == pytest.approx(0.03, rel=0.15)  # one 66 MB step evicts them


def test_weights_the_core_cache_held_alone_cost_their_next_level_in_any_model_that_evicts_it():
    base = _profile()
    near = {0.125: (0.002, 0.004), 0.25: (0.003, 0.007), 0.5: (0.005, 0.012)}  # warm, after a 4 MB flush
    sizes, flush = (1.0, 2.0, 4.0, 8.0), (4.0, 8.0, 16.0, 32.0, 64.0)
    warm = {w: 0.01 * w for w in sizes}
    share = lambda t: float(np.clip((t - 16.0) / 16.0, 0.0, 1.0))  # noqa: E731
    cold = {(w, x): 0.01 * w + 0.015 * w * share(w + x) for w in sizes for x in flush}
    p = CacheProfile.from_times(warm, cold, near)
    assert p.near_mb == [0.125, 0.25, 0.5] and p.near_ms == pytest.approx([0.002, 0.004, 0.007])
    assert p.near(np.array([0.0625, 0.375, 3.0])) == pytest.approx([0.001, 0.0055, 0.007])  # through 0; flat beyond
    assert base.near_mb == [] and base.near(np.array([0.25]))[0] == 0.0  # a profile without the sizes adds nothing
    assert CacheProfile.from_dict(p.to_dict()) == p and CacheProfile.from_dict(base.to_dict()) == base
    rows = normalize(pd.DataFrame(_rows("tiny", [(4, 0.25), (4, 0.25)]) + _rows("one", [(4, 0.25), (1, 3.0)])
                                  + _rows("mobile", [(4, 0.25), (1, 5.0), (1, 5.0)])), "t")
    near_ms = p.near_in_model_ms(rows)
    # 0.5 MB in all: the core's cache holds the model; the others' 3 MB pass less than the smallest flush between two
    # runs of "one"'s product; "mobile"'s pass more: its product's 0.25 MB come from the next level, and each
    # classifier pays the largest size's cost (the part of its weights the core's cache held alone)
    assert near_ms == pytest.approx([0.0, 0.0, 0.0, 0.0, 0.004, 0.007, 0.007])
    assert not base.near_in_model_ms(rows).any()
    # in a predictor's breakdown: part of the kernel's own time (scaled with the sum by the overhead), not of cold_ms
    alone = np.array([0.02, 0.02, 0.02, 0.04, 0.02, 0.06, 0.06])
    pred = KernelLatencyPredictor(KernelRegressors(), Overhead(), "engine", "leti-engine-cpu", "float", cache=p)
    inside = pred.in_model(rows.assign(predicted_ms=alone))
    assert inside.near_ms.to_numpy() == pytest.approx(near_ms)
    assert inside.cold_ms.to_numpy() == pytest.approx(p.in_model_ms(rows, alone, pred.warm_ms))
    assert inside.predicted_ms.to_numpy() == pytest.approx(alone + inside.cold_ms + inside.near_ms + inside.stepped_ms)


def test_near_costs_that_fall_with_the_size_are_not_resolved_and_count_as_none():
    """A larger block of weights cannot cost less from the next level: a probe whose near costs fall with the size
    (session 32's Zen 5: 2.3, 1.2, 1.0 µs) measured nothing it resolves, and no kernel pays them."""
    sizes, flush = (1.0, 2.0, 4.0, 8.0), (4.0, 8.0, 16.0, 32.0, 64.0)
    warm = {w: 0.01 * w for w in sizes}
    cold = {(w, x): 0.012 * w for w in sizes for x in flush}
    falling = CacheProfile.from_times(warm, cold, {0.125: (0.002, 0.0043), 0.25: (0.003, 0.0042), 0.5: (0.005, 0.006)})
    assert falling.near_ms == pytest.approx([0.0023, 0.0012, 0.001]) and not falling.near_resolved()
    assert not falling.near(np.array([0.1, 0.3, 2.0])).any()
    level = CacheProfile.from_times(warm, cold, {0.125: (0.002, 0.004), 0.25: (0.003, 0.005), 0.5: (0.005, 0.008)})
    assert level.near_resolved() and level.near(np.array([0.25]))[0] == pytest.approx(0.002)
    rows = normalize(pd.DataFrame(_rows("mobile", [(4, 0.25), (1, 5.0), (1, 5.0)])), "t")
    assert not falling.near_in_model_ms(rows).any() and level.near_in_model_ms(rows).any()
