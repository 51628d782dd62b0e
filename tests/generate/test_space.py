import hashlib

import numpy as np
import pytest

from leti.errors import InvalidCellError
from leti.generate.cell import CONV3X3, MAXPOOL3X3
from leti.generate.space import enumerate_space


@pytest.fixture(scope="module")
def space():
    return enumerate_space()


def test_counts_per_vertex_and_edge_count(space, golden):
    enum = golden["enumeration"]
    assert len(space) == enum["total_unique"] == 423_624
    per_v = np.bincount(space.num_vertices)
    for v, n in enum["unique_per_vertex_count"].items():
        assert per_v[int(v)] == n
    per_e = np.bincount(space.num_edges)
    for e, n in enum["unique_per_edge_count"].items():
        assert per_e[int(e)] == n


@pytest.mark.slow
def test_exact_hash_set(space, golden):
    hashes = space.hashes()
    joined = "\n".join(sorted(hashes))
    assert hashlib.sha256(joined.encode()).hexdigest() == golden["enumeration"]["sha256_sorted_unique_hashes_newline_joined"]
    assert min(hashes) == golden["enumeration"]["first_hash_sorted"]
    assert max(hashes) == golden["enumeration"]["last_hash_sorted"]


def test_representatives_are_the_generators(space, golden):
    """The golden vectors' matrices are the reference generator's representatives for their hash."""
    small = space.filter(vertices=range(2, 7))
    hashes = small.hashes()
    joined = "\n".join(sorted(hashes))
    assert hashlib.sha256(joined.encode()).hexdigest() == golden["enumeration"]["sha256_sorted_unique_hashes_newline_joined_up_to_v6"]
    wanted = {v["hash"]: v for v in golden["hash_vectors"]}
    found = 0
    for i in np.flatnonzero(np.isin(hashes, list(wanted))):
        c = small.cell(int(i))
        assert c.to_spec() == (wanted[c.hash]["matrix"], wanted[c.hash]["ops"])
        found += 1
    seven = space.filter(vertices=[7])
    rest = [v for v in golden["hash_vectors"] if len(v["ops"]) == 7]
    h7 = seven.hashes(np.arange(len(seven)))
    for v in rest:
        idx = np.flatnonzero(h7 == v["hash"])
        assert idx.size == 1
        assert seven.cell(int(idx[0])).to_spec() == (v["matrix"], v["ops"])
        found += 1
    assert found == len(golden["hash_vectors"])


def test_cells_are_pruned_and_valid(space):
    for c in space.sample(200, seed=1):
        assert c.is_pruned
        assert c.num_edges <= 9


def test_sampling_is_seeded_uniform_and_distinct(space):
    a = space.sample(1000, seed=7)
    b = space.sample(1000, seed=7)
    c = space.sample(1000, seed=8)
    assert np.array_equal(a.matrix_bits, b.matrix_bits) and np.array_equal(a.labels, b.labels)
    assert not np.array_equal(a.labels, c.labels)
    assert len(set(a.hashes())) == 1000
    # uniform over unique cells: the share of 7-vertex cells is 359082/423624 = 0.848
    share = (space.sample(20_000, seed=0).num_vertices == 7).mean()
    assert abs(share - 359082 / 423624) < 0.01
    with pytest.raises(ValueError):
        space.sample(len(space) + 1)


def test_filters(space):
    f = space.filter(vertices=[5], edges=[6], require_ops=[CONV3X3], exclude_ops=[MAXPOOL3X3])
    assert len(f) > 0
    for c in f:
        assert c.num_vertices == 5 and c.num_edges == 6
        assert CONV3X3 in c.ops and MAXPOOL3X3 not in c.ops
    with pytest.raises(InvalidCellError, match="unknown op"):
        space.filter(require_ops=["conv7x7"])
