"""The overhead's eviction term at the cache a predicted model has to itself (``Overhead.cache_mb``, ``leti kernels
build --cache-mb``): the local CPU's networks were timed under load, sharing the L3, and chose a 16 MB ramp; a quiet
host's model keeps more of its weights (session 26, local CPU: the quiet zoo's dev split 93.8 → 97.5 % at 24 MB)."""

import json

import numpy as np
import pandas as pd
import pytest

from leti.predict.kernels.model import KernelLatencyPredictor, load_kernel_predictor
from leti.predict.kernels.overhead import Overhead, evicted_term, model_aggregates
from leti.predict.kernels.schema import normalize


def _kernel(model: str, mb: float, ms: float = 0.5) -> dict:
    return {"model": model, "kernel_type": "conv2d", "input_h": 7, "input_w": 7, "input_c": 64, "output_h": 7,
            "output_w": 7, "output_c": 64, "kernel_h": 1, "kernel_w": 1, "bytes_weights": mb * 1e6, "bytes_out": 1e4,
            "device": "local", "runtime": "tflite-xnnpack", "precision": "float", "_ms": ms}


def _models() -> pd.DataFrame:
    # a: 6 MB (under half of either cache); b: 10 MB (past half of 16, under half of 24); c: 20 MB; d: 40 MB
    rows = [_kernel("a", 3), _kernel("a", 3), _kernel("b", 5), _kernel("b", 5), _kernel("c", 10), _kernel("c", 10),
            *[_kernel("d", 5) for _ in range(8)]]
    return normalize(pd.DataFrame(rows), "t").assign(_ms=[r["_ms"] for r in rows])


def test_the_eviction_term_ramps_at_the_hosts_cache_with_the_fitted_coefficient():
    t = _models()
    fitted = Overhead(["sum_ms", evicted_term(16)], [1.0, 0.02])
    quiet = Overhead(["sum_ms", evicted_term(16)], [1.0, 0.02], cache_mb=24.0)
    assert fitted.cache_sizes() == () and quiet.cache_sizes() == (24.0,)
    agg = model_aggregates(t, t._ms.to_numpy(), quiet.cache_sizes())
    assert evicted_term(24) in agg and evicted_term(16) in agg
    sums = agg.sum_ms.to_numpy()
    loaded, alone = fitted.predict(agg) - sums, quiet.predict(agg) - sums
    # a 6 MB model loses nothing either way; the 10 MB one loses 1/4 of a 16 MB cache and nothing of a 24 MB one
    assert loaded[0] == pytest.approx(0) and alone[0] == pytest.approx(0)
    assert loaded[1] == pytest.approx(0.02 * 10 * 0.25) and alone[1] == pytest.approx(0)
    # 20 MB: all of a 16 MB cache, 2/3 of a 24 MB one; 40 MB: all of both, at the same cost per MB
    assert loaded[2] == pytest.approx(0.02 * 20) and alone[2] == pytest.approx(0.02 * 20 * (20 - 12) / 12)
    assert loaded[3] == pytest.approx(alone[3]) == pytest.approx(0.02 * 40)
    # aggregates without the host's size are refused, not silently priced at the fitted one
    with pytest.raises(ValueError, match="evicted_mb@24"):
        quiet.predict(model_aggregates(t, t._ms.to_numpy()))
    # an overhead without an eviction term has no extra size to weigh
    assert Overhead(["sum_ms"], [1.0], cache_mb=24.0).cache_sizes() == ()


class _Fixed:
    """Kernel regressors stand-in: every kernel 0.5 ms."""

    def resolve(self, types, _x, _allow, _where):
        return types.to_numpy()

    def predict(self, table, _types):
        return np.full(len(table), 0.5), np.zeros(len(table))

    def save_files(self, _folder):
        pass

    def state(self):
        return {"stand-in": True}


def test_a_predictor_keeps_the_hosts_cache_through_save_and_load(tmp_path, monkeypatch):
    t = _models().drop(columns=["_ms"])
    p = KernelLatencyPredictor(_Fixed(), Overhead(["sum_ms", evicted_term(16)], [1.0, 0.02], cache_mb=24.0),
                               "local", "tflite-xnnpack", "float")
    by_model = {m.model: m.latency_ms for m in p.predict_models(t)}
    assert by_model["b"] == pytest.approx(1.0) and by_model["c"] == pytest.approx(1.0 + 0.02 * 20 * 8 / 12)
    p.save(tmp_path / "p")
    manifest = json.loads((tmp_path / "p" / "manifest.json").read_text())
    assert manifest["overhead"]["cache_mb"] == 24.0
    monkeypatch.setattr("leti.predict.kernels.blend.regressors_from_state", lambda _s, _f: _Fixed())
    again = load_kernel_predictor(tmp_path / "p")
    assert again.overhead.cache_mb == 24.0
    assert {m.model: m.latency_ms for m in again.predict_models(t)} == pytest.approx(by_model)
    # a predictor saved without it (every one before session 26, the engine's) ramps at its fitted size
    del manifest["overhead"]["cache_mb"]
    (tmp_path / "p" / "manifest.json").write_text(json.dumps(manifest))
    old = load_kernel_predictor(tmp_path / "p")
    assert old.overhead.cache_mb == 0.0
    assert {m.model: m.latency_ms for m in old.predict_models(t)}["b"] == pytest.approx(1.0 + 0.02 * 10 * 0.25)
    # and saves without the key, as before
    KernelLatencyPredictor(_Fixed(), old.overhead, "local", "tflite-xnnpack", "float").save(tmp_path / "q")
    assert "cache_mb" not in json.loads((tmp_path / "q" / "manifest.json").read_text())["overhead"]


@pytest.mark.parametrize("extra", [["--cache-mb", "-4"], ["--cache-mb", "24", "--transfer-from", "src"]])
def test_the_build_refuses_a_negative_cache_or_one_with_a_transfer(capsys, tmp_path, extra):
    from tests.device.conftest import run_leti

    code, _, err = run_leti(capsys, "kernels", "build", "--device", "local", "--budget-minutes", "1",
                            "--out", tmp_path / "kp", *extra)
    assert code == 1 and "--cache-mb must be 0 or above and goes without --transfer-from" in err, err
    assert not (tmp_path / "kp").exists()
