"""``transfer-boost`` (issue 17): single-device boosting plus the sources' op-cost predictions, for many target cells."""

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from leti.cli import app
from leti.predict.base import load_predictor
from leti.predict.metrics import spearman
from leti.predict.transfer import make_transfer
from leti.predict.transfer.data import load_transfer

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def files(tmp_path_factory, nb201_frame):
    """A target whose latencies are gold_6226's (renamed) on the first 1,200 cells, the four other devices as
    sources."""
    d = tmp_path_factory.mktemp("boost")
    f = nb201_frame[nb201_frame.arch_index < 1200]
    f[f.device == "gold_6226"].assign(device="newcpu").to_parquet(d / "target.parquet")
    f[f.device != "gold_6226"].to_parquet(d / "sources.parquet")
    return d


def test_sources_kept_when_they_explain_the_target_and_round_trip(files, tmp_path):
    """A target whose latency is a source's op-cost model (pixel2's, times 3, 2 % noise): the sources' op-cost
    columns must be kept (lower out-of-sample error on the training cells) and rank the held-out cells better
    than the same booster on the architecture alone (log error: trees approximate a sum of costs coarsely); saved and
    loaded, the predictor gives the same predictions."""
    data = load_transfer(files / "target.parquet", files / "sources.parquet")
    t = data.targets[0]
    tr, te = np.arange(400), np.arange(400, 1200)
    probe = make_transfer("transfer-boost", base="xgboost", select=False).fit(t.cells.take(tr), t.latency_ms[tr],
                                                                             data.sources)
    assert probe.chosen_ == "sources"
    a = probe._arch(t.cells)[:, probe.add_cols_]
    cost = np.c_[np.ones(len(a)), a] @ probe.add_costs_[data.sources.devices.index("pixel2")]
    y = 3 * cost * np.exp(0.02 * np.random.default_rng(0).standard_normal(len(cost)))
    model = make_transfer("transfer-boost", base="xgboost", average=False).fit(t.cells.take(tr), y[tr], data.sources)
    assert model.chosen_ == "sources" and model.oos_log_rmse_["sources"] < model.oos_log_rmse_["architecture"]
    arch = make_transfer("transfer-boost", base="xgboost", average=False).fit(t.cells.take(tr), y[tr], data.sources)
    arch.chosen_ = "architecture"
    arch.model_ = arch._booster().fit_features(arch._x(t.cells.take(tr)), y[tr])
    pred = model.predict(t.cells.take(te))
    err = np.sqrt(np.mean(np.log(pred / y[te]) ** 2))
    err_arch = np.sqrt(np.mean(np.log(arch.predict(t.cells.take(te)) / y[te]) ** 2))
    assert err < 0.8 * err_arch and spearman(y[te], pred) > 0.99, (err, err_arch)
    folder = model.save(tmp_path / "tb")
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["name"] == "transfer-boost" and manifest["state"]["chosen"] == "sources"
    assert not list(folder.glob("*.pkl"))
    np.testing.assert_allclose(load_predictor(folder).predict(t.cells.take(te)), pred, rtol=1e-6)


def test_bagged_base_gives_std_and_cli_evaluate(files, tmp_path, monkeypatch):
    from leti.predict.transfer import evaluate

    fitted = []  # the model the CLI fits (make_transfer(...).fit, in evaluate.fit_one), kept for the std checks below

    def keep(*args, **kwargs):
        out = fit_one(*args, **kwargs)
        fitted.append(out[0])
        return out

    fit_one = evaluate.fit_one
    monkeypatch.setattr(evaluate, "fit_one", keep)
    r = runner.invoke(app, ["evaluate", "--dataset", str(files / "target.parquet"), "--transfer-from",
                            str(files / "sources.parquet"), "--train-size", "300", "--seeds", "0", "--predictors",
                            "transfer-boost", "--set", "transfer-boost.base=catboost-bag", "--out", str(tmp_path / "e")])
    assert r.exit_code == 0, r.output
    res = json.loads((tmp_path / "e" / "results.json").read_text())
    row = res["devices"]["newcpu"]["transfer-boost"]["train_sizes"]["300"]
    assert row["mean"]["spearman"] > 0.95
    data = load_transfer(files / "target.parquet", files / "sources.parquet")
    t = data.targets[0]
    (m,) = fitted  # fitted on 300 cells with the sources, as make_transfer("transfer-boost", base="catboost-bag") is
    assert m.name == "transfer-boost" and m.base == "catboost-bag" and m.random_state == 0
    mean, std = m.predict(t.cells.take(np.arange(300, 400)), return_std=True)
    assert m.has_uncertainty and (std > 0).all() and np.isfinite(mean).all()


def test_cli_unknown_base_refused(files, tmp_path):
    r = runner.invoke(app, ["fit", "--dataset", str(files / "target.parquet"), "--transfer-from",
                            str(files / "sources.parquet"), "--predictor", "transfer-boost", "--train-size", "50",
                            "--param", "base=bogus", "--out", str(tmp_path / "b")])
    msg = str(r.exception)
    assert r.exit_code != 0 and "\n" not in msg and "bogus" in msg
    assert not (tmp_path / "b").exists()


def test_average_of_both_fits_round_trip(files, tmp_path):
    """Session 25's default: the architecture-only and the with-sources fits are both kept and their log predictions
    averaged (a calibrated base: its decision factor refitted on the average's out-of-sample predictions); the
    prediction is the geometric mean of the two fits', and it survives saving (the second fit's trees under
    architecture/)."""
    data = load_transfer(files / "target.parquet", files / "sources.parquet")
    t = data.targets[0]
    tr, te = np.arange(300), np.arange(300, 500)
    m = make_transfer("transfer-boost", base="xgboost").fit(t.cells.take(tr), t.latency_ms[tr], data.sources)
    assert m.chosen_ == "average" and m.arch_model_ is not None and m.offset_ == 0.0  # plain xgboost: no factor
    assert set(m.oos_log_rmse_) == {"sources", "architecture", "average"}
    assert m.oos_log_rmse_["average"] <= max(m.oos_log_rmse_["sources"], m.oos_log_rmse_["architecture"])
    cells = t.cells.take(te)
    ps, pa = m.model_.predict_features(m._x(cells, True)), m.arch_model_.predict_features(m._x(cells, False))
    pred = m.predict(cells)
    np.testing.assert_allclose(pred, np.sqrt(ps * pa), rtol=1e-5)
    assert not np.allclose(ps, pa, rtol=1e-3)
    folder = m.save(tmp_path / "avg")
    assert (folder / "architecture").is_dir()
    np.testing.assert_allclose(load_predictor(folder).predict(cells), pred, rtol=1e-6)
    cal = make_transfer("transfer-boost", base="catboost-bag-cal").fit(t.cells.take(tr), t.latency_ms[tr], data.sources)
    mean, std = cal.predict(cells, return_std=True)
    assert cal.chosen_ == "average" and abs(cal.offset_) <= 0.25
    np.testing.assert_allclose(mean, np.exp(cal._log_members(cells).mean(axis=0) + cal.offset_), rtol=1e-6)
    assert (std > 0).all() and np.isfinite(mean).all()
    np.testing.assert_allclose(load_predictor(cal.save(tmp_path / "cal")).predict(cells), mean, rtol=1e-6)
