"""LETI's own C kernels (leti/engine/backends/cpu/csrc/): the build (and why it is unavailable when it is),
the GEMM's packing, row/panel split over threads, k blocks and fused epilogue (bias, residual, activation)
and the 3×3 depthwise kernel, against NumPy."""

import numpy as np
import pytest

from leti.engine.backends.cpu import blas, ckernels
from leti.engine.backends.cpu import gemm as G
from tests.engine.conftest import rel_err

TOL = 1e-5
needs_leti = pytest.mark.skipif(ckernels.library() is None, reason=f"LETI's GEMM unavailable here: {ckernels.reason}")


def _ref(a, w, bias, act):
    r = a.astype(np.float64) @ w + (0 if bias is None else bias)
    return {0: r, 1: np.maximum(r, 0), 2: np.clip(r, 0, 6)}[act]


def test_pack_lays_out_zero_padded_aligned_panels(rng):
    w = rng.standard_normal((5, 37)).astype(np.float32)
    p = ckernels.pack(w)
    assert p.shape == (3, 5, 16) and p.ctypes.data % 32 == 0
    for q in range(3):
        for j in range(16):
            col = q * 16 + j
            np.testing.assert_array_equal(p[q, :, j], w[:, col] if col < 37 else 0)
    stack = ckernels.pack(rng.standard_normal((4, 3, 20)))
    assert stack.shape == (4, 2, 3, 16) and stack.ctypes.data % 32 == 0
    np.testing.assert_array_equal(ckernels.pad_bias(np.arange(20, dtype=np.float32), 20)[18:], [18, 19] + [0] * 12)


def test_large_packs_come_from_huge_page_chunks_without_overlap(rng):
    """Packs of POOL_MIN bytes and more are carved from 2 MiB-aligned chunks, 64-byte aligned, one after another;
    small ones stay on the heap; a pack larger than a chunk gets a chunk of its own."""
    pool = ckernels._HugePagePool()
    a, b = pool.take(ckernels.POOL_MIN + 4), pool.take(3 * ckernels.POOL_MIN)
    if a is None:
        pytest.skip("no madvise(MADV_HUGEPAGE) here: packs stay on the heap")
    chunk = a.base
    assert chunk.ctypes.data % pool.HUGE == 0 and b.base is chunk
    assert a.ctypes.data % 64 == 0 and b.ctypes.data % 64 == 0
    assert b.ctypes.data >= a.ctypes.data + a.size  # no overlap
    big = pool.take(pool.CHUNK + 1)
    assert big.size == pool.CHUNK + 1 and big.base is not chunk and big.base.size >= pool.CHUNK + 1
    w = rng.standard_normal((300, 400)).astype(np.float32)  # 300 x 25 panels x 16 floats: from the pool
    p = ckernels.pack(w)
    assert p.nbytes >= ckernels.POOL_MIN and p.ctypes.data % 64 == 0
    np.testing.assert_array_equal(p.transpose(1, 0, 2).reshape(300, 400), w)
    assert ckernels.pack(w[:4, :16]).nbytes < ckernels.POOL_MIN  # small: the heap


@needs_leti
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("rows, k, n", [
    (1, 3, 1),        # one row, one column: the smallest masked store
    (5, 7, 17),       # fewer rows than the micro-kernel, a column past a whole panel
    (13, 300, 33),    # two k blocks (AVX2 256 + 44): the second adds to what the first stored
    (49, 960, 160),   # a 7x7 map: few rows, split over panels; two AVX-512 k blocks (512 + 448)
    (100, 40, 300),   # more than 16 panels: two panel chunks
    (1000, 27, 32),   # many rows: split over rows in multiples of 6
    (3, 600, 1000),   # few rows, many panels, three k blocks
    (25, 300, 24),    # a half panel over tiles of 12 rows (and one left over), two k blocks
    (30, 20, 8),      # one half panel only: 12 + 12 + 6 rows
    (12, 5, 37),      # a half panel of 5 columns, masked, over exactly 12 rows
])
@pytest.mark.parametrize("act, has_bias, has_res", [(0, False, False), (1, True, False), (2, True, False),
                                                   (2, False, False), (1, True, True), (0, False, True)])
def test_leti_gemm_matches_numpy(rng, threads, rows, k, n, act, has_bias, has_res):
    a = rng.standard_normal((rows, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32) * 4
    res = rng.standard_normal((rows, n)).astype(np.float32) * 8 if has_res else np.zeros((1, 1), np.float32)
    y = np.full((rows, n), np.nan, np.float32)
    G.gemm_leti_bias_act(a, ckernels.pack(w), y, ckernels.pad_bias(bias, n) if has_bias else np.zeros(1, np.float32),
                         has_bias, act, threads, res, has_res)
    pre = _ref(a, w, bias if has_bias else None, 0) + (res if has_res else 0)
    ref = {0: pre, 1: np.maximum(pre, 0), 2: np.clip(pre, 0, 6)}[act]
    # float32 rounding is relative to the sums before the activation (a ReLU6 output's largest value is 6 whatever k)
    assert np.abs(y.astype(np.float64) - ref).max() / np.abs(pre).max() < TOL


@needs_leti
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("rows, k, n", [
    (300, 200, 40),   # two row blocks of the whole-k order (156 + 144 rows), a half panel over 12-row tiles
    (205, 1000, 24),  # blocks of 24 rows, the last few rows joined to the block before; a half panel
    (70, 2304, 17),   # the longest k the order takes, a one-column half panel past a whole one
    (1000, 27, 32),   # one block holds every row
])
def test_whole_k_row_blocks_match_the_k_blocked_order(rng, threads, rows, k, n):
    """The AVX2 products of more than 64 rows run k whole in blocks of rows (csrc/gemm.c, sgemm_full_k); turned off
    (ckernels.set_full_k) they take the k-blocked order. Both must give the product with its bias, ReLU6 and
    residual, and agree with each other to float rounding."""
    a = rng.standard_normal((rows, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    res = rng.standard_normal((rows, n)).astype(np.float32)
    ref = np.clip(_ref(a, w, bias, 0) + res, 0, 6)
    was512, was = ckernels.set_avx512(None), ckernels.set_full_k(None)
    out = {}
    try:
        ckernels.set_avx512(False)
        for on in (True, False):
            assert ckernels.set_full_k(on) == on
            y = np.full((rows, n), np.nan, np.float32)
            G.gemm_leti_bias_act(a, ckernels.pack(w), y, ckernels.pad_bias(bias, n), True, 2, threads, res, True)
            assert rel_err(y, ref) < TOL
            out[on] = y
    finally:
        ckernels.set_avx512(was512)
        ckernels.set_full_k(was)
    np.testing.assert_allclose(out[True], out[False], rtol=1e-4, atol=1e-4)


@needs_leti
def test_leti_gemm_writes_only_its_own_columns(rng):
    """The masked store of the last panel must not touch what lies past n in the output's row."""
    a = rng.standard_normal((8, 10)).astype(np.float32)
    w = rng.standard_normal((10, 20)).astype(np.float32)
    buf = np.full(8 * 20 + 16, -3.0, np.float32)
    y = buf[:160].reshape(8, 20)
    G.gemm_leti_bias_act(a, ckernels.pack(w), y, np.zeros(1, np.float32), False, 0, 2, np.zeros((1, 1), np.float32),
                         False)
    assert rel_err(y, a.astype(np.float64) @ w) < TOL
    assert (buf[160:] == -3.0).all()


@needs_leti
def test_batched_winograd_products(rng):
    v = rng.standard_normal((16, 37, 20)).astype(np.float32)
    u = rng.standard_normal((16, 20, 45)).astype(np.float32)
    m = np.full((16, 37, 45), np.nan, np.float32)
    G.batched_gemm_leti(v, ckernels.pack(u), m)
    assert rel_err(m, v.astype(np.float64) @ u) < TOL


def test_blas_override_and_a_failed_build_fall_back_with_a_reason(monkeypatch, tmp_path):
    try:
        monkeypatch.setenv("LETI_BLAS", "openblas")
        ckernels.library.cache_clear()
        assert ckernels.library() is None and ckernels.reason == "LETI_BLAS=openblas"
        if ckernels._cpu_supported():
            return  # not x86-64 with AVX2/FMA: the build is never tried
        monkeypatch.delenv("LETI_BLAS")
        monkeypatch.setenv("LETI_CACHE_DIR", str(tmp_path))
        monkeypatch.setenv("CC", "false")  # a compiler that always fails
        ckernels.library.cache_clear()
        assert ckernels.library() is None and ckernels.reason.startswith("false failed")
        assert list(tmp_path.iterdir()) == []  # no half-written library left behind
    finally:
        monkeypatch.undo()
        ckernels.library.cache_clear()
        ckernels.library()


@needs_leti
def test_leti_is_the_default_gemm_and_builds_into_the_cache(monkeypatch, tmp_path):
    ckernels.library()  # the real library first: its symbols stay the ones numba resolves in this process
    try:
        monkeypatch.delenv("LETI_BLAS", raising=False)
        monkeypatch.setenv("LETI_CACHE_DIR", str(tmp_path))
        monkeypatch.setattr(ckernels, "FLAGS", ("-O0", *ckernels.FLAGS[1:]))  # 10 s to build, not 40
        ckernels.library.cache_clear()
        path = ckernels.library()
        assert path is not None and path.parent == tmp_path and path.stat().st_size > 0
        assert blas.name() == "leti"
    finally:
        monkeypatch.undo()
        ckernels.library.cache_clear()
        ckernels.library()


def _dw_ref(x, w, b, stride, dil, pads, out_hw, act):
    (sh, sw), (dh, dw), (pt, pl), (oh, ow) = stride, dil, pads, out_hw
    nb, h, wd, c = x.shape
    xp = np.zeros((nb, h + 2 * pt + 4 * dh + 2 * sh, wd + 2 * pl + 4 * dw + 2 * sw, c))
    xp[:, pt:pt + h, pl:pl + wd] = x
    y = np.zeros((nb, oh, ow, c)) + b
    for i in range(3):
        for j in range(3):
            y += xp[:, i * dh: i * dh + sh * oh: sh, j * dw: j * dw + sw * ow: sw][:, :oh, :ow] * w[i, j]
    return {0: y, 1: np.maximum(y, 0), 2: np.clip(y, 0, 6)}[act]


@needs_leti
@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("act", [0, 2])
@pytest.mark.parametrize("nb, h, wd, c, stride, dil, pads", [
    (1, 7, 9, 8, (1, 1), (1, 1), (1, 1)),     # one whole channel block, interior and border pixels
    (2, 10, 11, 13, (2, 2), (1, 1), (1, 1)),  # two images, stride 2, a masked tail block of 5 channels
    (1, 12, 12, 32, (1, 1), (2, 2), (2, 2)),  # dilation 2
    (1, 9, 9, 3, (2, 1), (1, 1), (0, 1)),     # fewer channels than a vector, unequal strides and pads
    (1, 5, 5, 40, (1, 1), (1, 1), (0, 0)),    # valid padding: no border pixels
    (1, 2, 2, 16, (1, 1), (1, 1), (1, 1)),    # a map smaller than the window: every pixel a border pixel
    (1, 4, 3, 1036, (2, 2), (1, 1), (1, 1)),  # more channels than the border's zero vector (1024), a masked tail
    (1, 6, 23, 16, (1, 1), (1, 1), (1, 1)),   # stride 1: strips of four interior pixels and a remainder of one
    (1, 7, 20, 24, (2, 2), (1, 1), (1, 1)),   # stride 2 on an even width: no right border column
    (1, 5, 1, 8, (1, 1), (1, 1), (1, 1)),     # one column: windows clipped on both sides (the tap-by-tap path)
    (1, 4, 9, 1024, (1, 1), (1, 1), (1, 1)),  # pixels 4 KiB apart: strips over two channel blocks at a time
    (1, 3, 10, 256, (1, 1), (1, 1), (1, 1)),  # 1 KiB apart: two blocks at a time too
    # the AVX-512 pixel-at-a-time path over packed weights (whole 32-channel blocks, 256 and more at stride 1, 128 at 2):
    (1, 5, 6, 544, (1, 1), (1, 1), (1, 1)),   # two chunks of unequal size (288 + 256 channels)
    (2, 7, 8, 160, (2, 2), (1, 1), (0, 0)),   # stride 2, two images
    (1, 9, 9, 512, (1, 1), (2, 2), (2, 2)),   # dilation 2, two chunks
    (1, 6, 5, 320, (2, 1), (1, 1), (1, 0)),   # unequal strides and pads
    (1, 1, 1, 256, (1, 1), (1, 1), (1, 1)),   # a 1 x 1 map: every tap but the centre reads the zeros
    (1, 2, 3, 128, (2, 2), (1, 1), (1, 1)),   # a map smaller than the window at stride 2
])
def test_leti_depthwise3x3_matches_numpy(rng, threads, act, nb, h, wd, c, stride, dil, pads):
    from leti.engine.backends.cpu.dwconv import depthwise3x3_leti

    (sh, sw), (dh, dw), (pt, pl) = stride, dil, pads
    oh, ow = (h + 2 * pt - 2 * dh - 1) // sh + 1, (wd + 2 * pl - 2 * dw - 1) // sw + 1
    x = rng.standard_normal((nb, h, wd, c)).astype(np.float32)
    w = rng.standard_normal((3, 3, c)).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    y = np.full((nb, oh, ow, c), np.nan, np.float32)
    depthwise3x3_leti(x, ckernels.dw3x3_weights(w.reshape(9, c), b), b, True, y, sh, sw, dh, dw, pt, pl, act, threads)
    assert rel_err(y, _dw_ref(x, w, b, stride, dil, pads, (oh, ow), act)) < TOL


def dw_case(rng, c: int, stride: tuple[int, int]):
    """A 3×3 depthwise case over a 9 × 11 × c input padded by one: (stride, output size, x, w, b)."""
    (sh, sw), h, wd = stride, 9, 11
    x = rng.standard_normal((1, h, wd, c)).astype(np.float32)
    w = rng.standard_normal((3, 3, c)).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    return stride, ((h + 2 - 3) // sh + 1, (wd + 2 - 3) // sw + 1), x, w, b


@needs_leti
@pytest.mark.parametrize("c, stride", [(512, (1, 1)), (544, (1, 1)), (1024, (1, 1)), (160, (2, 2)), (128, (2, 1))])
def test_depthwise3x3_packed_path_gives_the_strips_sums(rng, c, stride):
    """The pixel-at-a-time path over packed weights (csrc/dwconv.c: dw_pixels_packed on AVX-512 hosts from 256
    channels, 128 at a stride; dw_pixels_packed8 on AVX2 hosts from 1024, 128 at a stride) against the kernel with it
    turned off, on the same weights: the same values (within rounding where the unpacked code sums its taps in another
    order), no bias (the packed zeros) and a bias alike. Where the CPU has AVX-512, the AVX2 packed path must give the
    AVX-512 one's sums bit for bit (the same order per lane); on an AVX2 host, switching it off changes bits exactly
    where it is taken (values alone would not show that the packed path ran)."""
    from leti.engine.backends.cpu.dwconv import depthwise3x3_leti

    (sh, sw), (oh, ow), x, w, b = dw_case(rng, c, stride)
    has512 = ckernels.set_avx512(None)
    avx2_takes = c % 32 == 0 and c >= (128 if stride != (1, 1) else 1024)

    def run(wts, bias, packed: bool, avx512: bool) -> np.ndarray:
        old, old512 = ckernels.set_dw_packed(packed), ckernels.set_avx512(None)
        try:
            ckernels.set_avx512(avx512)
            y = np.full((1, oh, ow, c), np.nan, np.float32)
            depthwise3x3_leti(x, wts, b, bias is not None, y, sh, sw, 1, 1, 1, 1, 2, 1)
        finally:
            ckernels.set_dw_packed(old)
            ckernels.set_avx512(old512)
        return y

    for bias in (None, b):
        wts = ckernels.dw3x3_weights(w.reshape(9, c), bias)
        ys = [run(wts, bias, packed, has512) for packed in (True, False)]
        assert not np.isnan(ys[0]).any()
        np.testing.assert_allclose(ys[0], ys[1], rtol=1e-5, atol=1e-5)
        ref = _dw_ref(x, w, b if bias is not None else np.zeros(c, np.float32), stride, (1, 1), (1, 1), (oh, ow), 2)
        assert rel_err(ys[0], ref) < TOL
        if has512 and avx2_takes:
            assert np.array_equal(run(wts, bias, True, False), ys[0])
        if not has512:  # the packed path taken exactly where it should be: it sums the taps in another order
            assert np.array_equal(ys[0], ys[1]) != avx2_takes


def _conv_ref(x, w, b, stride, pads, out_hw, act, res=None):
    (sh, sw), (pt, pl), (oh, ow) = stride, pads, out_hw
    nb, h, wd, c = x.shape
    kh, kw, _, oc = w.shape
    xp = np.zeros((nb, h + pt + kh + sh * oh, wd + pl + kw + sw * ow, c))
    xp[:, pt:pt + h, pl:pl + wd] = x
    y = np.zeros((nb, oh, ow, oc)) + (0 if b is None else b) + (0 if res is None else res)
    for i in range(kh):
        for j in range(kw):
            y += xp[:, i: i + sh * oh: sh, j: j + sw * ow: sw][:, :oh, :ow] @ w[i, j].astype(np.float64)
    return {0: y, 1: np.maximum(y, 0), 2: np.clip(y, 0, 6)}[act]


@needs_leti
@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("nb, h, wd, c, oc, k, stride, pads, out_hw, act, has_bias, has_res", [
    (1, 16, 18, 3, 32, (3, 3), (2, 2), (0, 0), (8, 9), 2, True, False),   # a stem: 'same' at stride 2 pads after
    (2, 9, 7, 3, 20, (3, 3), (1, 1), (1, 1), (9, 7), 1, True, True),      # two images, a masked panel, a residual
    (1, 11, 13, 1, 5, (5, 5), (1, 2), (2, 2), (11, 7), 0, False, False),  # one channel, unequal strides
    (1, 10, 10, 8, 16, (7, 7), (2, 2), (3, 3), (5, 5), 1, True, False),   # a ResNet-like 7x7 stem window
    (1, 9, 9, 4, 17, (3, 3), (2, 2), (0, 0), (4, 4), 0, True, False),     # valid: the last column is never read
    (1, 3, 20, 2, 40, (3, 1), (1, 1), (1, 0), (3, 20), 2, False, False),  # a 3x1 window, three panels
    (1, 9, 30, 8, 8, (3, 3), (1, 1), (1, 1), (9, 30), 1, True, True),     # 8 columns: tiles of 12 pixels (12, 12, 6)
    (2, 10, 19, 8, 5, (3, 3), (2, 2), (1, 1), (5, 10), 2, True, False),   # 5 columns masked, a 10-pixel tile
    (1, 8, 8, 6, 8, (1, 1), (2, 2), (0, 0), (4, 4), 1, True, False),      # a strided 1x1: reads x in place, no copy
    (1, 5, 50, 3, 48, (3, 3), (1, 1), (1, 1), (5, 50), 2, True, True),    # 10-pixel tiles; a pair, then one panel
    (1, 3, 23, 2, 33, (1, 3), (1, 1), (0, 1), (3, 23), 1, False, True),   # 12 + 11 pixels; one column past a pair
    (1, 4, 17, 5, 28, (3, 3), (1, 1), (1, 1), (4, 17), 2, True, True),    # a panel, then one of 12 columns (no pair)
    (1, 3, 4, 2, 16, (5, 5), (1, 1), (2, 2), (3, 4), 1, True, False),     # every row and pixel reads padding
    (1, 12, 12, 3, 24, (7, 7), (2, 2), (3, 2), (6, 6), 0, True, True),    # uneven pads: 2 border pixels left, 1 right
    (1, 6, 26, 4, 56, (1, 1), (2, 2), (0, 0), (3, 13), 1, True, True),    # RegNet's strided 1x1: a pair, a panel, and
                                                                           # a half panel over 13 pixels (7 + 6)
])
def test_leti_window_conv_matches_numpy(rng, threads, nb, h, wd, c, oc, k, stride, pads, out_hw, act, has_bias,
                                         has_res):
    (kh, kw), (sh, sw), (pt, pl), (oh, ow) = k, stride, pads, out_hw
    x = rng.standard_normal((nb, h, wd, c)).astype(np.float32)
    w = rng.standard_normal((kh, kw, c, oc)).astype(np.float32)
    b = rng.standard_normal(oc).astype(np.float32)
    res = rng.standard_normal((nb, oh, ow, oc)).astype(np.float32) if has_res else None
    out = {}
    for in_place in (False, True):  # the padded copy's rows every one written, or none: the input read in place
        xp = G.NO_PADDING if in_place else np.full(((oh - 1) * sh + kh, (ow - 1) * sw + kw, c), np.nan, np.float32)
        out[in_place] = y = np.full((nb, oh, ow, oc), np.nan, np.float32)
        G.conv_window_leti(x, xp, ckernels.pack(w.reshape(kh * kw * c, oc)), y,
                           ckernels.pad_bias(b, oc) if has_bias else np.zeros(1, np.float32), has_bias,
                           res if has_res else np.zeros((1, 1), np.float32), has_res, 1, kh, kw, sh, sw, pt, pl, act,
                           threads)
        assert rel_err(y, _conv_ref(x, w, b if has_bias else None, stride, pads, out_hw, act, res)) < TOL
    assert np.array_equal(out[False], out[True])  # leti_conv_window_inplace sums as from the padded copy


@needs_leti
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("h, wd, groups, ci, co, stride, pads, out_hw", [
    (9, 27, 3, 8, 8, (1, 1), (1, 1), (9, 27), ),   # RegNet's groups of 8: 27 pixels in balanced tiles of 9
    (6, 14, 4, 8, 8, (1, 1), (1, 1), (6, 14)),     # 14 pixels as 7 + 7
    (5, 13, 3, 8, 8, (1, 1), (1, 1), (5, 13)),     # 13 pixels: a 7-pixel tile, then 6 in the six-row tiles
    (14, 14, 5, 8, 8, (2, 2), (0, 0), (7, 7)),     # 'same' at stride 2 pads after only; 7 pixels, one tile
    (6, 16, 2, 4, 6, (1, 1), (1, 1), (6, 16)),     # 6 columns per group, masked
    (8, 8, 4, 8, 16, (2, 2), (0, 0), (3, 3)),      # valid, a full panel per group: read in place
    (5, 30, 3, 4, 24, (1, 1), (1, 1), (5, 30)),    # 24 columns per group: a panel and a masked half one together
    (7, 9, 4, 16, 8, (2, 2), (1, 1), (4, 5)),      # groups of 8 outputs over 16 inputs, an even count of groups
])
def test_leti_grouped_window_matches_per_group_convolutions(rng, threads, h, wd, groups, ci, co, stride, pads, out_hw):
    (kh, kw), (sh, sw), (pt, pl), (oh, ow) = (3, 3), stride, pads, out_hw
    x = rng.standard_normal((1, h, wd, groups * ci)).astype(np.float32)
    w = rng.standard_normal((kh, kw, ci, groups * co)).astype(np.float32)
    b = rng.standard_normal(groups * co).astype(np.float32)
    stack = w.reshape(kh * kw * ci, groups, co).transpose(1, 0, 2)
    bias = np.stack([ckernels.pad_bias(b[g * co:(g + 1) * co], co) for g in range(groups)])
    ref = np.concatenate([_conv_ref(x[..., g * ci:(g + 1) * ci], w[..., g * co:(g + 1) * co], b[g * co:(g + 1) * co],
                                    stride, pads, out_hw, 1) for g in range(groups)], axis=-1)
    out = {}
    for in_place in (False, True):
        xp = G.NO_PADDING if in_place else np.full(((oh - 1) * sh + kh, (ow - 1) * sw + kw, groups * ci), np.nan,
                                                   np.float32)
        out[in_place] = y = np.full((1, oh, ow, groups * co), np.nan, np.float32)
        G.conv_window_leti(x, xp, ckernels.pack(stack), y, bias, True, np.zeros((1, 1), np.float32), False, groups,
                           kh, kw, sh, sw, pt, pl, 1, threads)
        assert rel_err(y, ref) < TOL
    assert np.array_equal(out[False], out[True])


@needs_leti
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("h, wd, groups, ci, co, stride, pads, out_hw, act, has_res", [
    (7, 7, 6, 8, 8, (1, 1), (1, 1), (7, 7), 1, False),       # RegNet's last stage: every row and pixel at a border
    (14, 14, 5, 8, 8, (2, 2), (0, 0), (7, 7), 1, True),      # 'same' at stride 2 pads after: the last row and pixel
    (5, 28, 3, 8, 8, (1, 1), (1, 1), (5, 28), 0, True),      # 28 pixels as 10 + 9 + 9: only the end tiles skip taps
    (4, 5, 2, 8, 6, (1, 1), (1, 1), (4, 5), 2, False),       # 5 pixels, one tile skipping taps at both ends
    (3, 1, 4, 8, 8, (1, 1), (1, 1), (3, 1), 1, False),       # one pixel a row: padding left, right, above and below
    (9, 9, 3, 4, 8, (2, 2), (1, 1), (5, 5), 2, True),        # 4 inputs a group, pads before and after at stride 2
    (6, 6, 2, 8, 8, (1, 1), (2, 2), (6, 6), 1, False),       # 5x5 window, two pixels of padding: the padded copies
])
def test_grouped_windows_read_in_place_give_the_padded_copies_bit_for_bit(rng, threads, h, wd, groups, ci, co, stride,
                                                                          pads, out_hw, act, has_res):
    """The AVX2 grouped windows of at most 8 columns a group read their input in place and skip the taps that would
    read padding (csrc/window_edges.c): a product of zero changes no bit of the sum, so the outputs must be those of
    the padded copies (ckernels.set_edge_windows(False)) bit for bit, and the per-group convolutions' within TOL."""
    kh = kw = 5 if pads == (2, 2) else 3
    (sh, sw), (pt, pl), (oh, ow) = stride, pads, out_hw
    x = rng.standard_normal((1, h, wd, groups * ci)).astype(np.float32)
    w = rng.standard_normal((kh, kw, ci, groups * co)).astype(np.float32)
    b = rng.standard_normal(groups * co).astype(np.float32)
    res = rng.standard_normal((1, oh, ow, groups * co)).astype(np.float32)
    stack = w.reshape(kh * kw * ci, groups, co).transpose(1, 0, 2)
    bias = np.stack([ckernels.pad_bias(b[g * co:(g + 1) * co], co) for g in range(groups)])
    ref = np.concatenate([_conv_ref(x[..., g * ci:(g + 1) * ci], w[..., g * co:(g + 1) * co], b[g * co:(g + 1) * co],
                                    stride, pads, out_hw, act, res[..., g * co:(g + 1) * co] if has_res else None)
                          for g in range(groups)], axis=-1)
    was512, was = ckernels.set_avx512(None), ckernels.set_edge_windows(None)
    out = {}
    try:
        ckernels.set_avx512(False)
        for on in (True, False):
            assert ckernels.set_edge_windows(on) == on
            out[on] = y = np.full((1, oh, ow, groups * co), np.nan, np.float32)
            G.conv_window_leti(x, G.NO_PADDING, ckernels.pack(stack), y, bias, True,
                               res if has_res else np.zeros((1, 1), np.float32), has_res, groups, kh, kw, sh, sw, pt,
                               pl, act, threads)
    finally:
        ckernels.set_avx512(was512)
        ckernels.set_edge_windows(was)
    assert rel_err(out[True], ref) < TOL
    assert np.array_equal(out[True], out[False])


@needs_leti
@pytest.mark.parametrize("rows, k, n", [
    (300, 40, 152),   # whole-k row blocks: four pairs, then a panel and a half one in 4 x 24 tiles
    (150, 32, 24),    # RegNetX's 24 channels: 4 x 24 tiles only (37 of 4 rows and 2)
    (71, 300, 64),    # 71 rows: whole-k blocks of 6-row tiles and a 5-row one (3 + 2)
    (1000, 16, 96),   # MobileNet v2's first product: three pairs, rows in tiles of 6 split 3 + 3
    (67, 30, 48),     # 67 rows: tiles of 6 rows and a last one of 1 row
])
def test_wide_tiles_give_the_one_panel_tiles_bit_for_bit(rng, rows, k, n):
    """The AVX2 tiles of two full panels (csrc/gemm.c, micro_pair) and of a panel and a half one (micro_24) sum every
    element's products in the order of the one-panel tiles, so turning them off (ckernels.set_pair_panels,
    set_wide_tail) must change no bit, in products with a bias, an activation and a residual and in a window
    convolution."""
    a = rng.standard_normal((rows, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    res = rng.standard_normal((rows, n)).astype(np.float32)
    x = rng.standard_normal((1, 9, 31, 3)).astype(np.float32)
    wc = rng.standard_normal((3, 3, 3, n)).astype(np.float32)
    was512, was, tail = ckernels.set_avx512(None), ckernels.set_pair_panels(None), ckernels.set_wide_tail(None)
    prod, conv = {}, {}
    try:
        ckernels.set_avx512(False)
        for on in (True, False):
            assert ckernels.set_pair_panels(on) == on and ckernels.set_wide_tail(on) == on
            prod[on] = np.full((rows, n), np.nan, np.float32)
            G.gemm_leti_bias_act(a, ckernels.pack(w), prod[on], ckernels.pad_bias(bias, n), True, 1, 1, res, True)
            xp = np.full((9, 31, 3), np.nan, np.float32)
            conv[on] = np.full((1, 4, 15, n), np.nan, np.float32)
            G.conv_window_leti(x, xp, ckernels.pack(wc.reshape(27, n)), conv[on], ckernels.pad_bias(bias, n), True,
                               np.zeros((1, 1), np.float32), False, 1, 3, 3, 2, 2, 0, 0, 2, 1)
    finally:
        ckernels.set_avx512(was512)
        ckernels.set_pair_panels(was)
        ckernels.set_wide_tail(tail)
    assert rel_err(prod[True], np.maximum(_ref(a, w, bias, 0) + res, 0)) < TOL
    assert rel_err(conv[True], _conv_ref(x, wc, bias, (2, 2), (0, 0), (4, 15), 2, None)) < TOL
    assert np.array_equal(prod[True], prod[False]) and np.array_equal(conv[True], conv[False])
