"""Kernel-level transfer at every budget (issue 17, item 4): the adapted source blended per type with the new
device's own regressors (:class:`~leti.predict.kernels.blend.BlendedKernels`), on a made-up pair of devices whose
cost laws differ in a way no per-type affine map of the source expresses (the new device pads a convolution's
output channels to tiles of 32 and pays more per byte for weights past 256 KB)."""

import json

import numpy as np
import pandas as pd
import pytest

from leti.models.kernel_models import expected_row
from leti.predict.kernels import load_kernel_predictor
from leti.predict.kernels.adapt import AdaptedKernels
from leti.predict.kernels.blend import BlendedKernels, best_weight
from leti.predict.kernels.model import KernelLatencyPredictor
from leti.predict.kernels.overhead import Overhead
from leti.predict.kernels.predictor import KernelRegressors
from leti.predict.kernels.sampler import KernelSampler
from leti.predict.kernels.schema import normalize
from tests.predict.test_kernels import FAST

TYPES = ["conv2d", "relu"]


def _rows(sampler, n: int, seed: int, device: str) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    configs = [c for t in TYPES for c in sampler.draw(t, n, rng)]
    rows = normalize(pd.DataFrame([{**expected_row(c), "model": c.name, "kernel_index": 0} for c in configs]))
    byte = (rows.bytes_in + rows.bytes_out + rows.bytes_weights).to_numpy(np.float64)
    if device == "a":
        ms = 2e-3 + rows.flops / 4e9 + byte / 2e9
    else:
        pad = np.ceil(rows.output_c / 32) * 32 / rows.output_c  # GEMM tiles of 32 output channels
        conv = (rows.kernel_type == "conv2d").to_numpy()
        flops = np.where(conv, rows.flops * pad, rows.flops)
        cold = np.maximum(rows.bytes_weights - 2.5e5, 0.0)  # weights past 256 KB stream from memory
        ms = 1e-3 + flops / 1.5e9 + byte / 4e9 + cold / 2.5e8
    noise = np.exp(0.03 * np.random.default_rng(seed + 1).normal(size=len(rows)))
    return rows.assign(latency_ms=np.asarray(ms, np.float64) * noise, device=device, runtime="tflite-xnnpack")


@pytest.fixture(scope="module")
def devices():
    sampler = KernelSampler()
    source = KernelRegressors(**FAST).fit(_rows(sampler, 300, 0, "a"))
    return sampler, source, _rows(sampler, 200, 100, "b")


def _err(reg, rows: pd.DataFrame) -> float:
    """Held-out error: the median |log ratio| of the kernels."""
    return float(np.median(np.abs(np.log(reg.predict(rows)[0] / rows.latency_ms.to_numpy()))))


def _fits(source, rows):
    blend = BlendedKernels(source, "a", FAST).fit(rows)
    affine = AdaptedKernels(source, "a").fit(rows)
    scratch = KernelRegressors(**FAST).fit(rows)
    return blend, affine, scratch


def test_with_few_kernels_the_blend_leans_on_the_source_and_beats_scratch(devices):
    sampler, source, test = devices
    few = _rows(sampler, 25, 7, "b")
    blend, affine, scratch = _fits(source, few)
    e_blend, e_affine, e_scratch = _err(blend, test), _err(affine, test), _err(scratch, test)
    assert e_blend < 0.8 * e_scratch and e_blend < 1.1 * e_affine, (e_blend, e_affine, e_scratch)
    assert set(blend.cv_) == set(TYPES) and all(v["rows"] == 25 for v in blend.cv_.values())
    # a type measured fewer than MIN_OWN_ROWS times keeps the adapted source alone
    fewer = pd.concat([few[few.kernel_type == "conv2d"], few[few.kernel_type == "relu"].head(10)])
    b2 = BlendedKernels(source, "a", FAST).fit(fewer)
    assert "relu" not in b2.weight_ and "relu" not in b2.own.types_
    relu = test[test.kernel_type == "relu"]
    np.testing.assert_allclose(b2.predict(relu)[0], b2.adapted.predict(relu)[0])


def test_with_many_kernels_the_blend_learns_the_new_law_and_approaches_scratch(devices):
    """Over three draws of 250 kernels a type (one draw's cross-validation can favour either half: a few far-off
    kernels decide it), the device's own regressors take over on average and the blend's held-out error lands near
    scratch's, far under the affine map's; on every draw the chosen weight's CV error is the best of the three."""
    sampler, source, test = devices
    conv = test[test.kernel_type == "conv2d"]
    weights, errors = [], []
    for seed in (11, 12, 13):
        blend, affine, scratch = _fits(source, _rows(sampler, 250, seed, "b"))
        weights.append(blend.weight_["conv2d"])
        errors.append((_err(blend, conv), _err(affine, conv), _err(scratch, conv)))
        cv = blend.cv_["conv2d"]
        assert cv["blend"] <= min(cv["adapted"], cv["own"]) + 1e-12, cv
    e_blend, e_affine, e_scratch = np.mean(errors, axis=0)
    assert np.mean(weights) >= 0.5, weights  # the padded tiles: the device's own regressors take over
    assert e_blend < 0.75 * e_affine and e_blend < 1.15 * e_scratch + 0.005, errors


def test_best_weight_picks_the_better_half_and_ties_go_to_the_source():
    rng = np.random.default_rng(0)
    ly = rng.normal(size=50)
    good, bad = ly + 0.01 * rng.normal(size=50), ly + rng.normal(size=50)
    assert best_weight(bad, good, ly, np.ones(50))[0] == 1.0
    assert best_weight(good, bad, ly, np.ones(50))[0] == 0.0
    assert best_weight(good, good, ly, np.ones(50))[0] == 0.0
    # two halves wrong in opposite directions: the blend beats both
    w, err = best_weight(ly + 0.3, ly - 0.3, ly, np.ones(50))
    assert w == 0.5 and err["blend"] < 1e-12 < err["adapted"]


def test_blended_predictor_saves_and_loads_without_pickle(devices, tmp_path):
    sampler, source, test = devices
    blend = BlendedKernels(source, "a", FAST).fit(_rows(sampler, 60, 3, "b"))
    assert any(w > 0 for w in blend.weight_.values())
    pred = KernelLatencyPredictor(blend, Overhead(), "b", "tflite-xnnpack", "float")
    pred.save(tmp_path / "p")
    manifest = json.loads((tmp_path / "p" / "manifest.json").read_text())
    assert manifest["kernels"]["kind"] == "blended" and manifest["kernels"]["source_device"] == "a"
    assert (tmp_path / "p" / "base" / "types" / "conv2d").is_dir()  # the source's regressors travel with it
    for f in (tmp_path / "p").rglob("*"):
        if f.is_file():
            json.loads(f.read_text())  # manifest and XGBoost models: JSON, nothing pickled
    back = load_kernel_predictor(tmp_path / "p")
    assert back.regressors.weight_ == blend.weight_
    np.testing.assert_allclose(back.predict_kernels(test, where="t").predicted_ms,
                               pred.predict_kernels(test, where="t").predicted_ms, rtol=1e-5)
    # a weight its own regressors cannot back: refused as a damaged predictor
    manifest["kernels"]["weights"]["mul"] = 0.5
    (tmp_path / "p" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(Exception, match="weights do not match"):
        load_kernel_predictor(tmp_path / "p")


def _networks(source, rows: pd.DataFrame, test: pd.DataFrame):
    """Eight timed networks of ``test``'s kernels whose latencies the affine half alone fits exactly (so the
    networks, if asked, scale every weight down to 0)."""
    kernels = pd.concat([test[test.kernel_type == t].head(24) for t in TYPES], ignore_index=True)
    kernels = kernels.assign(model=[f"net-{i % 8:03d}" for i in range(len(kernels))])
    ms = AdaptedKernels(source, "a").fit(rows).predict(kernels)[0]
    nets = kernels.assign(ms=ms).groupby("model", as_index=False).ms.sum().rename(columns={"ms": "latency_ms"})
    return nets, kernels


def test_the_networks_scale_down_only_the_weights_of_types_measured_few_times(devices):
    from leti.predict.kernels.adapt_fit import adapt_to_build
    from leti.predict.kernels.blend import NETWORK_CHECK_ROWS

    sampler, source, test = devices
    src = KernelLatencyPredictor(source, Overhead(), "a", "tflite-xnnpack", "float")
    many = _rows(sampler, 250, 11, "b")
    few = pd.concat([many[many.kernel_type == "conv2d"].head(60), many[many.kernel_type == "relu"]], ignore_index=True)
    assert 60 < NETWORK_CHECK_ROWS <= 250
    # adapt_to_build fits the blend with the default settings; the networks, which the affine half fits exactly,
    # would scale every weight to 0
    nets = [adapt_to_build(src, rows, "b", "tflite-xnnpack", None, None, *_networks(source, rows, test)).regressors
            for rows in (many, few)]
    # 250 conv2d kernels: the networks may not overrule their weight (the padded tiles: the own regressors')
    assert nets[0].cv_["conv2d"]["rows"] == 250 and nets[0].weight_["conv2d"] >= 0.5, nets[0].cv_
    # 60: the networks take conv2d's weight down to 0
    assert nets[1].cv_["conv2d"]["rows"] == 60 and nets[1].weight_["conv2d"] == 0.0, nets[1].cv_
    assert nets[0].checked_types() == nets[1].checked_types() == []  # none left above 0 that the networks may scale


def test_a_source_whose_overhead_ramps_eviction_at_its_own_cache_adapts_on_networks(devices):
    """A store refitted with ``--cache-mb 24`` (the committed Zen 3 store) has an eviction term ramped at 24 MB; a
    transfer build scaled its overhead on the timed networks with aggregates that lacked that column and stopped
    with a traceback after its measurements (session 47). Now the networks are aggregated at the source's cache too."""
    from leti.predict.kernels.adapt_fit import adapt_to_build

    sampler, source, test = devices
    overhead = Overhead(["sum_ms", "evicted_mb@16"], [1.1, 0.05], cache_mb=24.0)
    assert overhead.cache_sizes() == (24.0,)
    src = KernelLatencyPredictor(source, overhead, "a", "tflite-xnnpack", "float")
    nets, kernels = _networks(source, _rows(sampler, 60, 3, "b"), test)
    pred = adapt_to_build(src, _rows(sampler, 60, 3, "b"), "b", "tflite-xnnpack", None, None, nets.head(5),
                          kernels[kernels.model.isin(nets.model.head(5))])
    assert "scaled by" in pred.overhead_note and "5 networks timed" in pred.overhead_note, pred.overhead_note
    got = pred.predict_models(kernels, allow_unknown=True)  # the adapted predictor keeps the source's cache
    assert pred.overhead.cache_sizes() == (24.0,) and len(got) == 8 and all(m.latency_ms > 0 for m in got)
