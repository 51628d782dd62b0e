"""The choices of a core that runs 512-bit FMAs as two 256-bit halves (csrc/gemm.c ``product512``,
``leti_window512``; csrc/dwconv.c ``dw_packed16``; session 50, a Zen 4): with ``ckernels.set_narrow512(True)`` the
products with a half-full last panel (from 128 rows) or fewer than 128 inner products (from 256 rows, at most 192
columns), the groups of at most 8 outputs and the stride-1 depthwise convolutions take the AVX2 code — bit for bit what
the AVX2 engine computes — and everything else stays on the AVX-512 code, bit for bit what it computed before (where
the two ISAs' products give the same bits, the path taken is read from ``ckernels.takes_avx512``). Skipped
on hosts without avx512f, where both settings run the AVX2 code."""

import numpy as np
import pytest

from leti.engine.backends.cpu import ckernels
from leti.engine.backends.cpu import gemm as G
from tests.engine.conftest import rel_err
from tests.engine.test_ckernels import TOL, _conv_ref, _dw_ref, _ref, dw_case, needs_leti


@pytest.fixture
def avx512_host():
    if not ckernels.set_avx512(None):
        pytest.skip("the narrow-core choices pick between AVX-512 and AVX2 code; this CPU has no avx512f")
    was512, was = ckernels.set_avx512(None), ckernels.set_narrow512(None)
    yield
    ckernels.set_avx512(was512)
    ckernels.set_narrow512(was)


def _under(arms, compute) -> list:
    """``compute()`` under each (avx512, narrow) arm."""
    out = []
    for avx512, narrow in arms:
        assert ckernels.set_avx512(avx512) == avx512
        assert ckernels.set_narrow512(narrow) == narrow
        out.append(compute())
    return out


ARMS = ((True, True), (True, False), (False, False))  # narrow, AVX-512 everywhere, AVX2 everywhere


@needs_leti
@pytest.mark.parametrize("rows, k, n, avx2", [
    (3136, 96, 24, True),     # MobileNet v2's projection to 24: a pair with 8 columns masked off
    (200, 152, 152, True),    # 152 = 9 panels and a half one, from 128 rows
    (100, 152, 152, False),   # the same under 128 rows: AVX-512
    (300, 32, 64, True),      # few inner products from 256 rows
    (300, 64, 256, False),    # few inner products, but more than 192 columns: AVX-512
    (200, 32, 64, False),     # few inner products under 256 rows: AVX-512
    (300, 256, 128, False),   # whole panels, k of 128 and more: AVX-512
    (1, 1024, 1000, False),   # a classifier's single row: AVX-512
])
@pytest.mark.parametrize("threads", [1, 2])
def test_narrow_products_take_the_avx2_or_the_avx512_tiles_bit_for_bit(avx512_host, rng, rows, k, n, avx2, threads):
    a = rng.standard_normal((rows, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    res = rng.standard_normal((rows, n)).astype(np.float32)
    bp, pb = ckernels.pack(w), ckernels.pad_bias(bias, n)
    ref = np.clip(_ref(a, w, bias, 0) + res, 0, 6)

    def product():
        y = np.full((rows, n), np.nan, np.float32)
        G.gemm_leti_bias_act(a, bp, y, pb, True, 2, threads, res, True)
        assert rel_err(y, ref) < TOL
        return ckernels.takes_avx512(rows, n, k), y

    (narrow512, narrow), (wide512, wide), (plain512, plain) = _under(ARMS, product)
    assert (narrow512, wide512, plain512) == (not avx2, True, False)
    np.testing.assert_array_equal(narrow, plain if avx2 else wide)


@needs_leti
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("h, wd, groups, ci, co, stride, pads, out_hw", [
    (14, 14, 6, 8, 8, (1, 1), (1, 1), (14, 14)),   # RegNet's groups of 8
    (15, 15, 4, 8, 8, (2, 2), (1, 1), (8, 8)),     # at stride 2
])
def test_narrow_groups_of_8_take_the_avx2_windows(avx512_host, rng, threads, h, wd, groups, ci, co, stride, pads,
                                                   out_hw):
    (kh, kw), (sh, sw), (pt, pl), (oh, ow) = (3, 3), stride, pads, out_hw
    x = rng.standard_normal((1, h, wd, groups * ci)).astype(np.float32)
    w = rng.standard_normal((kh, kw, ci, groups * co)).astype(np.float32)
    b = rng.standard_normal(groups * co).astype(np.float32)
    stack = ckernels.pack(w.reshape(kh * kw * ci, groups, co).transpose(1, 0, 2))
    bias = np.stack([ckernels.pad_bias(b[g * co:(g + 1) * co], co) for g in range(groups)])
    ref = np.concatenate([_conv_ref(x[..., g * ci:(g + 1) * ci], w[..., g * co:(g + 1) * co], b[g * co:(g + 1) * co],
                                    stride, pads, out_hw, 1) for g in range(groups)], axis=-1)

    def window():
        y = np.full((1, oh, ow, groups * co), np.nan, np.float32)
        G.conv_window_leti(x, G.NO_PADDING, stack, y, bias, True, np.zeros((1, 1), np.float32), False, groups,
                           kh, kw, sh, sw, pt, pl, 1, threads)
        assert rel_err(y, ref) < TOL
        return ckernels.window_takes_avx512(co), ckernels.window_takes_avx512(16), y

    (n8, n16, narrow), (w8, w16, wide), (p8, p16, plain) = _under(ARMS, window)
    assert (n8, n16, w8, w16, p8, p16) == (False, True, True, True, False, False)
    np.testing.assert_array_equal(narrow, plain)


@needs_leti
@pytest.mark.parametrize("c, stride, avx2", [
    (512, (1, 1), True),    # the 16-lane strips sum in another order than the 8-lane code: the bits tell which ran
    (256, (2, 2), False),   # strided: the 16-lane strips still
])
def test_narrow_depthwise_takes_the_8_lane_code_at_stride_1(avx512_host, rng, c, stride, avx2):
    from leti.engine.backends.cpu.dwconv import depthwise3x3_leti

    (sh, sw), (oh, ow), x, w, b = dw_case(rng, c, stride)
    wts = ckernels.dw3x3_weights(w.reshape(9, c), b)
    ref = _dw_ref(x, w, b, stride, (1, 1), (1, 1), (oh, ow), 2)

    def depthwise():
        y = np.full((1, oh, ow, c), np.nan, np.float32)
        depthwise3x3_leti(x, wts, b, True, y, sh, sw, 1, 1, 1, 1, 2, 1)
        assert rel_err(y, ref) < TOL
        return y

    narrow, wide, plain = _under(ARMS, depthwise)
    np.testing.assert_array_equal(narrow, plain if avx2 else wide)


@needs_leti
def test_narrow_setting_round_trips():
    was = ckernels.set_narrow512(None)
    try:
        assert ckernels.set_narrow512(True) is True
        assert ckernels.set_narrow512(None) is True
        assert ckernels.set_narrow512(False) is False
        assert ckernels.set_narrow512(None) is False
    finally:
        ckernels.set_narrow512(was)
