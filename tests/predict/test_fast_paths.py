"""The compiled prediction paths equal the slow references they replace."""

import numpy as np
import pytest

from leti.errors import DatasetError
from leti.spaces import nb101_costs as nb101
from leti.predict.base import make_predictor
from leti.predict.features import rich_features, rich_features_reference
from leti.spaces.search_space import NB101Space, as_table
from leti.predict.trees import _float32_above


@pytest.fixture(scope="module")
def data(raspi4):
    t = as_table(raspi4)
    return t, raspi4.latency_ms.to_numpy()


@pytest.fixture(scope="module")
def space_sample(nb101_space):
    return nb101_space.sample(3000, seed=7)


@pytest.mark.parametrize("name", ["xgboost", "lightgbm", "catboost"])
@pytest.mark.parametrize("feats, depth", [("paper", 3), ("rich", 6)])
def test_compiled_trees_equal_the_library(name, feats, depth, data):
    t, y = data
    m = make_predictor(name, features=feats, max_depth=depth, n_estimators=80).fit(t.take(np.arange(400)), y[:400])
    np.testing.assert_allclose(m.predict(t), m.library_predict(t), rtol=2e-5)  # XGBoost sums in float32
    one = t.take([450])
    np.testing.assert_allclose(m.predict(one), m.library_predict(one), rtol=2e-5)


def test_compiled_trees_in_parallel_equal_one_thread(data):
    t, y = data
    m = make_predictor("lightgbm", n_estimators=50).fit(t.take(np.arange(300)), y[:300])
    a = m.predict(t)
    m.set_params(n_jobs=2)
    np.testing.assert_array_equal(m.predict(t), a)


def test_float32_threshold_rule():
    # x <= t (float64) on float32 x is the same as not (x >= _float32_above(t))
    rng = np.random.default_rng(0)
    for t in [0.1, 1.0, -2.5, 1e-30, float(np.float32(0.3)), 3.0000001]:
        v = np.float32(_float32_above(t))
        assert float(v) > t and float(np.nextafter(v, np.float32(-np.inf))) <= t
        xs = (t + rng.normal(0, abs(t) * 1e-6 + 1e-38, 2000)).astype(np.float32)
        np.testing.assert_array_equal(xs.astype(np.float64) > t, xs >= v)


def test_compiled_trees_reject_bad_features(data):
    t, y = data
    m = make_predictor("xgboost", n_estimators=5).fit(t.take(np.arange(100)), y[:100])
    ens = m.compiled_[0]
    x = np.zeros((3, ens.num_features), np.float32)
    x[1, 2] = np.nan
    with pytest.raises(DatasetError, match="finite"):
        ens.predict(x)
    with pytest.raises(DatasetError, match="features"):
        ens.predict(np.zeros((3, ens.num_features + 1)))


def test_rich_features_equal_the_numpy_reference(data, space_sample):
    t, _ = data
    np.testing.assert_allclose(rich_features(t), rich_features_reference(t), rtol=1e-12)
    t101 = NB101Space().table(space_sample)
    np.testing.assert_allclose(rich_features(t101), rich_features_reference(t101), rtol=1e-12)


def test_nb101_cost_kernel_equals_the_numpy_reference(space_sample):
    adj, lab = space_sample.adjacency(), space_sample.full_labels()
    nv = space_sample.num_vertices.astype(np.int64)
    for dims in [(32, 32, 128, 128), (16, 16, 128, 256), (8, 8, 3, 5)]:
        for got, ref in zip(nb101.batch_module_costs(adj, lab, nv, *dims), nb101.batch_module_costs_reference(adj, lab, nv, *dims)):
            np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("params", [{}, {"node_flops": True, "global_node": True}])
def test_fast_gcn_equals_the_torch_geometric_module(params, data):
    t, y = data
    m = make_predictor("gcn", hidden=48, epochs=3, **params).fit(t.take(np.arange(200)), y[:200])
    for idx in ([5], list(range(12)), list(range(600))):  # the direct path and the shared-state path
        sub = t.take(idx)
        np.testing.assert_allclose(m.predict(sub), m.torch_predict(sub), rtol=1e-5)


def test_fast_gcn_on_nb101_cells_with_padding(naslib):
    t = as_table(naslib)
    y = 1.0 + t.flops / 1e8
    m = make_predictor("gcn", hidden=32, epochs=2).fit(t.take(np.arange(300)), y[:300])
    assert (t.ops < 0).any()  # some cells have fewer than 7 vertices
    np.testing.assert_allclose(m.predict(t), m.torch_predict(t), rtol=1e-5)
    padded = np.flatnonzero((t.ops < 0).any(axis=1))[:10]  # the few-cell path, padding included
    np.testing.assert_allclose(m.predict(t.take(padded)), m.torch_predict(t.take(padded)), rtol=1e-5)
    g = make_predictor("gcn", hidden=32, epochs=2, global_node=True, node_flops=True).fit(t.take(np.arange(300)), y[:300])
    np.testing.assert_allclose(g.predict(t.take(padded)), g.torch_predict(t.take(padded)), rtol=1e-5)


def test_bfloat16_gcn_is_close_to_float32(data):
    t, y = data
    m = make_predictor("gcn", hidden=96, epochs=3).fit(t.take(np.arange(200)), y[:200])
    a = m.predict(t)
    m.set_params(precision="bfloat16")
    b = m.predict(t)
    assert not np.array_equal(a, b) and np.abs(b / a - 1).max() < 0.02


def test_sortable_int_keeps_the_float_order():
    from leti.predict.trees import _sortable

    rng = np.random.default_rng(1)
    a = np.concatenate([rng.normal(0, 1e3, 3000), [0.0, -0.0, np.inf, -np.inf, 1e-45, -1e-45, 3e38, -3e38]])
    a = a.astype(np.float32)
    b = rng.permutation(a)[:500]
    np.testing.assert_array_equal(a[:, None] >= b[None, :], _sortable(a)[:, None] >= _sortable(b)[None, :])


def test_unique_rows_numbers_distinct_rows_in_order_of_first_appearance():
    from leti.predict.gcn_kernels import unique_rows as _unique_rows

    keys = np.array([[5, 1], [2, 2], [5, 1], [9, 0], [2, 2], [0, 0]], np.int64)
    first, ids = _unique_rows(keys)
    np.testing.assert_array_equal(first, [0, 1, 3, 5])
    np.testing.assert_array_equal(ids, [0, 1, 0, 2, 1, 3])
    rng = np.random.default_rng(3)
    big = rng.integers(0, 4, (2000, 5))
    first, ids = _unique_rows(big)
    np.testing.assert_array_equal(big[first][ids], big)  # every row is its representative
    assert (np.diff(first) > 0).all() and len(first) == len(np.unique(big, axis=0))


def test_compiled_feature_transform_equals_check_then_sortable():
    from leti.predict.trees import _check_features, _sortable, _sortable_features

    rng = np.random.default_rng(2)
    x = np.concatenate([rng.normal(0, 1e3, (50, 7)), [[0.0, -0.0, 1e-45, -1e-45, 3e38, -3e38, 1.0]]])
    for dtype in (np.float64, np.float32):
        np.testing.assert_array_equal(_sortable_features(x.astype(dtype), 7), _sortable(_check_features(x, 7)))
    bad = x.copy()
    bad[3, 2] = np.nan
    with pytest.raises(DatasetError, match="finite"):
        _sortable_features(bad, 7)


def test_fast_gcn_on_two_threads_equals_one(data, monkeypatch):
    import leti.predict.gcn_infer as gi

    t, y = data
    m = make_predictor("gcn", hidden=40, epochs=2).fit(t.take(np.arange(200)), y[:200])
    monkeypatch.setattr(gi, "_ROWS", 64)  # several blocks per layer at this size
    a = m.predict(t)
    m.set_params(threads=2)
    np.testing.assert_allclose(m.predict(t), a, rtol=1e-5)
    np.testing.assert_allclose(a, m.torch_predict(t), rtol=1e-5)


def test_fast_gcn_leaves_dead_units_out_of_the_products_exactly(data, monkeypatch):
    """Units that are zero for every state of a block (dead ReLUs) are left out of the next product;
    the result still equals the torch-geometric module, and the BLAS thread count is restored."""
    import torch
    from threadpoolctl import threadpool_info

    import leti.predict.gcn_infer as gi

    t, y = data
    m = make_predictor("gcn", hidden=48, epochs=2).fit(t.take(np.arange(200)), y[:200])
    with torch.no_grad():  # units 0..19 of the second layer: weight 0, bias -1 -> always 0 after the ReLU
        m.net_.convs[1].lin.weight[:20] = 0.0
        m.net_.convs[1].bias[:20] = -1.0
    m.fast_ = None
    packed = []
    take = gi.take_columns
    monkeypatch.setattr(gi, "take_columns", lambda buf, keep, out: (packed.append(len(keep)), take(buf, keep, out)))
    monkeypatch.setattr(gi, "_ROWS", 64)  # several blocks per layer
    blas = [(i["filepath"], i["num_threads"]) for i in threadpool_info()]
    np.testing.assert_allclose(m.predict(t), m.torch_predict(t), rtol=1e-5)
    assert packed and min(packed) <= 28  # the 20 dead units were left out (of the products they feed)
    assert [(i["filepath"], i["num_threads"]) for i in threadpool_info()] == blas


def _gcn_with_provably_dead_units(t, y):
    """A small GCN whose third layer's units 0..11 have weights 1e-7 (> 0) under a bias of -0.5: zero for every
    state, and provably so once the inputs' caps are known."""
    import torch

    m = make_predictor("gcn", hidden=48, epochs=2).fit(t.take(np.arange(200)), y[:200])
    with torch.no_grad():
        m.net_.convs[2].lin.weight[:12] = 1e-7
        m.net_.convs[2].bias[:12] = -0.5
    m.fast_ = None
    return m


def _record_submatrix_widths(monkeypatch) -> list:
    """(layer, units kept) of every weight submatrix the fast path takes, from now on."""
    import leti.predict.gcn_infer as gi

    widths = []
    sub = gi.DenseGCN._submatrix

    def recorded(self, layer, rows, cols):
        widths.append((layer, len(cols)))
        return sub(self, layer, rows, cols)

    monkeypatch.setattr(gi.DenseGCN, "_submatrix", recorded)
    return widths


def test_fast_gcn_leaves_proved_dead_units_out_and_redoes_a_chunk_that_outgrows_the_proof(data, monkeypatch):
    """Units whose incoming weights are tiny and positive under a negative bias are proved zero and
    left out of the product that feeds them; a chunk whose states outgrow the norm the proof assumed
    is redone without it. Both still equal the torch-geometric module."""
    import leti.predict.gcn_infer as gi

    t, y = data
    m = _gcn_with_provably_dead_units(t, y)
    monkeypatch.setattr(gi, "_ROWS", 64)
    reference = m.torch_predict(t)
    np.testing.assert_allclose(m.predict(t), reference, rtol=1e-5)  # the first call learns the norms
    widths = _record_submatrix_widths(monkeypatch)
    np.testing.assert_allclose(m.predict(t), reference, rtol=1e-5)
    assert any(layer == 2 and w <= 36 for layer, w in widths)  # the 12 units were proved dead
    m.fast_._cap = [np.full_like(c, 1e-3) for c in m.fast_._cap]  # a proof assuming far too small states: redone
    widths.clear()
    np.testing.assert_allclose(m.predict(t), reference, rtol=1e-5)
    assert any(w == 48 for layer, w in widths if layer == 2)  # the redo left nothing out


def test_one_cell_calls_leave_proved_dead_units_out_and_widen_the_cap_when_outgrown(data, monkeypatch):
    """The few-cell path (the NAS loop's one-cell calls) proves the same dead units against caps it learns
    call by call: its inputs are checked before each product, an input over the cap takes every unit and
    widens the cap. Every prediction equals the torch-geometric module's."""
    t, y = data
    m = _gcn_with_provably_dead_units(t, y)
    widths = _record_submatrix_widths(monkeypatch)
    cells = t.take(np.arange(40))
    one_by_one = np.array([m.predict(cells.take([i]))[0] for i in range(len(cells))])
    np.testing.assert_allclose(one_by_one, m.torch_predict(cells), rtol=1e-5)
    assert any(layer == 2 and w <= 36 for layer, w in widths)  # the 12 units were proved dead
    assert any(layer == 2 and w == 48 for layer, w in widths)  # before a cap was learnt: every unit
    assert m.fast_._cap_version > 1  # the caps were widened as inputs outgrew them
