"""``space_table`` (the batch path ``leti generate`` writes) against the per-cell ``cell_table``:
the same Parquet columns, types and values, costs equal to ``ModelSpec.costs`` cell by cell."""

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from leti.spaces.nb101_network import NetworkConfig
from leti.spaces.spec import ModelSpec
from leti.spaces.table_file import cell_table, read_cell_table, space_table, write_table

SPECS = [ModelSpec("cell", (16, 16, 8), 8), ModelSpec("cell", (8, 8, 3), 5),
         ModelSpec("network", config=NetworkConfig(stem_channels=16, num_stacks=2, modules_per_stack=2))]


@pytest.fixture(scope="module")
def space(nb101_space):
    full = nb101_space
    few = np.flatnonzero(full.num_vertices <= 4)[:20]  # the smallest cells (2 vertices: input → output)
    rest = np.random.default_rng(7).choice(len(full), 180, replace=False)
    return full.take(np.concatenate([few, rest]))


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.kind + str(s.input_shape))
def test_space_table_writes_what_cell_table_writes(tmp_path, space, spec):
    fast = write_table(space_table(space, spec), tmp_path / "fast.parquet", spec)
    slow = write_table(cell_table(list(space), spec, hashes=space.hashes()), tmp_path / "slow.parquet", spec)
    a, spec_a = read_cell_table(fast)
    b, spec_b = read_cell_table(slow)
    assert spec_a == spec_b == spec
    assert pq.read_schema(fast).remove_metadata() == pq.read_schema(slow).remove_metadata()
    assert list(a.columns) == list(b.columns) and (a.dtypes == b.dtypes).all()
    assert 2 in set(a.num_vertices)
    for col in ("hash", "num_vertices", "num_edges", "flops", "params", "peak_memory_bytes"):
        pd.testing.assert_series_equal(a[col], b[col])
    for col in ("matrix", "ops"):
        assert [np.asarray(list(map(list, v)) if col == "matrix" else list(v)).tolist() for v in a[col]] == \
               [np.asarray(list(map(list, v)) if col == "matrix" else list(v)).tolist() for v in b[col]]


def test_space_table_costs_equal_the_layer_graph_costs(space):
    spec = ModelSpec("cell", (32, 32, 64), 64)
    t = space_table(space, spec)
    cells = list(space)
    for i in range(0, len(cells), 23):
        k = spec.costs(cells[i])
        assert (t["flops"][i].as_py(), t["params"][i].as_py(), t["peak_memory_bytes"][i].as_py()) == \
               (k.flops, k.params, k.peak_memory_bytes)
