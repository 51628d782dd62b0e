"""Coverage weights (issue 16): a kernel build's fit weighs each measured kernel by its closeness to the kernels of
real networks, so the corners adaptive rounds measure do not set the error where models are."""

import numpy as np
import pandas as pd
import pytest

from leti.models.kernel_models import KernelConfig, expected_row
from leti.predict.base import make_predictor
from leti.predict.kernels.coverage import CLIP, MIN_ROWS, coverage_weights, real_shapes
from leti.predict.kernels.predictor import KernelRegressors
from leti.predict.kernels.schema import normalize
from leti.predict.kernels.sampler import KernelSampler


def _rows(configs, ms) -> pd.DataFrame:
    rows = [dict(expected_row(c), model=f"k{i}", latency_ms=m, device="engine", runtime="leti-engine-cpu",
                 precision="float") for i, (c, m) in enumerate(zip(configs, ms))]
    return normalize(pd.DataFrame(rows), "test")


def _mixed_conv2d(n_real: int = 60, n_corner: int = 60, seed: int = 0):
    """conv2d kernels drawn from the real distribution and corner ones no real network has (1×1 maps of 900+
    channels with 1-3 outputs, 5×5 windows on 1-2 channels at 60+ pixels)."""
    rng = np.random.default_rng(seed)
    real = KernelSampler().draw("conv2d", n_real, rng, uniform_share=0.0)
    corner = []
    for i in range(n_corner):
        if i % 2:
            corner.append(KernelConfig("conv2d", 1, 1, int(rng.integers(900, 1500)), kernel=1,
                                       output_c=int(rng.integers(1, 4))))
        else:
            corner.append(KernelConfig("conv2d", int(rng.integers(60, 90)), int(rng.integers(60, 90)),
                                       int(rng.integers(1, 3)), kernel=5, output_c=int(rng.integers(1, 3))))
    return real, corner


def test_real_like_kernels_outweigh_corner_kernels_and_weights_average_one_per_type():
    real, corner = _mixed_conv2d()
    adds = [KernelConfig("add", 8 + i, 8 + i, 16) for i in range(10)]  # too few rows to weigh: all 1
    table = _rows(real + corner + adds, np.ones(len(real) + len(corner) + len(adds)))
    w = coverage_weights(table)
    wr, wc, wa = w[: len(real)], w[len(real): len(real) + len(corner)], w[len(real) + len(corner):]
    assert np.mean(wr) > 2 * np.mean(wc)
    assert np.mean(np.r_[wr, wc]) == pytest.approx(1.0)
    assert np.all(wa == 1.0) and len(adds) < MIN_ROWS
    assert np.max(np.r_[wr, wc]) / np.min(np.r_[wr, wc]) <= CLIP * CLIP + 1e-9  # clipped both sides of the median


def test_real_shapes_are_cached_and_types_without_real_kernels_have_none():
    assert real_shapes("conv2d") is real_shapes("conv2d")
    assert real_shapes("transpose") is None  # a synthetic seed type: no real network to weigh by


def test_weighted_bootstrap_never_draws_a_zero_weight_row():
    booster = make_predictor("xgboost", target="log", n_members=3, n_estimators=5, max_depth=2)
    weight = np.r_[np.zeros(50), np.ones(50)]
    for i in range(3):
        idx = booster._bag(i, 100, weight)
        assert len(idx) == 100 and idx.min() >= 50
    assert booster._bag(0, 100).min() < 50  # unweighted: every row can be drawn


def test_coverage_fit_answers_real_kernels_better_when_corners_follow_another_law():
    # the corners cost 3x what the real kernels' law says: an unweighted fit splits the difference near them,
    # the weighted one stays with the real kernels' law where real kernels are
    real, corner = _mixed_conv2d(120, 120, seed=1)
    table = _rows(real + corner, np.ones(len(real) + len(corner)))
    law = 2e-9 * table.flops.to_numpy() + 1e-3
    table["latency_ms"] = np.where(np.arange(len(table)) < len(real), law, 3 * law)
    test_real, _ = _mixed_conv2d(60, 0, seed=2)
    probe = _rows(test_real, np.ones(len(test_real)))
    probe["latency_ms"] = 2e-9 * probe.flops.to_numpy() + 1e-3
    params = {"n_members": 2, "n_estimators": 40, "max_depth": 3}
    errs = {}
    for cov in (False, True):
        reg = KernelRegressors(**params, coverage=cov).fit(table)
        assert reg.params["coverage"] is cov
        ms, _ = reg.predict(probe)
        errs[cov] = float(np.mean(np.abs(np.log(ms / probe.latency_ms.to_numpy()))))
    assert errs[True] < errs[False]



def _noisy_corner_table(seed: int = 3) -> tuple[pd.DataFrame, int]:
    """conv2d kernels of the real distribution on a smooth law, and as many corner ones (1-2 channels in, large maps)
    whose times scatter ±2.5x and are as long as the longest real ones: what made session 50's adaptive rounds draw
    corners."""
    import json

    real, corner = _mixed_conv2d(80, 80, seed=seed)
    table = _rows(real + corner, np.ones(len(real) + len(corner)))
    rng = np.random.default_rng(seed)
    law = 2e-9 * table.flops.to_numpy() + 1e-3
    scatter = np.exp(rng.uniform(-0.9, 0.9, len(table)))
    is_corner = np.arange(len(table)) >= len(real)
    table["latency_ms"] = np.where(is_corner, law[~is_corner].max() * scatter, law * np.exp(rng.normal(0, 0.05, len(table))))
    table["config"] = [json.dumps(c.to_dict(), sort_keys=True) for c in real + corner]
    return table, len(real)


def test_worst_kernels_steering_the_next_round_are_real_like_with_coverage():
    from leti.predict.kernels.build_fit import cv_by_type

    table, n_real = _noisy_corner_table()
    corner_names = {KernelConfig.from_dict(__import__("json").loads(c)).name for c in table.config.iloc[n_real:]}
    params = {"n_members": 2, "n_estimators": 30, "max_depth": 3}
    shares = {}
    for cov in (False, True):
        cv, worst, reg, odds = cv_by_type(table, {**params, "coverage": cov}, seed=0)
        assert (odds is not None) is cov and reg.params["coverage"] is cov
        picked = worst["conv2d"]
        assert len(picked) == len(table) // 5
        shares[cov] = np.mean([c.name in corner_names for c in picked])
    assert shares[False] > 0.6  # the noisy, slow corners are "worst" by error alone
    assert shares[True] < 0.3  # weighed by their odds of being a real network's kernel, they are not


def test_candidate_scores_discount_corners_of_equal_uncertainty():
    from leti.predict.kernels.build_fit import candidate_scores, predicted_log_std
    from leti.predict.kernels.coverage import RealOdds

    table, n_real = _noisy_corner_table(seed=4)
    reg = KernelRegressors(n_members=3, n_estimators=30, max_depth=3).fit(table)
    odds = RealOdds(table)
    real, corner = _mixed_conv2d(30, 30, seed=5)
    spread = predicted_log_std(reg, real + corner)
    value = candidate_scores(reg, real + corner, odds)
    closeness = value / spread
    assert np.all(closeness >= 1 / CLIP - 1e-9) and np.all(closeness <= CLIP + 1e-9)
    assert np.median(closeness[:30]) > 2 * np.median(closeness[30:])
    assert np.array_equal(candidate_scores(reg, real, None), predicted_log_std(reg, real))  # no odds: the spread alone


def test_measurement_cost_reads_the_store_and_candidate_scores_pay_for_long_kernels(tmp_path):
    from leti.predict.kernels.build_fit import MeasurementCost, candidate_scores, measurement_cost
    from leti.predict.kernels.build_store import BuildStore

    with BuildStore(tmp_path / "k.sqlite") as store:
        assert measurement_cost(store) == MeasurementCost()  # nothing measured: the defaults
        ms = np.geomspace(0.01, 50, 400)
        with store.db:
            for i, m in enumerate(ms):
                store.db.execute("INSERT INTO items (kind, name, round, origin, kernel_type, config, status, mean_ms, "
                                 "seconds) VALUES ('kernel', ?, 0, 'initial', 'conv2d', '{}', 'ok', ?, ?)",
                                 (f"k{i}", float(m), 0.1 + 0.2 * float(m)))
        cost = measurement_cost(store)
    assert cost(np.array([0.01]))[0] == pytest.approx(0.102, rel=0.05)
    assert cost(np.array([10.0]))[0] == pytest.approx(2.1, rel=0.1)
    assert cost(np.array([500.0]))[0] > cost(np.array([50.0]))[0] * 5  # past the longest kernels: in proportion
    table, _ = _noisy_corner_table(seed=6)
    reg = KernelRegressors(n_members=3, n_estimators=30, max_depth=3).fit(table)
    real, _ = _mixed_conv2d(40, 0, seed=7)
    plain = candidate_scores(reg, real, None)
    paid = candidate_scores(reg, real, None, cost)
    pred_ms = reg.predict(_rows(real, np.ones(len(real))))[0]
    assert np.allclose(paid, plain * np.sqrt(pred_ms) / cost(pred_ms))
