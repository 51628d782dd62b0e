"""Few-shot latency transfer (issue 17): predictors, the CLI contract and its refusals."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from leti.cli import app
from leti.predict.base import load_predictor, make_predictor
from leti.predict.data import load_dataset
from leti.predict.metrics import spearman
from leti.predict.transfer import TRANSFER, make_transfer
from leti.predict.transfer.data import load_transfer, sources_from

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def files(tmp_path_factory, nb201_frame):
    """pixel2 (target) and the four other devices (sources) on the first 600 NB201 cells, plus variants."""
    d = tmp_path_factory.mktemp("transfer")
    f = nb201_frame[nb201_frame.arch_index < 600]
    f[f.device == "pixel2"].to_parquet(d / "target.parquet")
    f[f.device != "pixel2"].to_parquet(d / "sources.parquet")
    f[f.device.isin(["raspi4", "pixel2"])].to_parquet(d / "with_target.parquet")
    f[f.device == "pixel2"][["arch"]].to_parquet(d / "cells.parquet")
    g = nb201_frame[(nb201_frame.arch_index >= 600) & (nb201_frame.arch_index < 900)]
    g[g.device != "pixel2"].to_parquet(d / "disjoint.parquet")
    return d


def run(*args):
    r = runner.invoke(app, [str(a) for a in args])
    return r, str(r.exception) if r.exception else ""


@pytest.mark.parametrize("name", ["transfer-ridge", "transfer-help"])
def test_fit_predict_std_save_load(name, files, tmp_path):
    data = load_transfer(files / "target.parquet", files / "sources.parquet")
    t = data.targets[0]
    model = make_transfer(name, **({"steps": 60} if name == "transfer-help" else {}))
    assert model.fit(t.cells.take(np.arange(10)), t.latency_ms[:10], data.sources) is model
    test = t.cells.take(np.arange(10, 600))
    mean, std = model.predict(test, return_std=True)
    assert mean.shape == (590,) and np.isfinite(mean).all() and (mean > 0).all() and (std > 0).all()
    assert spearman(t.latency_ms[10:], mean) > 0.5
    folder = model.save(tmp_path / name)
    assert json.loads((folder / "manifest.json").read_text())["name"] == name
    assert not list(folder.glob("*.pkl"))
    loaded = load_predictor(folder)
    assert type(loaded) is type(model)
    np.testing.assert_allclose(loaded.predict(test), mean, rtol=1e-6)
    # the arch strings of a plain table are looked up in the saved sources
    np.testing.assert_allclose(loaded.predict(pd.read_parquet(files / "cells.parquet")[10:]), mean, rtol=1e-6)


def leave_one_out(nb201_frame, device, seeds):
    """``device`` on the first 3,000 NB201 cells as the target, the four others as sources, and per seed
    10 random train cells and the rest to test."""
    data = {d.device: d for d in load_dataset_frame(nb201_frame[nb201_frame.arch_index < 3000])}
    target = data.pop(device)
    n = len(target.latency_ms)
    perms = [np.random.default_rng(seed).permutation(n)[:10] for seed in range(seeds)]
    return target, sources_from(list(data.values())), [(tr, np.setdiff1d(np.arange(n), tr)) for tr in perms]


def test_transfer_beats_scratch_at_10(nb201_frame):
    """gold_6226 from the four other devices: 10 target cells, 3 seeds, every seed far ahead of the best
    from-scratch predictors fitted on the same 10 cells."""
    target, src, splits = leave_one_out(nb201_frame, "gold_6226", 3)
    y = target.latency_ms
    margins = []
    for seed, (tr, te) in enumerate(splits):
        tl = make_transfer("transfer-ridge").fit(target.cells.take(tr), y[tr], src).predict(target.cells.take(te))
        scratch = max(spearman(y[te], make_predictor(s, **kw).fit(target.cells.take(tr), y[tr])
                               .predict(target.cells.take(te)))
                      for s, kw in (("catboost-rich", {"random_state": seed}), ("ransac", {}), ("flops", {})))
        margins.append(spearman(y[te], tl) - scratch)
        assert spearman(y[te], tl) > 0.93, seed
    # Spearman on ~3,000 test cells varies by ~0.002 between test sets: a margin of 0.02 on every seed
    # and 0.03 on average is not chance
    assert min(margins) > 0.02 and np.mean(margins) > 0.03, margins


def test_eyeriss_from_op_counts_at_10(nb201_frame):
    """eyeriss correlates only ~0.5 with the four other devices but is nearly additive in the op counts: the
    op-count variants of transfer-ridge must find that from 10 cells (the source-and-architecture variants
    alone ranked it at ~0.78 on the full split)."""
    target, src, splits = leave_one_out(nb201_frame, "eyeriss", 2)
    y = target.latency_ms
    rho = []
    for tr, te in splits:
        model = make_transfer("transfer-ridge").fit(target.cells.take(tr), y[tr], src)
        rho.append(spearman(y[te], model.predict(target.cells.take(te))))
        assert any(m["counts"] for m in model.models_)
    assert min(rho) > 0.87 and np.mean(rho) > 0.9, rho


def test_additive_costs_rank_gold_at_10(nb201_frame):
    """gold_6226 is nearly a sum of op costs in milliseconds: the millisecond models (op costs with the
    sources' costs as the prior) must carry the mixture and rank it better than the log-space models alone
    on every seed (measured: 0.989-0.993 against 0.954-0.988 on these cells)."""
    target, src, splits = leave_one_out(nb201_frame, "gold_6226", 3)
    y = target.latency_ms
    log_only = "src-iso,src-ard,arch-iso,arch-ard,counts,counts-arch,src-counts-arch"
    for tr, te in splits:
        model = make_transfer("transfer-ridge").fit(target.cells.take(tr), y[tr], src)
        mean, std = model.predict(target.cells.take(te), return_std=True)
        assert np.isfinite(std).all() and (std > 0).all()
        weight = sum(w for m, w in zip(model.models_, model.weights_) if m["name"].startswith("additive"))
        logs = make_transfer("transfer-ridge", variants=log_only).fit(target.cells.take(tr), y[tr], src)
        rho, rho_log = spearman(y[te], mean), spearman(y[te], logs.predict(target.cells.take(te)))
        assert weight > 0.5 and rho > 0.985 and rho > rho_log + 0.001, (weight, rho, rho_log)


def test_additive_each_centres_one_model_on_each_source(nb201_frame, tmp_path):
    """``additive-each``: one op-cost model per source, centred on that source's cost vector. For gold_6226 the
    CPU-like pixel2 and the titan GPU (whose cost vectors alone rank gold at 0.95 and 0.94) must outweigh
    eyeriss (0.46), and the per-source models survive saving (their centre is part of the state)."""
    target, src, splits = leave_one_out(nb201_frame, "gold_6226", 2)
    y = target.latency_ms
    for tr, te in splits:
        model = make_transfer("transfer-ridge", variants="additive,additive-each").fit(target.cells.take(tr), y[tr], src)
        w = {m["name"]: wk for m, wk in zip(model.models_, model.weights_)}
        assert set(w) == {"additive", *(f"additive@{d}" for d in src.devices)}
        assert min(w["additive@pixel2"], w["additive@titan_rtx_1"]) > w["additive@eyeriss"], w
        # centred on one source: the prior-mean column is that source's op-cost prediction
        i = src.devices.index("pixel2")
        x, _ = model._additive_design(model._inputs(target.cells.take(te[:50])), True, i)
        a = model._arch(target.cells.take(te[:50]))[:, model.add_cols_]
        np.testing.assert_allclose(x[:, 0], 3.0 * np.c_[np.ones(50), a] @ model.add_costs_[i])
        back = load_predictor(model.save(tmp_path / f"each{tr[0]}"))
        np.testing.assert_allclose(back.predict(target.cells.take(te)), model.predict(target.cells.take(te)), rtol=1e-6)


def test_unknown_variant_refused(files, tmp_path):
    r, exc = run("fit", "--dataset", files / "target.parquet", "--transfer-from", files / "sources.parquet",
                 "--train-size", 10, "--param", "variants=bogus", "--out", tmp_path / "v")
    assert r.exit_code != 0 and "unknown transfer-ridge variants bogus" in exc and "additive" in exc
    assert not (tmp_path / "v").exists()
    r, exc = run("fit", "--dataset", files / "target.parquet", "--transfer-from", files / "sources.parquet",
                 "--train-size", 10, "--param", "blend=warm", "--out", tmp_path / "b")
    assert r.exit_code != 0 and "blend must be a temper >= 0" in exc and "'warm'" in exc
    assert not (tmp_path / "b").exists()
    r, exc = run("fit", "--dataset", files / "target.parquet", "--transfer-from", files / "sources.parquet",
                 "--train-size", 10, "--param", "blend=4", "--out", tmp_path / "b")
    assert r.exit_code == 0, (r.output, exc)
    # the mixture and two anchors (FLOPs, the mean source profile)
    assert len(load_predictor(tmp_path / "b").blend_weights_) == 1 + 2


def load_dataset_frame(frame):
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "f.parquet"
        frame.to_parquet(p)
        return load_dataset(p)


def test_cli_fit_choose_then_predict(files, tmp_path):
    r, exc = run("fit", "--dataset", files / "target.parquet", "--transfer-from", files / "sources.parquet",
                 "--train-size", 10, "--choose", "--out", tmp_path / "P")
    assert r.exit_code == 0, (r.output, exc)
    assert "10 chosen cells" in r.output
    r, exc = run("predict", "--predictor", tmp_path / "P", "--cells", files / "cells.parquet", "--out",
                 tmp_path / "pred.parquet")
    assert r.exit_code == 0, (r.output, exc)
    pred = pd.read_parquet(tmp_path / "pred.parquet")
    assert len(pred) == 600 and (pred.predicted_ms > 0).all()
    y = pd.read_parquet(files / "target.parquet").latency_ms.to_numpy()
    assert spearman(y, pred.predicted_ms.to_numpy()) > 0.7


def test_cli_evaluate_reports_per_size(files, tmp_path):
    r, exc = run("evaluate", "--dataset", files / "target.parquet", "--transfer-from", files / "sources.parquet",
                 "--train-size", "10,20", "--seeds", "0,1", "--predictors", "transfer-ridge,flops",
                 "--out", tmp_path / "E")
    assert r.exit_code == 0, (r.output, exc)
    res = json.loads((tmp_path / "E" / "results.json").read_text())
    assert res["train_size"] == [10, 20] and res["seeds"] == [0, 1] and "pixel2" not in res["sources"]
    tr = res["devices"]["pixel2"]["transfer-ridge"]
    for n in ("10", "20"):
        entry = tr["train_sizes"][n]
        assert len(entry["seeds"]) == 2 and entry["seeds"][0]["train"] == int(n)
        for m in ("acc@10%", "spearman", "r2", "rmspe"):
            assert np.isfinite(entry["mean"][m]) and np.isfinite(entry["std"][m])
    assert tr["mean"] == tr["train_sizes"]["10"]["mean"]  # today's fields: the first train size
    assert "| transfer-ridge | 20 |" in (tmp_path / "E" / "table.md").read_text()


def test_cli_choose(files, tmp_path):
    r, exc = run("choose", "--dataset", files / "sources.parquet", "--cells", files / "cells.parquet", "--budget", 7,
                 "--out", tmp_path / "chosen.parquet")
    assert r.exit_code == 0, (r.output, exc)
    chosen = pd.read_parquet(tmp_path / "chosen.parquet")
    assert len(chosen) == 7 and chosen.arch.nunique() == 7 and list(chosen.choice_rank) == list(range(7))
    assert set(chosen.arch) <= set(pd.read_parquet(files / "cells.parquet").arch)


def test_refusals(files, tmp_path):
    t, s = files / "target.parquet", files / "sources.parquet"
    r, exc = run("fit", "--dataset", t, "--transfer-from", files / "with_target.parquet", "--train-size", 10,
                 "--out", tmp_path / "a")
    assert r.exit_code != 0 and "target device 'pixel2'" in exc and "among the sources" in exc
    r, exc = run("evaluate", "--dataset", t, "--transfer-from", files / "with_target.parquet", "--train-size", 10,
                 "--out", tmp_path / "b")
    assert r.exit_code != 0 and "among the sources" in exc
    r, exc = run("fit", "--dataset", t, "--transfer-from", files / "disjoint.parquet", "--train-size", 10,
                 "--out", tmp_path / "c")
    assert r.exit_code != 0 and "share no cells" in exc and "reference set" in exc
    r, exc = run("fit", "--dataset", t, "--transfer-from", s, "--train-size", 601, "--out", tmp_path / "d")
    assert r.exit_code != 0 and "larger than the target table" in exc and "600 cells" in exc
    r, exc = run("evaluate", "--dataset", t, "--transfer-from", s, "--train-size", "10,600", "--out", tmp_path / "e")
    assert r.exit_code != 0 and "larger than the target table" in exc
    r, exc = run("choose", "--dataset", s, "--cells", files / "cells.parquet", "--budget", 601, "--out",
                 tmp_path / "f.parquet")
    assert r.exit_code != 0 and "larger than the 600 candidate cells" in exc
    r, exc = run("fit", "--dataset", t, "--transfer-from", s, "--predictor", "catboost", "--out", tmp_path / "g")
    assert r.exit_code != 0 and "needs a transfer predictor" in exc
    r, exc = run("fit", "--dataset", t, "--out", tmp_path / "h")
    assert r.exit_code != 0 and "--predictor is required" in exc
    r, exc = run("evaluate", "--dataset", t, "--train-size", "10,20", "--out", tmp_path / "i")
    assert r.exit_code != 0 and "one integer" in exc
    assert not any((tmp_path / x).exists() for x in "acdg")


def test_refuses_different_models_naming_both(files, tmp_path):
    """NB201 vs NB101, and NB101 one cell on 32x32x64 vs the stacked network: one line naming both files."""
    r = subprocess.run([sys.executable, "-m", "leti", "fit", "--dataset", str(files / "target.parquet"),
                        "--transfer-from", str(ROOT / "datasets" / "nb101_local_cpu.parquet"), "--train-size", "10",
                        "--out", str(tmp_path / "x")], capture_output=True, text=True)
    assert r.returncode != 0 and r.stderr.count("\n") == 1 and r.stderr.startswith("error: ")
    assert "target.parquet" in r.stderr and "nb101_local_cpu.parquet" in r.stderr and "different models" in r.stderr
    r, exc = run("fit", "--dataset", ROOT / "datasets" / "nb101_local_cpu_net32.parquet", "--transfer-from",
                 ROOT / "datasets" / "nb101_engine_cpu.parquet", "--train-size", 10, "--out", tmp_path / "y")
    assert r.exit_code != 0 and "stacked network" in exc and "one cell on 32x32x64" in exc
    assert "nb101_local_cpu_net32.parquet" in exc and "nb101_engine_cpu.parquet" in exc


def test_registry_lists_transfer_predictors():
    assert set(TRANSFER.names()) == {"transfer-ridge", "transfer-help", "transfer-boost"}
    with pytest.raises(Exception, match="needs source devices"):
        make_predictor("transfer-ridge").fit(["|none~0|+|none~0|none~1|+|none~0|none~1|none~2|"], [1.0])


def test_design_choice_spreads_cells_where_the_sources_disagree(files):
    """``design`` keeps one cell per stratum of the mean source profile (as ``stratified``) and, within them,
    spreads the cells along the directions in which the sources disagree: its chosen cells' design has a larger
    determinant than stratified's on every seed."""
    from leti.predict.transfer.base import source_profile
    from leti.predict.transfer.choose import choose

    data = load_transfer(files / "target.parquet", files / "sources.parquet")
    cells = data.targets[0].cells
    z = source_profile(data.sources, cells)
    x = np.concatenate([np.ones((len(z), 1)), (z - z.mean(0)) / z.std(0)], 1)
    rank = np.argsort(np.argsort(z.mean(1), kind="stable"), kind="stable")
    for seed in range(3):
        d, s = choose(data.sources, cells, 10, seed=seed), choose(data.sources, cells, 10, "stratified", seed)
        assert len(set(d)) == 10 and sorted(rank[d] * 10 // len(z)) == list(range(10))  # one per stratum
        logdet = lambda idx: np.linalg.slogdet(x[idx].T @ x[idx] + 1e-6 * np.eye(x.shape[1]))[1]  # noqa: E731
        assert logdet(d) > logdet(s)
    assert not np.array_equal(choose(data.sources, cells, 10, seed=0), choose(data.sources, cells, 10, seed=1))


def help_style_split(nb201_frame, device, seeds):
    """HELP's meta-test split on the first 3,000 NB201 cells: per seed 10 train cells from archs 0-899 and the
    query archs 900-1899, both without the target's 10 % fastest and slowest."""
    from leti.predict.transfer.data import cell_keys

    frame = nb201_frame[nb201_frame.arch_index < 3000]
    data = {d.device: d for d in load_dataset_frame(frame)}
    target = data.pop(device)
    arch = frame.drop_duplicates("arch").set_index("arch").arch_index.reindex(cell_keys(target.cells)).to_numpy()

    def trim(mask):
        ix = np.flatnonzero(mask)
        ix = ix[np.argsort(target.latency_ms[ix], kind="stable")]
        return ix[int(len(ix) * 0.1):int(len(ix) * 0.9)]

    pool, query = trim(arch < 900), trim((arch >= 900) & (arch < 1900))
    return target, sources_from(list(data.values())), [np.random.default_rng(s).permutation(pool)[:10]
                                                       for s in range(seeds)], query


def test_blend_anchors_where_ten_samples_mislead(nb201_frame, tmp_path):
    """``blend=4``: raspi4 on HELP's split: ten trimmed samples lead the evidence mixture off the FLOPs ranking (0.77 on two
    of three seeds); the blend with the zero-shot anchors, weighted by cross-validated error, must recover part of
    it (session 20, before the outliers were left out: 0.843 against 0.818 on average; 0.808 / 0.803 against
    0.765 / 0.772 on those two). gold_6226: the mixture's cross-validated error is far lower, so
    it keeps most of the weight and its ranking. The blend survives saving."""
    for device, gain in (("raspi4", 0.015), ("gold_6226", -0.002)):
        target, src, trains, query = help_style_split(nb201_frame, device, 3)
        y, test = target.latency_ms, target.cells.take(query)
        rho, rho0 = [], []
        for tr in trains:
            model = make_transfer("transfer-ridge", blend=4).fit(target.cells.take(tr), y[tr], src)
            alone = make_transfer("transfer-ridge").fit(target.cells.take(tr), y[tr], src)  # no blend by default
            assert alone.anchor_coef_.shape == (0, 2) and model.anchor_coef_.shape == (2, 2)
            assert np.isclose(model.blend_weights_.sum(), 1.0) and len(model.blend_weights_) == 3
            assert not alone.dropped_.any() and model.dropped_.sum() <= 2
            rho.append(spearman(y[query], model.predict(test)))
            rho0.append(spearman(y[query], alone.predict(test)))
            if device == "gold_6226":
                assert model.blend_weights_[0] > 0.5, model.blend_weights_
                assert rho[-1] > rho0[-1] + gain, (rho, rho0)
        assert np.mean(rho) > np.mean(rho0) + gain, (device, rho, rho0)
    back = load_predictor(model.save(tmp_path / "blend"))
    np.testing.assert_allclose(back.predict(test), model.predict(test), rtol=1e-6)
    np.testing.assert_allclose(back.blend_weights_, model.blend_weights_)


def test_blend_outliers_and_legacy_anchors(nb201_frame):
    """The blend leaves out at most two samples far from the mixture's cross-validated errors (never on clean ones);
    a predictor saved with one anchor per source device (before session 24) still predicts with them."""
    from leti.predict.transfer.ridge import ROBUST_FLOOR, TransferRidge

    resid = np.array([0.01, -0.02, 0.0, 0.03, -0.01, 0.02, -0.03, 0.0, 0.01, -0.9])
    assert TransferRidge._outliers(resid).tolist() == [False] * 9 + [True]
    assert not TransferRidge._outliers(resid[:-1] * 2).any()  # within the floor: nothing left out
    many = np.array([0.0, 0.01, -0.01, 0.02, 1.0, -1.2, 1.5, 0.0, -0.02, 0.01])
    assert TransferRidge._outliers(many).sum() == 2 and TransferRidge._outliers(many)[[5, 6]].all()
    assert ROBUST_FLOOR > 0
    target, src, trains, query = help_style_split(nb201_frame, "gold_6226", 1)
    tr = trains[0]
    model = make_transfer("transfer-ridge", blend=4).fit(target.cells.take(tr), target.latency_ms[tr], src)
    test = target.cells.take(query)
    before, d = model.predict(test), len(src.devices)
    legacy = np.vstack([model.anchor_coef_[:1], np.zeros((d, 2)), model.anchor_coef_[1:]])
    model.anchor_coef_ = legacy
    model.blend_weights_ = np.concatenate([model.blend_weights_[:2], np.zeros(d), model.blend_weights_[2:]])
    model.blend_var_ = np.concatenate([model.blend_var_[:2], np.ones(d), model.blend_var_[2:]])
    np.testing.assert_allclose(model.predict(test), before, rtol=1e-9)  # the same columns, in the old order


def test_gentle_blend_weights():
    """Session 25: with ten samples an anchor whose cross-validated error is no lower than the mixture's must not take
    much weight from its prior share alone (a gold_6226 leave-one-source-out task: mixture 0.105, FLOPs line 0.110, mean
    profile 0.205 in rmse of log; the session-24 setting, T = 4 and a prior of 0.5, gave the FLOPs line 0.29 of the
    weight and the ranking fell 0.983 -> 0.921), while an anchor far better than the mixture still takes about three
    times its prior share."""
    from leti.predict.transfer.ridge import BLEND_PRIOR, BLEND_TEMPER, blend_weights

    assert (BLEND_TEMPER, BLEND_PRIOR) == (8.0, 0.7)
    w = blend_weights(np.array([0.105, 0.110, 0.205]) ** 2, 10, BLEND_TEMPER)
    assert np.isclose(w.sum(), 1.0) and w[0] > 0.75 and w[1] < 0.17 and w[2] < 0.08, w
    old = blend_weights(np.array([0.105, 0.110, 0.205]) ** 2, 10, 4.0, 0.5)
    assert old[1] > 0.25  # what it replaces
    w = blend_weights(np.array([0.40, 0.12, 0.45]) ** 2, 10, BLEND_TEMPER)
    assert w[1] > 0.4 > 0.15 > w[2], w
