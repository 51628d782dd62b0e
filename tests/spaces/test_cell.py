import json

import numpy as np
import pytest

from leti.errors import InvalidCellError
from leti.spaces.cell import CONV1X1, CONV3X3, MAXPOOL3X3, Cell
from leti.spaces.nb101_hash import nb101_hash, nb101_hash_batch

I, O = "input", "output"


def test_golden_specs_hash(golden):
    for spec in golden["specs"] + golden["hash_vectors"]:
        assert Cell(spec["matrix"], spec["ops"]).hash == spec["hash"], spec.get("id", spec["hash"])


def test_dataset_stored_ordering_has_same_hash(golden):
    spec = next(s for s in golden["specs"] if "dataset_stored_matrix" in s)
    assert spec["dataset_stored_matrix"] != spec["matrix"]
    assert Cell(spec["dataset_stored_matrix"], spec["dataset_stored_ops"]).hash == spec["hash"]


def test_hash_needs_python_int_labels():
    # str(np.int64(-1)) differs from str(-1) on numpy 2: the hash must use python ints
    m = [[0, 1], [0, 0]]
    assert nb101_hash(m, [np.int64(-1), np.int64(-2)]) == nb101_hash(m, [-1, -2])


def test_batch_hash_matches_reference_on_random_cells(nb101_space):
    space = nb101_space
    sample = space.sample(300, seed=3)
    batch = sample.hashes()
    for i in range(len(sample)):
        assert batch[i] == sample.cell(i).hash


def test_pruning_removes_dangling_vertices():
    # vertex 2 has no outgoing edge, vertex 3 no incoming edge: both are dropped
    m = [
        [0, 1, 1, 0, 0],
        [0, 0, 0, 0, 1],
        [0, 0, 0, 0, 0],
        [0, 0, 0, 0, 1],
        [0, 0, 0, 0, 0],
    ]
    c = Cell(m, [I, CONV3X3, MAXPOOL3X3, CONV1X1, O])
    p = c.pruned()
    assert p.matrix == ((0, 1, 0), (0, 0, 1), (0, 0, 0))
    assert p.ops == (I, CONV3X3, O)
    assert not c.is_pruned and p.is_pruned
    assert c.hash == p.hash


def test_hash_distinguishes_ops_and_is_isomorphism_invariant():
    a = Cell([[0, 1, 1, 0], [0, 0, 0, 1], [0, 0, 0, 1], [0, 0, 0, 0]], [I, CONV3X3, CONV1X1, O])
    b = Cell([[0, 1, 1, 0], [0, 0, 0, 1], [0, 0, 0, 1], [0, 0, 0, 0]], [I, CONV1X1, CONV3X3, O])
    c = Cell([[0, 1, 1, 0], [0, 0, 0, 1], [0, 0, 0, 1], [0, 0, 0, 0]], [I, CONV1X1, CONV1X1, O])
    assert a.hash == b.hash  # swapping the two parallel vertices is an isomorphism
    assert a.hash != c.hash


@pytest.mark.parametrize(
    "matrix, ops, message",
    [
        ([[0, 1, 0], [0, 0, 1]], [I, CONV3X3, O], "not square"),
        ([[0, 1], [1, 0]], [I, O], "upper-triangular"),
        ([[0, 2], [0, 0]], [I, O], "0 or 1"),
        (np.eye(8, k=1, dtype=int), [I] + [CONV3X3] * 6 + [O], "8 vertices exceed"),
        ([[0, 1, 0], [0, 0, 1], [0, 0, 0]], [I, "conv5x5", O], "unknown op 'conv5x5' at vertex 1"),
        ([[0, 1, 0], [0, 0, 1], [0, 0, 0]], [CONV3X3, I, O], "first op must be"),
        ([[0, 1, 0], [0, 0, 0], [0, 0, 0]], [I, CONV3X3, O], "no path from input to output"),
        ([[0, 1, 0], [0, 0, 1], [0, 0, 0]], [I, CONV3X3], "ops has 2 entries for 3 vertices"),
        ([[0]], [I], "at least 2 vertices"),
        ([[[0]]], [I], "2-D"),
    ],
)
def test_invalid_cells_name_the_problem(matrix, ops, message):
    with pytest.raises(InvalidCellError, match=message):
        Cell(matrix, ops)


def test_too_many_edges():
    m = np.triu(np.ones((7, 7), dtype=int), k=1)  # 21 edges
    with pytest.raises(InvalidCellError, match="21 edges exceed the limit of 9"):
        Cell(m, [I] + [CONV3X3] * 5 + [O])


def test_round_trips(golden):
    spec = golden["specs"][0]
    c = Cell.from_spec(spec["matrix"], spec["ops"])
    assert Cell.from_dict(c.to_dict()) == c
    assert Cell.from_json(c.to_json()) == c
    m, o = c.to_spec()
    assert m == spec["matrix"] and o == spec["ops"]
    assert json.loads(c.to_json())["ops"][0] == "input"
    assert hash(c) == hash(Cell(np.array(spec["matrix"]), tuple(spec["ops"])))


def test_from_json_errors():
    with pytest.raises(InvalidCellError, match="malformed"):
        Cell.from_json("{nope")
    with pytest.raises(InvalidCellError, match="'matrix' and 'ops'"):
        Cell.from_json('{"matrix": [[0, 1], [0, 0]]}')


def test_cell_is_immutable():
    c = Cell([[0, 1], [0, 0]], [I, O])
    with pytest.raises(AttributeError):
        c.ops = (I, O)  # type: ignore[misc]


def test_batch_hash_handles_padding():
    cells = [Cell([[0, 1], [0, 0]], [I, O]), Cell([[0, 1, 0], [0, 0, 1], [0, 0, 0]], [I, MAXPOOL3X3, O])]
    adj = np.zeros((2, 7, 7), np.uint8)
    lab = np.full((2, 7), -3)
    for k, c in enumerate(cells):
        v = c.num_vertices
        adj[k, :v, :v] = c.adjacency
        lab[k, :v] = c.labels
    got = nb101_hash_batch(adj, lab, [2, 3])
    assert list(got) == [c.hash for c in cells]


def test_batch_hash_equals_the_reference_on_shuffled_mixed_sizes(nb101_space):
    """The compiled batch hash (digests of a round in SIMD lanes, grouped by block count) against the
    per-cell reference: cells of every vertex count shuffled together (chunks mix sizes and rounds),
    and larger DAGs whose degrees and labels take two digits (other message lengths)."""
    space = nb101_space
    rng = np.random.default_rng(3)
    idx = np.concatenate([np.flatnonzero(space.num_vertices == v)[:40] for v in range(2, 8)]
                         + [rng.choice(len(space), 400, replace=False)])
    rng.shuffle(idx)
    sub = space.take(idx)
    got = sub.hashes()
    assert list(got) == [nb101_hash(c.matrix, c.labels) for c in sub]
    n, v = 60, 13
    adj = np.triu(rng.random((n, v, v)) < 0.8, 1).astype(np.uint8)
    lab = rng.integers(-2, 12, (n, v))
    nv = rng.integers(2, v + 1, n)
    want = [nb101_hash(adj[i, :k, :k].tolist(), lab[i, :k].tolist()) for i, k in enumerate(nv)]
    assert list(nb101_hash_batch(adj, lab, nv)) == want
    assert len(set(want)) == n
