import hashlib

import numpy as np
import pytest

from leti.errors import InvalidCellError
from leti.spaces.cell import CONV3X3, MAXPOOL3X3
from leti.spaces.enumeration import enumerate_space

# one xdist worker runs the whole module (make test: --dist loadgroup): its module-scoped fixture is built
# once, not once in each worker
pytestmark = pytest.mark.xdist_group("enumeration-space")


@pytest.fixture(scope="module")
def space():
    return enumerate_space()


@pytest.fixture(scope="module")
def all_hashes(space):
    return space.hashes()


def test_counts_per_vertex_and_edge_count(space, golden):
    enum = golden["enumeration"]
    assert len(space) == enum["total_unique"] == 423_624
    per_v = np.bincount(space.num_vertices)
    for v, n in enum["unique_per_vertex_count"].items():
        assert per_v[int(v)] == n
    per_e = np.bincount(space.num_edges)
    for e, n in enum["unique_per_edge_count"].items():
        assert per_e[int(e)] == n


def test_exact_hash_set(all_hashes, golden):
    hashes = all_hashes
    joined = "\n".join(sorted(hashes))
    assert hashlib.sha256(joined.encode()).hexdigest() == golden["enumeration"]["sha256_sorted_unique_hashes_newline_joined"]
    assert min(hashes) == golden["enumeration"]["first_hash_sorted"]
    assert max(hashes) == golden["enumeration"]["last_hash_sorted"]


def test_representatives_are_the_generators(space, all_hashes, golden):
    """The golden vectors' matrices are the reference generator's representatives for their hash."""
    small = all_hashes[space.num_vertices < 7]
    joined = "\n".join(sorted(small))
    assert hashlib.sha256(joined.encode()).hexdigest() == golden["enumeration"]["sha256_sorted_unique_hashes_newline_joined_up_to_v6"]
    for v in golden["hash_vectors"]:
        idx = np.flatnonzero(all_hashes == v["hash"])
        assert idx.size == 1
        cell = space.cell(int(idx[0]))
        assert cell.to_spec() == (v["matrix"], v["ops"])
        assert cell.hash == v["hash"]


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
