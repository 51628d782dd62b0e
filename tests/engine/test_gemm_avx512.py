"""The AVX-512 products' loop and blocking (leti/engine/backends/cpu/csrc/gemm.c, sessions 44-45): the lean row loop
and the 6 x 64 tiles of few inner products against the general loop, bit for bit, and every k block length against
NumPy. Skipped on hosts without avx512f,
where neither runs."""

import numpy as np
import pytest

from leti.engine.backends.cpu import ckernels
from leti.engine.backends.cpu import gemm as G
from tests.engine.conftest import rel_err
from tests.engine.test_ckernels import TOL, _ref, needs_leti


def _products_under(rng, rows, k, n, residual, switch, arms) -> dict:
    """relu6(a @ w + bias [+ res]) of random operands under each (setting, threads) arm of a ckernels ``switch``, each
    checked against NumPy; the switch's setting restored after."""
    a = rng.standard_normal((rows, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    res = rng.standard_normal((rows, n)).astype(np.float32)
    ref = np.clip(_ref(a, w, bias, 0) + (res if residual else 0), 0, 6)
    was, out = switch(None), {}
    try:
        for on, threads in arms:
            assert switch(on) == on
            y = np.full((rows, n), np.nan, np.float32)
            G.gemm_leti_bias_act(a, ckernels.pack(w), y, ckernels.pad_bias(bias, n), True, 2, threads,
                                 res if residual else np.zeros((1, 1), np.float32), residual)
            assert rel_err(y, ref) < TOL
            out[on, threads] = y
    finally:
        switch(was)
    return out


@needs_leti
@pytest.mark.parametrize("rows, k, n", [
    (100, 32, 64),     # one k block, two full pairs
    (49, 1200, 144),   # three k blocks of 512 (first, middle, last), four pairs and a single panel, 49 rows in 5 tiles
    (61, 24, 40),      # a pair and a half panel past it
    (37, 300, 600),    # two chunks of panels (16 + 22), the last pair partial
    (30, 64, 8),       # a half panel only: nothing for the lean loop
])
@pytest.mark.parametrize("residual", [False, True])
def test_lean_row_loop_is_the_general_loop_bit_for_bit(rng, rows, k, n, residual):
    """The AVX-512 products run a k block's row tiles after the first two in a lean loop (csrc/gemm.c, pair_rows512;
    not with a residual); turned off (ckernels.set_pair_rows) every tile takes the general loop. Same sums."""
    if not ckernels.set_avx512(None):
        pytest.skip("the lean loop is in the AVX-512 products; this CPU has no avx512f")
    out = _products_under(rng, rows, k, n, residual, ckernels.set_pair_rows, ((True, 1), (False, 1)))
    np.testing.assert_array_equal(out[True, 1], out[False, 1])


@needs_leti
@pytest.mark.parametrize("kc", [256, 512, 1024])
def test_avx512_k_block_choices_all_give_the_product(rng, kc):
    """The AVX-512 products' k block (ckernels.set_kc512, default 512): any block length gives the product, its bias,
    ReLU6 and residual, whether k is one block, several, or several with a short last one."""
    if not ckernels.set_avx512(None):
        pytest.skip("the k block of the AVX-512 products; this CPU has no avx512f")
    was = ckernels.set_kc512(None)
    try:
        assert ckernels.set_kc512(kc) == kc
        for rows, k, n in ((49, 1100, 96), (200, 512, 40), (7, 300, 1024)):
            a = rng.standard_normal((rows, k)).astype(np.float32)
            w = rng.standard_normal((k, n)).astype(np.float32)
            bias = rng.standard_normal(n).astype(np.float32)
            res = rng.standard_normal((rows, n)).astype(np.float32)
            pre = _ref(a, w, bias, 0) + res
            y = np.full((rows, n), np.nan, np.float32)
            G.gemm_leti_bias_act(a, ckernels.pack(w), y, ckernels.pad_bias(bias, n), True, 2, 1, res, True)
            assert np.abs(y.astype(np.float64) - np.clip(pre, 0, 6)).max() / np.abs(pre).max() < TOL
    finally:
        ckernels.set_kc512(was)
    assert ckernels.set_kc512(None) == was


@needs_leti
@pytest.mark.parametrize("rows, k, n", [
    (100, 32, 64),    # one group of four panels
    (37, 16, 80),     # a group, then one panel through the 12 x 32 tiles
    (50, 96, 200),    # three groups and a partial panel past them; k at the limit
    (7, 64, 384),     # one row tile of 6 and one of 1
    (13, 97, 64),     # k past the limit: the 12 x 32 tiles alone
])
@pytest.mark.parametrize("residual", [False, True])
def test_quad_tiles_of_few_inner_products_are_the_pair_tiles_bit_for_bit(rng, rows, k, n, residual):
    """Products of at most 96 inner products run whole 64s of columns in 6 x 64 tiles (csrc/gemm.c, quads512); turned
    off (ckernels.set_quad512) they take the 12 x 32 tiles. Same sums with the bias, ReLU6 and residual, columns past
    the last 64 included; a product split by columns over threads gives them too."""
    if not ckernels.set_avx512(None):
        pytest.skip("the 6 x 64 tiles are AVX-512 products; this CPU has no avx512f")
    out = _products_under(rng, rows, k, n, residual, ckernels.set_quad512, ((True, 1), (False, 1), (True, 2)))
    np.testing.assert_array_equal(out[True, 1], out[False, 1])
    np.testing.assert_array_equal(out[True, 2], out[False, 1])
