"""The CPU backend's fast kernels against NumPy / the reference, and the scheme and thread choices
they rely on (row-block GEMMs in numba's pool, BLAS held to one thread, Winograd's minimum tiles)."""

import numba
import numpy as np
import pytest
from threadpoolctl import threadpool_info

from leti.engine.backends.cpu import CPUBackend, blas, ckernels
from leti.engine.backends.cpu import kernels as K
from leti.engine.backends.cpu import winograd_transforms as WT
from leti.engine.graph import Graph
from leti.engine.reference import run_reference
from leti.engine.session import Session
from leti.engine.winograd import choose_tile, winograd_matrices
from tests.engine.conftest import rel_err

TOL = 1e-4


def _relu6(v):
    return np.clip(v, 0, 6)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("rows, order", [(1, "C"), (15, "F"), (100, "F"), (257, "C")])
@pytest.mark.parametrize("act", [0, 1, 2])
def test_gemm_bias_act_matches_numpy(rng, threads, rows, order, act):
    a = rng.standard_normal((rows, 40)).astype(np.float32)
    b = np.asarray(rng.standard_normal((40, 24)), dtype=np.float32, order=order)
    bias = rng.standard_normal(24).astype(np.float32)
    y = np.full((rows, 24), np.nan, np.float32)
    K.gemm_bias_act(a, b, y, bias, True, act, threads)
    ref = a.astype(np.float64) @ b + bias
    ref = {0: ref, 1: np.maximum(ref, 0), 2: _relu6(ref)}[act]
    assert rel_err(y, ref) < TOL


def test_gemm_without_bias_leaves_the_product(rng):
    a = rng.standard_normal((64, 8)).astype(np.float32)
    b = np.asfortranarray(rng.standard_normal((8, 5)).astype(np.float32))
    y = np.empty((64, 5), np.float32)
    K.gemm_bias_act(a, b, y, np.zeros(1, np.float32), False, 0, 2)
    assert rel_err(y, a @ b) < TOL
    assert (y < 0).any()  # no activation applied


needs_mkl = pytest.mark.skipif(blas.mkl() is None, reason="no MKL in this environment (torch without MKL)")


@needs_mkl
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("rows, k, n", [(1, 40, 24), (15, 3, 16), (100, 40, 24), (257, 96, 144), (49, 960, 320)])
@pytest.mark.parametrize("act", [0, 2])
def test_mkl_gemm_matches_numpy(rng, threads, rows, k, n, act):
    """MKL's SGEMM in numba's row blocks (row-major arrays through the column-major interface)."""
    a = rng.standard_normal((rows, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    y = np.full((rows, n), np.nan, np.float32)
    K.gemm_mkl_bias_act(a, b, y, bias, True, act, threads, blas.ONE_THREAD)
    ref = a.astype(np.float64) @ b + bias
    assert rel_err(y, ref if act == 0 else _relu6(ref)) < TOL


@pytest.mark.parametrize("act", [0, 1, 2])
@pytest.mark.parametrize("k", [300, 7])
def test_gemv_splits_the_outputs(rng, act, k):
    """The batch-1 product over weights packed in panels of 16 outputs (130 = 8 panels + 2 outputs of a padded
    ninth; an odd k leaves one input element after the kernel's pairs)."""
    x = rng.standard_normal(k).astype(np.float32)
    w = rng.standard_normal((k, 130)).astype(np.float32)
    bias = rng.standard_normal(130).astype(np.float32)
    y = np.full(130, np.nan, np.float32)
    K.gemv_bias_act(x, ckernels.pack(w), y, bias, True, act)
    ref = x.astype(np.float64) @ w + bias
    ref = {0: ref, 1: np.maximum(ref, 0), 2: _relu6(ref)}[act]
    assert rel_err(y, ref) < TOL


needs_leti = pytest.mark.skipif(ckernels.library() is None, reason="LETI's GEMM unavailable here")


@pytest.mark.parametrize("path", [pytest.param("leti", marks=needs_leti), pytest.param("mkl", marks=needs_mkl),
                                  "openblas"])
def test_sessions_agree_with_the_reference_on_every_gemm(rng, monkeypatch, path):
    """A 1×1 conv (gemm), a 3×3/s2 conv (im2col) and a dense head at batch 1 (gemv) and 3 (gemm)
    through the GEMM chosen at resize: LETI's own, else MKL, else OpenBLAS."""
    if path != "leti":
        monkeypatch.setattr(ckernels, "library", lambda: None)
    if path == "openblas":
        monkeypatch.setattr(blas, "mkl", lambda: None)
    assert blas.name() == path
    for batch in (1, 3):
        g = Graph()
        for name, shape in (("x", (batch, 9, 9, 5)), ("y1", (batch, 9, 9, 12)), ("y2", (batch, 5, 5, 7)),
                            ("y3", (batch, 7)), ("y", (batch, 4))):
            g.add_tensor(name, shape)
        g.inputs = ["x"]
        g.add_constant("w1", rng.standard_normal((1, 1, 5, 12)).astype(np.float32))
        g.add_constant("b1", rng.standard_normal(12).astype(np.float32))
        g.add_constant("w2", rng.standard_normal((3, 3, 12, 7)).astype(np.float32))
        g.add_constant("wf", rng.standard_normal((7, 4)).astype(np.float32))
        g.add_node("conv2d", ["x", "w1", "b1"], ["y1"], padding="same", activation="relu6")
        g.add_node("conv2d", ["y1", "w2"], ["y2"], strides=[2, 2], padding="same")
        g.add_node("mean", ["y2"], ["y3"], axes=[1, 2], keepdims=False)
        g.add_node("fully_connected", ["y3", "wf"], ["y"], activation="relu")
        g.outputs = ["y"]
        x = rng.standard_normal((batch, 9, 9, 5)).astype(np.float32)
        got = Session(g, backends=("cpu",), threads=2).resize().run({"x": x})["y"]
        assert rel_err(got, run_reference(g, {"x": x})["y"]) < TOL


def test_batched_gemm_multiplies_by_the_transposed_store(rng):
    v = rng.standard_normal((9, 20, 6)).astype(np.float32)
    ut = rng.standard_normal((9, 7, 6)).astype(np.float32)  # per position (oc, ic)
    m = np.empty((9, 20, 7), np.float32)
    K.batched_gemm(v, ut, m)
    assert rel_err(m, v @ ut.transpose(0, 2, 1)) < TOL


# one xdist worker runs every parameter (make test: --dist loadgroup): numba compiles the kernels once, not once per
# worker at the same moment (the disk cache is only written when a compile ends)
@pytest.mark.xdist_group("numba-jit")
@pytest.mark.parametrize("n, hw, pads", [(2, (7, 9), (1, 1)), (4, (10, 10), (1, 1)), (3, (6, 5), (0, 2)),
                                         (6, (13, 11), (1, 1))])  # α = 4, 6, 5 (padded sums), 8 (generic loops)
@pytest.mark.parametrize("threads", [1, 3])
def test_winograd_kernels_give_the_convolution(rng, n, hw, pads, threads):
    """Input transform, α² products and output transform together equal a 3×3 convolution with
    bias and ReLU, for tile counts that do not divide the chunking evenly."""
    h, w = hw
    ic, oc = 5, 6
    pt, pl = pads
    x = rng.standard_normal((2, h, w, ic)).astype(np.float32)
    wt = rng.standard_normal((3, 3, ic, oc))
    bias = rng.standard_normal(oc).astype(np.float32)
    oh, ow = h + 2 * pt - 2, w + 2 * pl - 2
    at, bt, g = winograd_matrices(n, 3)
    alpha = n + 2
    th, tw = -(-oh // n), -(-ow // n)
    tiles = 2 * th * tw
    v = np.empty((alpha * alpha, tiles, ic), np.float32)
    m = np.empty((alpha * alpha, tiles, oc), np.float32)
    u = np.einsum("ai,bj,ijco->abco", g, g, wt).reshape(alpha * alpha, ic, oc)
    ut = np.ascontiguousarray(u.transpose(0, 2, 1), dtype=np.float32)
    y = np.empty((2, oh, ow, oc), np.float32)
    at32, bt32 = WT.winograd_transforms(at, bt)
    # r0 (the first tile row) passed as the sessions pass it: an omitted argument would make numba compile a second
    # specialisation of each transform (about 20 s in a fresh clone) for the same code
    WT.winograd_input(x, bt32, v, n, pt, pl, th, tw, threads, 0)
    K.batched_gemm(v, ut, m)
    WT.winograd_output(m, at32, y, bias, True, 1, th, tw, threads, 0)
    xp = np.pad(x.astype(np.float64), ((0, 0), (pt, pt), (pl, pl), (0, 0)))
    ref = sum(xp[:, i:i + oh, j:j + ow] @ wt[i, j] for i in range(3) for j in range(3)) + bias
    assert rel_err(y, np.maximum(ref, 0)) < TOL


def _dw_graph(x_shape, w, stride, mult, act, padding="same", dilation=1):
    g = Graph()
    g.add_tensor("x", x_shape)
    g.inputs = ["x"]
    wn = g.add_constant("w", w)
    bn = g.add_constant("b", np.linspace(-1, 1, w.shape[2]).astype(np.float32))
    from leti.engine import ops

    attrs = {"strides": [stride] * 2, "padding": padding, "multiplier": mult, "activation": act,
             "dilations": [dilation] * 2}
    g.add_tensor("y", ops.get("depthwise_conv2d").infer([x_shape, w.shape, (w.shape[2],)], attrs)[0])
    g.add_node("depthwise_conv2d", ["x", wn, bn], ["y"], **attrs)
    g.outputs = ["y"]
    return g


@pytest.mark.parametrize("stride, mult, act", [(1, 1, "relu6"), (2, 1, "none"), (1, 2, "relu"), (2, 3, "relu6")])
def test_depthwise_matches_reference(rng, stride, mult, act):
    c = 6
    w = rng.standard_normal((3, 3, c * mult)).astype(np.float32)
    g = _dw_graph((1, 9, 8, c), w, stride, mult, act)
    x = rng.standard_normal((1, 9, 8, c)).astype(np.float32)
    y = Session(g, backends=("cpu",), threads=2).run({"x": x})["y"]
    assert rel_err(y, run_reference(g, {"x": x})["y"]) < TOL


def test_fully_connected_uses_the_fused_gemm(rng):
    g = Graph()
    g.add_tensor("x", (3, 10))
    g.inputs = ["x"]
    w = g.add_constant("w", rng.standard_normal((10, 4)).astype(np.float32))
    b = g.add_constant("b", rng.standard_normal(4).astype(np.float32))
    g.add_tensor("y", (3, 4))
    g.add_node("fully_connected", ["x", w, b], ["y"], activation="relu")
    g.outputs = ["y"]
    x = rng.standard_normal((3, 10)).astype(np.float32)
    y = Session(g, backends=("cpu",)).run({"x": x})["y"]
    assert rel_err(y, run_reference(g, {"x": x})["y"]) < TOL
    assert (y == 0).any() and (y > 0).any()


def test_min_tiles_moves_small_maps_to_fewer_larger_tiles_or_im2col():
    # 16×16×256: Eq. 2 alone picks F(4×4) (16 tiles); at least 64 tiles leaves F(2×2)
    assert choose_tile(3, 256, 256, 16, 16) == 4
    assert choose_tile(3, 256, 256, 16, 16, min_tiles=64) == 2
    # 8×8: no tile size leaves 64 tiles, so the sliding window
    assert choose_tile(3, 512, 512, 8, 8, min_tiles=64) == 1
    assert choose_tile(3, 128, 128, 32, 32, min_tiles=64) == 4


def test_session_schemes_follow_min_tiles():
    g = Graph()
    g.add_tensor("x", (1, 4, 4, 64))  # F(2x2) leaves 4 tiles, fewer than the default's 16
    g.inputs = ["x"]
    w = g.add_constant("w", np.ones((3, 3, 64, 64), np.float32))
    g.add_tensor("y", (1, 4, 4, 64))
    g.add_node("conv2d", ["x", w], ["y"], padding="same")
    g.outputs = ["y"]
    assert Session(g, backends=("cpu",)).resize().steps[0].scheme.name == "im2col"
    s = Session(g, backends=("cpu",), winograd_min_tiles=0).resize()
    assert s.steps[0].scheme.name == "winograd"
    assert Session(g, backends=("cpu",), conv_scheme="winograd").resize().steps[0].scheme.name == "winograd"


def test_backend_runs_blas_single_threaded_and_restores_it():
    before = {i["filepath"]: i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}
    b = CPUBackend(threads=2)
    b.begin_run()
    try:
        during = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
        assert during and all(n == 1 for n in during)
        assert numba.get_num_threads() == min(2, numba.config.NUMBA_NUM_THREADS)
    finally:
        b.end_run()
        b.close()
    after = {i["filepath"]: i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}
    assert all(after[k] == v for k, v in before.items() if k in after)


def test_stem_convolutions_with_few_channels_use_im2col():
    def scheme(ic, k=3, **opts):
        g = Graph()
        g.add_tensor("x", (1, 32, 32, ic))
        g.inputs = ["x"]
        w = g.add_constant("w", np.ones((k, k, ic, 32), np.float32))
        g.add_tensor("y", (1, 32, 32, 32))
        g.add_node("conv2d", ["x", w], ["y"], padding="same")
        g.outputs = ["y"]
        return Session(g, backends=("cpu",), **opts).resize().steps[0].scheme.name

    assert scheme(3) == "im2col"
    assert scheme(16) == "im2col"  # measured: im2col 1.3-1.7x faster than Winograd at 16 input channels
    assert scheme(24, k=7) == "winograd" and scheme(16, k=7) == "im2col"  # a 7x7 from 20 (measured: up to 3x)
    assert scheme(32) == "winograd"
    assert scheme(3, winograd_min_channels=1) == "winograd"
    assert scheme(3, conv_scheme="winograd") == "winograd"


def test_blas_limit_is_held_until_the_last_cpu_backend_closes():
    """Closing one CPU backend must not give BLAS its threads back while another still runs products
    inside numba's pool (that ran the survivors' GEMMs ~3x slower on a many-core host)."""
    from threadpoolctl import threadpool_info

    from leti.engine.backends import cpu as cpu_mod

    def blas_threads():
        return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]

    base = cpu_mod.blas_limit_users()
    a, b = cpu_mod.CPUBackend(threads=1), cpu_mod.CPUBackend(threads=1)
    a.begin_run()
    b.begin_run()
    assert cpu_mod.blas_limit_users() == base + 2
    assert all(n == 1 for n in blas_threads())
    a.close()
    a.close()  # idempotent: one backend releases its hold once
    assert cpu_mod.blas_limit_users() == base + 1
    assert all(n == 1 for n in blas_threads())
    b.close()
    assert cpu_mod.blas_limit_users() == base


@pytest.mark.parametrize("shape, padding, dilation", [
    ((2, 9, 8, 6), "same", 1), ((1, 7, 7, 32), "valid", 1), ((1, 10, 11, 5), "same", 2),
    ((1, 3, 2, 4), "same", 1), ((1, 2, 2, 3), "same", 1), ((1, 6, 5, 17), "valid", 2)])
@pytest.mark.parametrize("threads", [1, 2])
def test_depthwise_3x3_row_kernel_matches_reference(rng, shape, padding, dilation, threads):
    """The fused-tap row kernel (3×3, stride 1): batches, valid and same padding, dilation, maps
    narrower than the kernel (every pixel on the border path) and odd channel counts."""
    w = rng.standard_normal((3, 3, shape[3])).astype(np.float32)
    g = _dw_graph(shape, w, 1, 1, "relu6", padding, dilation)
    x = (3 * rng.standard_normal(shape)).astype(np.float32)
    y = Session(g, backends=("cpu",), threads=threads).run({"x": x})["y"]
    assert rel_err(y, run_reference(g, {"x": x})["y"]) < TOL


@pytest.mark.parametrize("shape, stride, padding, dilation", [
    ((1, 112 // 4, 112 // 4, 24), 2, "same", 1), ((2, 9, 11, 5), 2, "valid", 1), ((1, 7, 8, 6), 3, "same", 1),
    ((1, 10, 9, 7), 2, "same", 2), ((1, 2, 3, 4), 2, "same", 1), ((1, 14, 14, 9), 1, "valid", 3)])
@pytest.mark.parametrize("threads", [1, 2])
def test_depthwise_3x3_pixel_kernel_matches_reference(rng, shape, stride, padding, dilation, threads):
    """The fused-tap per-pixel kernel (3×3 other than the row kernel's case): strides 2 and 3,
    padding, dilation, batches, maps smaller than the window (border path only)."""
    w = rng.standard_normal((3, 3, shape[3])).astype(np.float32)
    g = _dw_graph(shape, w, stride, 1, "relu6", padding, dilation)
    x = (3 * rng.standard_normal(shape)).astype(np.float32)
    y = Session(g, backends=("cpu",), threads=threads).run({"x": x})["y"]
    assert rel_err(y, run_reference(g, {"x": x})["y"]) < TOL


@pytest.mark.parametrize("shape, stride, padding, dilation", [
    ((1, 14, 14, 32), 2, "same", 1), ((2, 9, 11, 48), 2, "valid", 1), ((1, 10, 9, 16), 2, "same", 2),
    ((1, 2, 3, 64), 2, "same", 1), ((1, 13, 12, 16), 3, "same", 1)])
@pytest.mark.parametrize("threads", [1, 2])
def test_depthwise_3x3_sixteen_lanes_match_reference_and_eight(rng, shape, stride, padding, dilation, threads):
    """Channels in whole 16s at stride 2 or more take 16 lanes a vector where the CPU has AVX-512
    (``csrc/dwconv_impl.h`` at both widths): interior runs, border columns and rows, dilation, batches, maps
    smaller than the window; the same results with the AVX2 kernels (``set_avx512(False)``)."""
    w = rng.standard_normal((3, 3, shape[3])).astype(np.float32)
    g = _dw_graph(shape, w, stride, 1, "relu6", padding, dilation)
    x = (3 * rng.standard_normal(shape)).astype(np.float32)
    ref = run_reference(g, {"x": x})["y"]
    was, out = ckernels.set_avx512(None), {}
    try:
        for on in (False, True):
            if ckernels.set_avx512(on) != on:
                continue  # no avx512f here: the 8-lane kernel only
            out[on] = Session(g, backends=("cpu",), threads=threads).run({"x": x})["y"]
    finally:
        ckernels.set_avx512(was)
    for y in out.values():
        assert rel_err(y, ref) < TOL
    if len(out) == 2:
        assert np.allclose(out[True], out[False], rtol=1e-5, atol=1e-5 * np.abs(ref).max())


@pytest.mark.parametrize("shape, k, stride, pads, dil", [
    ((1, 12, 11, 3), 3, 2, (1, 1), 1), ((2, 7, 9, 5), 3, 1, (1, 1), 1), ((1, 9, 9, 3), 5, 2, (0, 2), 1),
    ((1, 8, 10, 3), 3, 1, (2, 2), 2), ((1, 6, 6, 20), 3, 2, (1, 0), 1)])
def test_im2col_copies_every_window_with_zero_padding(rng, shape, k, stride, pads, dil):
    """Few channels take the contiguous window-row copy; padding and dilation the per-tap path."""
    nb, h, w, c = shape
    x = rng.standard_normal(shape).astype(np.float32)
    pt, pl = pads
    oh = (h + 2 * pt - dil * (k - 1) - 1) // stride + 1
    ow = (w + 2 * pl - dil * (k - 1) - 1) // stride + 1
    col = np.full((nb * oh * ow, k * k * c), np.nan, np.float32)
    K.im2col(x, col, k, k, stride, stride, dil, dil, pt, pl, oh, ow)
    xp = np.pad(x, ((0, 0), (pt, pt + k * dil), (pl, pl + k * dil), (0, 0)))
    ref = np.stack([xp[:, i * dil: i * dil + (oh - 1) * stride + 1: stride, j * dil: j * dil + (ow - 1) * stride + 1: stride]
                    for i in range(k) for j in range(k)], axis=3).reshape(nb * oh * ow, k * k * c)
    np.testing.assert_array_equal(col, ref)


def test_square_roots_of_negatives_give_nan_silently_as_tflite_does():
    """rsqrt/sqrt of a negative input is NaN, of zero inf/0, with no NumPy warning (a kernel build times them on
    random inputs; the warnings flooded its output)."""
    import warnings

    x = np.array([[-4.0, 0.0, 4.0]], np.float32)
    for op, want in (("rsqrt", [np.nan, np.inf, 0.5]), ("sqrt", [np.nan, 0.0, 2.0])):
        g = Graph()
        g.add_tensor("x", (1, 3))
        g.add_tensor("y", (1, 3))
        g.inputs, g.outputs = ["x"], ["y"]
        g.add_node(op, ["x"], ["y"])
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = Session(g, backends=("cpu",), threads=1).resize().run({"x": x})["y"]
        np.testing.assert_array_equal(got[0], np.array(want, np.float32))


def test_channel_shuffle_transpose_matches_numpy():
    """The last-two-axes swap runs as a numba loop (NumPy's strided copy was ~4x slower); into a contiguous
    output, and falling back to NumPy for a strided one."""
    from leti.engine.backends.cpu import kernels as K

    rng = np.random.default_rng(0)
    g = Graph()
    g.add_tensor("x", (1, 5, 7, 3, 10))
    g.inputs = ["x"]
    g.add_tensor("y", (1, 5, 7, 10, 3))
    g.add_node("transpose", ["x"], ["y"], perm=[0, 1, 2, 4, 3])
    g.outputs = ["y"]
    x = rng.standard_normal((1, 5, 7, 3, 10)).astype(np.float32)
    out = Session(g, backends=("cpu",)).resize().run({"x": x})["y"]
    np.testing.assert_array_equal(out, x.transpose(0, 1, 2, 4, 3))
    a = rng.standard_normal((6, 4, 9)).astype(np.float32)
    b = np.empty((6, 9, 4), np.float32)
    K.swap_last_two(a, b)
    np.testing.assert_array_equal(b, a.transpose(0, 2, 1))
    # a strided output (every other element of a wider buffer): written through NumPy, nothing lost
    from leti.engine.backends.base import OpContext
    from leti.engine.backends.cpu.elementwise import transpose
    from leti.engine.graph import Node
    from leti.engine.scheme import Scheme

    node = Node("t", "transpose", ["x"], ["y"], {"perm": [0, 1, 2, 4, 3]})
    ex = transpose(OpContext(node, [x.shape], [out.shape], {}, Scheme()), None)
    wide = np.zeros((*out.shape[:-1], 2 * out.shape[-1]), np.float32)
    ex.run([x], [wide[..., ::2]], [])
    np.testing.assert_array_equal(wide[..., ::2], x.transpose(0, 1, 2, 4, 3))
    assert not wide[..., 1::2].any()


# one xdist worker runs every parameter (make test: --dist loadgroup): numba compiles the kernels once, not once per
# worker at the same moment (the disk cache is only written when a compile ends)
@pytest.mark.xdist_group("numba-jit")
@pytest.mark.parametrize("path", [pytest.param("leti", marks=needs_leti), pytest.param("mkl", marks=needs_mkl),
                                  "openblas"])
@pytest.mark.parametrize("k, scheme", [(1, "gemm"), (1, "strassen"), (3, "winograd"), (3, "im2col")])
def test_fused_residual_matches_the_reference_on_every_scheme(rng, monkeypatch, path, k, scheme):
    """A ResNet block's shortcut add fused into the conv before it (passes.fuse_residual_adds) gives the
    unfused graph's result on every scheme and GEMM path, and the separate add step is gone."""
    from tests.engine.test_passes import _residual_block

    if path != "leti":
        monkeypatch.setattr(ckernels, "library", lambda: None)
    if path == "openblas":
        monkeypatch.setattr(blas, "mkl", lambda: None)
    g = _residual_block(rng, k=k, bias=scheme != "im2col")
    x = rng.standard_normal((1, 12, 12, 40)).astype(np.float32)
    s = Session(g, backends=("cpu",), threads=2, conv_scheme=scheme, strassen_min_dim=0).resize()
    assert [st.op for st in s.steps] == ["conv2d", "conv2d"] and s.steps[1].scheme.name == scheme
    assert rel_err(s.run({"x": x})["y"], run_reference(g, {"x": x})["y"]) < TOL


def test_residual_stays_a_separate_add_unless_every_backend_takes_it(rng, monkeypatch):
    from tests.engine.test_passes import _residual_block

    monkeypatch.setattr(CPUBackend, "takes_residual", False)
    s = Session(_residual_block(rng), backends=("cpu", "reference")).resize()
    assert [st.op for st in s.steps] == ["conv2d", "conv2d", "add"] and "fuse_residual_adds" not in s.pass_report


@pytest.mark.parametrize("path", [pytest.param("leti", marks=needs_leti), "openblas"])
@pytest.mark.parametrize("ic, stride, dilation, window", [
    (3, 2, 1, True),      # a stem: LETI's window kernel, no column matrix
    (136, 2, 1, False),   # more input channels than conv.WINDOW_MAX_IC: im2col + GEMM
    (8, 1, 2, False),     # dilated: im2col + GEMM
])
def test_sliding_window_paths_match_the_reference(rng, monkeypatch, path, ic, stride, dilation, window):
    """Both implementations of the sliding-window scheme (LETI's implicit GEMM and im2col + GEMM) give the
    reference convolution, and the window kernel is taken exactly where it applies."""
    from leti.engine import ops
    from leti.engine.backends.cpu import conv as C

    if path != "leti":
        monkeypatch.setattr(ckernels, "library", lambda: None)
        monkeypatch.setattr(blas, "mkl", lambda: None)
    x_shape = (2, 11, 9, ic)
    g = Graph()
    g.add_tensor("x", x_shape)
    g.inputs = ["x"]
    wn = g.add_constant("w", (rng.standard_normal((3, 3, ic, 20)) / np.sqrt(9 * ic)).astype(np.float32))
    bn = g.add_constant("b", rng.standard_normal(20).astype(np.float32))
    attrs = {"strides": [stride] * 2, "dilations": [dilation] * 2, "padding": "same", "activation": "relu6"}
    g.add_tensor("y", ops.get("conv2d").infer([x_shape, (3, 3, ic, 20), (20,)], attrs)[0])
    g.add_node("conv2d", ["x", wn, bn], ["y"], **attrs)
    g.outputs = ["y"]
    x = rng.standard_normal(x_shape).astype(np.float32)
    s = Session(g, backends=("cpu",), threads=2, conv_scheme="im2col").resize()
    step = s.steps[0]
    assert step.scheme.name == "im2col"
    uses_window = step.execution.fn.__name__ == "run_window"
    assert uses_window == (window and path == "leti")
    if uses_window:  # its scratch is the zero-padded input, not a column matrix 9x the input
        assert step.execution.scratch[0] < 9 * 4 * np.prod(x_shape[1:]) / (stride * stride)
    assert ic <= C.WINDOW_MAX_IC or not uses_window
    assert rel_err(s.run({"x": x})["y"], run_reference(g, {"x": x})["y"]) < TOL


def _avx512_on() -> bool:
    """Whether this CPU runs the AVX-512 products (asked, and the setting put back as it was)."""
    was = ckernels.set_avx512(None)
    on = ckernels.set_avx512(True)
    ckernels.set_avx512(was)
    return on


needs_avx512 = pytest.mark.skipif(ckernels.library() is None or not _avx512_on(),
                                  reason="LETI's GEMM or a CPU with avx512f unavailable here")


@needs_avx512
@pytest.mark.parametrize("rows", [1, 7, 12, 13, 49, 300])
@pytest.mark.parametrize("n", [8, 16, 17, 24, 25, 32, 40, 100])
@pytest.mark.parametrize("k", [7, 300, 600])
def test_avx512_products_match_numpy_and_the_avx2_kernel(rng, rows, n, k):
    """The AVX-512 micro-kernels (the default where the CPU has it): 12 rows x two 16-column panels (the second
    partial by a store mask: n = 17, 24, 25, 40, 100) or x one panel (pairs off, or a panel alone: n = 16), half panels
    (at most 8 columns) that are not a pair's second on the AVX2 tiles (n = 8, 40), several k blocks (600 > 256), bias, activation and a residual
    in the last block's epilogue; every variant to numpy and to the AVX2 kernel's results to rounding."""
    from leti.engine.backends.cpu import gemm as G

    a = rng.standard_normal((rows, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    bias, res = rng.standard_normal(n).astype(np.float32), rng.standard_normal((rows, n)).astype(np.float32)
    bp, bpad = ckernels.pack(w), ckernels.pad_bias(bias, n)
    out, was, pair_was = {}, ckernels.set_avx512(None), ckernels.set_pair512(None)
    try:
        for on, pair in ((False, False), (True, False), (True, True)):
            assert ckernels.set_avx512(on) == on and ckernels.set_pair512(pair) == pair
            for act in (0, 2):
                for r in (None, res):
                    y = np.full((rows, n), np.nan, np.float32)
                    G.gemm_leti_bias_act(a, bp, y, bpad, True, act, 1, np.zeros((1, 1), np.float32) if r is None else r,
                                         r is not None)
                    out[on, pair, act, r is None] = y
    finally:
        ckernels.set_avx512(was)
        ckernels.set_pair512(pair_was)
    for act in (0, 2):
        for plain in (True, False):
            ref = a.astype(np.float64) @ w + bias + (0 if plain else res)
            ref = _relu6(ref) if act == 2 else ref
            for pair in (False, True):
                assert rel_err(out[True, pair, act, plain], ref) < TOL
                assert np.allclose(out[True, pair, act, plain], out[False, False, act, plain], rtol=1e-4,
                                   atol=1e-4 * np.abs(ref).max())


@needs_avx512
def test_paired_panels_are_the_default_and_leti_gemm_pair_0_turns_them_off():
    import os
    import subprocess
    import sys

    ask = "from leti.engine.backends.cpu import ckernels; print(ckernels.set_pair512(None))"
    env = {k: v for k, v in os.environ.items() if k != "LETI_GEMM_PAIR"}
    for value, expect in ((None, "True"), ("0", "False")):
        e = env if value is None else {**env, "LETI_GEMM_PAIR": value}
        out = subprocess.run([sys.executable, "-c", ask], env=e, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-500:]
        assert out.stdout.strip().splitlines()[-1] == expect


@needs_avx512
def test_avx512_is_the_default_and_leti_avx512_0_turns_it_off():
    import os
    import subprocess
    import sys

    ask = "from leti.engine.backends.cpu import ckernels; print(ckernels.set_avx512(None))"
    env = {k: v for k, v in os.environ.items() if k != "LETI_AVX512"}
    for value, expect in ((None, "True"), ("0", "False"), ("1", "True")):
        e = env if value is None else {**env, "LETI_AVX512": value}
        out = subprocess.run([sys.executable, "-c", ask], env=e, capture_output=True, text=True, timeout=120)
        assert out.stdout.strip() == expect, (value, out.stderr[-500:])
