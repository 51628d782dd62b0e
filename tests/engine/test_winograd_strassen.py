import numpy as np
import pytest

from leti.engine.strassen import strassen_depth, strassen_matmul, strassen_pays
from leti.engine.winograd import choose_tile, points, tile_cost, winograd_1d, winograd_matrices
from tests.engine.conftest import rel_err


def test_points_are_mnn_interpolation_points():
    assert [float(p) for p in points(7)] == [0, 0.5, -0.5, 1, -1, 1.5, -1.5]


@pytest.mark.parametrize("k", [2, 3, 4, 5, 7])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 6])
def test_generator_matches_direct_correlation_1d_and_2d(rng, n, k):
    at, bt, g = winograd_matrices(n, k)
    alpha = n + k - 1
    assert at.shape == (n, alpha) and bt.shape == (alpha, alpha) and g.shape == (alpha, k)
    d, w = rng.standard_normal(alpha), rng.standard_normal(k)
    assert np.allclose(winograd_1d(d, w, n), np.correlate(d, w, "valid"), atol=1e-9)
    X, W = rng.standard_normal((alpha, alpha)), rng.standard_normal((k, k))
    Y = at @ ((g @ W @ g.T) * (bt @ X @ bt.T)) @ at.T
    direct = np.array([[np.sum(X[i:i + k, j:j + k] * W) for j in range(n)] for i in range(n)])
    assert rel_err(Y, direct) < 1e-10


def test_known_f23_matrices():
    at, bt, g = winograd_matrices(2, 3)
    assert np.array_equal(at, [[1, 1, 1, 0], [0, 0.5, -0.5, 1]])
    assert np.array_equal(g[:, 0], [1, 1, 1, 0])


def test_tile_cost_and_choice():
    assert tile_cost(2, 3, 1, 1) == 2 * 64 + 16 + 2 * 4 * 6
    assert choose_tile(3, 128, 128, 32, 32) > 1  # many channels: big tiles pay
    assert choose_tile(3, 8, 8, 1, 1) == 1  # a 1x1 output: larger tiles only waste work (sliding window)
    assert choose_tile(3, 64, 64, 64, 64, max_n=2) == 2


def test_strassen_inequality_and_recursion(rng):
    assert strassen_pays(64, 64, 64) and not strassen_pays(2, 2, 2)
    assert strassen_depth(1024, 128, 128) == 3  # the pure inequality
    assert strassen_depth(1024, 128, 128, min_dim=64) == 1
    assert strassen_depth(1023, 128, 128) == 0  # odd: no level
    for depth in (1, 2):
        a = rng.standard_normal((64, 32)).astype(np.float32)
        b = rng.standard_normal((32, 16)).astype(np.float32)
        assert rel_err(strassen_matmul(a, b, depth), a.astype(np.float64) @ b) < 1e-5
