"""Convolution executions of the CPU backend, one per scheme chosen at pre-inference:

* ``gemm`` / ``strassen`` — 1×1 stride-1 convolutions are one matrix product over the NHWC data
  (no copy), optionally with Strassen levels;
* ``winograd`` — F(n×n, k×k) with the generated A, B, G: numba input transform, α² matrix products
  against the pre-transformed filter ``U = G W Gᵀ`` (one per position, split over numba's
  threads), numba output transform with the bias and activation fused;
* ``im2col`` — the sliding-window scheme for everything else (strides, dilations, n̂ = 1): numba
  builds the column matrix in a scratch buffer planned at resize, the GEMM multiplies it; over few input
  channels (a stem's RGB) LETI's ``leti_conv_window`` reads each patch from a zero-padded copy of the
  input instead (:data:`WINDOW_MAX_IC`), which spares writing and reading a column matrix 9× the input;
* depthwise convolutions run a direct kernel (3×3: LETI's C kernel, else numba's fused taps over
  whole rows or per pixel, :mod:`.dwconv`; other windows: numba's generic kernel).

Every matrix product runs as single-threaded calls inside numba's thread pool (:func:`gemm_runner`):
LETI's own kernel with pre-packed weights and the bias and activation fused (:mod:`.ckernels`) where
it builds, else MKL's or OpenBLAS's SGEMM (:mod:`.blas`) with the epilogue applied to each row block
while it is in cache. One pool of threads for the whole model, so BLAS threads and numba threads
never compete for the same cores.
"""

from __future__ import annotations

import numba
import numpy as np

from leti.engine.backends.base import Execution, OpContext, executions_of
from leti.engine.backends.cpu import blas, ckernels, native
from leti.engine.backends.cpu import gemm as G
from leti.engine.backends.cpu import kernels as K
from leti.engine.backends.cpu import winograd_transforms as WT
from leti.engine.backends.cpu.dwconv import depthwise3x3, depthwise3x3_leti, depthwise3x3_rows
from leti.engine.ops.conv2d import geometry
from leti.engine.strassen import strassen_matmul
from leti.engine.winograd import winograd_matrices

EXECUTIONS = executions_of("cpu")
_EMPTY = np.zeros(1, dtype=np.float32)
_EMPTY2 = np.zeros((1, 1), dtype=np.float32)
#: Largest tiled weight copy (10 floats per output column and channel) a 3×3 depthwise op may keep.
TILED_BYTES_MAX = 8 << 20
#: Most input channels for which a sliding window runs as LETI's implicit GEMM (no column matrix). Against
#: im2col + GEMM (one / two threads, ms): the 3×3/2 stem over RGB to 32 channels at 224 0.32 / 0.27 vs 0.56 /
#: 0.45, ResNet50's 7×7/2 stem 3.4 / 2.0 vs 4.6 / 2.6, 3×3 over 16 channels on 56×56 0.34 vs 0.49, 3×3/2 over
#: 64 and 128 channels 0.94 vs 0.97 and 2.55 vs 2.65; over 256 channels im2col is ahead (3.47 vs 3.64): the
#: window kernel keeps its accumulators over the whole k = kh·kw·ic, with no k blocks.
WINDOW_MAX_IC = 128


#: Most bytes the transformed tiles of one Winograd pass (V and M together) may take. The whole map's tiles at once
#: took 21 MB on a 96×96×128 → 128 convolution, more than TFLite's whole session; in blocks of tiles the products
#: stay as large as a 64×64 map's (see :func:`winograd_block`). 1 MiB (a block's V and M in one core's L2 on a Zen 4 or
#: 5) against 4 MiB, interleaved in one process (session 41, Zen 5): the NB101 96×96 cells 0.90-0.99× the time at two
#: threads and 0.98-0.99× at one, ResNet50 0.97-0.98×, an NB101 network (its 64 tiles one block either way) 1.00×.
WINOGRAD_BLOCK_BYTES = 1 << 20
#: fewest tiles a block holds (the α² products' rows): a 32×32 map's 64 F(4×4) tiles, so NB101 networks and
#: smaller maps run in one pass as before
WINOGRAD_BLOCK_MIN = 64


def winograd_block(tiles: int, alpha: int, ic: int, oc: int) -> int:
    """Tiles per Winograd pass: all of them when they fit :data:`WINOGRAD_BLOCK_BYTES`, else equal blocks of at least
    :data:`WINOGRAD_BLOCK_MIN` tiles that do."""
    per_tile = alpha * alpha * (ic + oc) * 4
    fit = max(WINOGRAD_BLOCK_MIN, WINOGRAD_BLOCK_BYTES // per_tile)
    if tiles <= fit:
        return tiles
    passes = -(-tiles // fit)
    return -(-tiles // passes)


def gemm_runner(w2: np.ndarray, bias: np.ndarray, has_bias: bool, act: int):
    """``f(a, y, r=None)``: ``y = act(a @ w2 + bias [+ r])`` over numba's threads through the GEMM in use
    (:func:`blas.name`), with the weights ``w2`` (k × n) stored once as that GEMM reads them fastest:
    packed panels for LETI's own kernel (:mod:`.ckernels`, which adds a residual ``r`` in its epilogue),
    row-major for MKL, column-major for OpenBLAS (which packs a transposed B faster, what matters most
    for the few-row products of small maps; a residual is a second pass there)."""
    threads = numba.get_num_threads
    if ckernels.library() is not None:
        n = w2.shape[1]
        bp = ckernels.pack(w2)
        bpad = ckernels.pad_bias(bias, n) if has_bias else _EMPTY

        def run_leti(a, y, r=None):
            G.gemm_leti_bias_act(a, bp, y, bpad, has_bias, act, threads(), _EMPTY2 if r is None else r, r is not None)

        run_leti.records = lambda a, y, r=None: native.gemm(a, bp, y, bpad, has_bias, act, r)
        return run_leti
    if blas.mkl() is not None:
        wc, one = np.ascontiguousarray(w2, dtype=np.float32), blas.ONE_THREAD

        def run_mkl(a, y, r=None):
            K.gemm_mkl_bias_act(a, wc, y, bias, has_bias, act if r is None else 0, threads(), one)
            if r is not None:
                K.residual_act(y, r, act)

        return run_mkl
    wf = np.asfortranarray(w2, dtype=np.float32)

    def run_openblas(a, y, r=None):
        K.gemm_bias_act(a, wf, y, bias, has_bias, act if r is None else 0, threads())
        if r is not None:
            K.residual_act(y, r, act)

    return run_openblas


def gemv_execution(w2: np.ndarray, bias: np.ndarray, has_bias: bool, act: int) -> Execution:
    """A product with one input row (a fully connected layer, or a 1×1 convolution on one pixel, at batch 1) as a
    matrix-vector product over the weights ``w2`` (k × n) packed in panels of 16 outputs: read once per run, in
    order, from memory when the network's other weights have pushed them out of the cache (``csrc/program.c``,
    ``gemv_panels``). The products' kernel with one row read them as fast warm but 1.3× slower cold."""
    k, n = w2.shape
    wp = ckernels.pack(w2)

    def run_gemv(ins, outs, scratch):
        K.gemv_bias_act(ins[0].reshape(k), wp, outs[0].reshape(n), bias, has_bias, act)

    def records(ins, outs, scratch):
        return native.gemv(ins[0].reshape(k), wp, outs[0].reshape(n), bias, has_bias, act)

    return Execution(run_gemv, native=records)


def _bias_act(ctx: OpContext, nout: int):
    bias = ctx.constants.get(2)
    # a copy of its own (as every weight a session runs with: packed, transformed or copied), not a view of the model
    # file, whose pages the session releases (memory.release_mapped_weights)
    b = np.array(bias, dtype=np.float32) if bias is not None else _EMPTY
    return b, bias is not None, K.ACT_CODE[ctx.attrs.get("activation", "none")]


@EXECUTIONS.register("conv2d")
def conv2d(ctx: OpContext, be) -> Execution | None:
    w = ctx.constants.get(1)
    if w is None:  # weights computed at run time: not supported by the fast path
        return None
    x_shape = ctx.in_shapes[0]
    pads, (oh, ow), (sh, sw), (dh, dw) = geometry(x_shape, w.shape, ctx.attrs)
    kh, kw, ic, oc = w.shape
    bias, has_bias, act = _bias_act(ctx, oc)
    scheme = ctx.scheme
    rows = x_shape[0] * oh * ow
    res = len(ctx.in_shapes) > 3  # a residual (input 3) added before the activation (passes.fuse_residual_adds)
    post_act = 0 if res else act  # what a scheme without a fused residual applies itself

    def residual(ins):
        return ins[3].reshape(rows, oc) if res else None

    if scheme.name in ("gemm", "strassen"):
        if (kh, kw, sh, sw) != (1, 1, 1, 1) or any(pads):
            return None
        depth = int(scheme.params.get("depth", 0)) if scheme.name == "strassen" else 0
        if depth:
            w2 = np.ascontiguousarray(w.reshape(ic, oc), dtype=np.float32)

            def run_strassen(ins, outs, scratch):
                y2 = outs[0].reshape(rows, oc)
                strassen_matmul(ins[0].reshape(rows, ic), w2, depth, out=y2)
                if has_bias or post_act:
                    K.bias_act(y2, bias, has_bias, post_act)
                if res:
                    K.residual_act(y2, residual(ins), act)

            return Execution(run_strassen)
        if rows == 1 and not res:
            return gemv_execution(w.reshape(ic, oc), bias, has_bias, act)
        gemm = gemm_runner(w.reshape(ic, oc), bias, has_bias, act)

        def run_gemm(ins, outs, scratch):  # NHWC is already the (rows, ic) matrix: no copy
            gemm(ins[0].reshape(rows, ic), outs[0].reshape(rows, oc), residual(ins))

        def records(ins, outs, scratch):
            return gemm.records(ins[0].reshape(rows, ic), outs[0].reshape(rows, oc), residual(ins))

        return Execution(run_gemm, native=records if hasattr(gemm, "records") else None)

    if scheme.name == "winograd":
        n = int(scheme.params["n"])
        if kh != kw or (sh, sw, dh, dw) != (1, 1, 1, 1):
            return None
        at, bt, g = winograd_matrices(n, kh)
        alpha = n + kh - 1
        u = np.einsum("ai,bj,ijco->abco", g, g, w.astype(np.float64)).reshape(alpha * alpha, ic, oc)
        if ckernels.library() is not None:
            up = ckernels.pack(u)  # per position (panels, ic, 16)

            def products(v, m):
                G.batched_gemm_leti(v, up, m)
        else:
            ut = np.ascontiguousarray(u.transpose(0, 2, 1), dtype=np.float32)  # per position (oc, ic)

            def products(v, m):
                K.batched_gemm(v, ut, m)
        at32, bt32 = WT.winograd_transforms(at, bt)
        th, tw = -(-oh // n), -(-ow // n)
        tiles = x_shape[0] * th * tw
        block = winograd_block(tiles, alpha, ic, oc)
        v_bytes, m_bytes = alpha * alpha * block * ic * 4, alpha * alpha * block * oc * 4
        pt, pl = pads[0], pads[2]

        def tile_blocks(scratch):
            """``(r0, v, m)`` per block of tiles (one when the tiles fit a block): the transformed inputs and products
            of tiles ``r0 ..`` as views of the two scratch buffers."""
            for r0 in range(0, tiles, block):
                cnt = min(block, tiles - r0)
                v = scratch[0][:alpha * alpha * cnt * ic * 4].view(np.float32).reshape(alpha * alpha, cnt, ic)
                m = scratch[1][:alpha * alpha * cnt * oc * 4].view(np.float32).reshape(alpha * alpha, cnt, oc)
                yield r0, v, m

        def records(ins, outs, scratch):
            x, y = ins[0], outs[0]
            out = []
            for r0, v, m in tile_blocks(scratch):
                out += native.winograd(x, bt_plain, v, up, m, at_plain, y, bias, has_bias, post_act, n, pt, pl, th, tw,
                                       r0)
            if res:
                out += native.add(y, ins[3], y, act)
            return out

        def run_winograd(ins, outs, scratch):
            threads = numba.get_num_threads()
            for r0, v, m in tile_blocks(scratch):
                WT.winograd_input(ins[0], bt32, v, n, pt, pl, th, tw, threads, r0)
                products(v, m)
                WT.winograd_output(m, at32, outs[0], bias, has_bias, post_act, th, tw, threads, r0)
            if res:
                K.residual_act(outs[0].reshape(rows, oc), residual(ins), act)

        bt_plain, at_plain = np.ascontiguousarray(bt, np.float32), np.ascontiguousarray(at, np.float32)
        return Execution(run_winograd, scratch=(v_bytes, m_bytes),
                         native=records if ckernels.library() is not None and alpha <= 8 else None)

    # im2col: the general sliding-window scheme; over few input channels (a stem) LETI's kernel reads the
    # patches from a zero-padded copy of the input instead (an implicit GEMM: no column matrix)
    pt, pl = pads[0], pads[2]
    if ckernels.library() is not None and (dh, dw) == (1, 1) and ic <= WINDOW_MAX_IC:
        bp = ckernels.pack(w.reshape(kh * kw * ic, oc))
        bpad = ckernels.pad_bias(bias, oc) if has_bias else _EMPTY
        hp, wp = G.padded_shape(ctx.in_shapes[0], oh, ow, kh, kw, sh, sw, pt, pl)

        def run_window(ins, outs, scratch):
            xp = G.padded_view(scratch, hp, wp, ic)
            r = residual(ins)
            G.conv_window_leti(ins[0], xp, bp, outs[0], bpad, has_bias, _EMPTY2 if r is None else r, res, 1,
                               kh, kw, sh, sw, pt, pl, act, numba.get_num_threads())

        def records(ins, outs, scratch):
            return native.conv_window(ins[0], G.padded_view(scratch, hp, wp, ic), bp, outs[0], bpad, has_bias,
                                      residual(ins), 1, kh, kw, sh, sw, pt, pl, act)

        return Execution(run_window, scratch=(hp * wp * ic * 4,), native=records)
    gemm = gemm_runner(w.reshape(kh * kw * ic, oc), bias, has_bias, act)
    cols = kh * kw * ic

    def run_im2col(ins, outs, scratch):
        col = scratch[0].view(np.float32).reshape(rows, cols)
        K.im2col(ins[0], col, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow)
        gemm(col, outs[0].reshape(rows, oc), residual(ins))

    def records(ins, outs, scratch):
        col = scratch[0].view(np.float32).reshape(rows, cols)
        return (native.im2col(ins[0], col, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow)
                + gemm.records(col, outs[0].reshape(rows, oc), residual(ins)))

    return Execution(run_im2col, scratch=(rows * cols * 4,), native=records if hasattr(gemm, "records") else None)


@EXECUTIONS.register("depthwise_conv2d")
def depthwise_conv2d(ctx: OpContext, be) -> Execution | None:
    w = ctx.constants.get(1)
    if w is None:
        return None
    w = np.array(w, dtype=np.float32)  # a compact copy of its own, not a view of the model file (see _bias_act)
    pads, _, (sh, sw), (dh, dw) = geometry(ctx.in_shapes[0], w.shape, ctx.attrs)
    bias, has_bias, act = _bias_act(ctx, w.shape[2])
    mult = int(ctx.attrs.get("multiplier", 1))
    nb, h, wd, c = ctx.in_shapes[0]
    kh, kw = w.shape[:2]
    _, oh, ow, _ = ctx.out_shapes[0]
    if (kh, kw, mult) == (3, 3, 1) and ckernels.library() is not None:
        w9 = ckernels.dw3x3_weights(w.reshape(9, c), bias if has_bias else None)

        def run_leti(ins, outs, scratch):
            depthwise3x3_leti(ins[0], w9, bias, has_bias, outs[0], sh, sw, dh, dw, pads[0], pads[2], act,
                              numba.get_num_threads())

        def records(ins, outs, scratch):
            return native.dwconv3x3(ins[0], w9, bias, has_bias, outs[0], sh, sw, dh, dw, pads[0], pads[2], act)

        return Execution(run_leti, native=records)
    if (kh, kw, sh, sw, mult) == (3, 3, 1, 1, 1) and 40 * ow * c <= TILED_BYTES_MAX:
        pt, pl = pads[0], pads[2]
        b = bias if has_bias else np.zeros(c, np.float32)
        xa = pl  # output columns whose three taps all fall inside the input
        xb = max(xa, min(ow, wd + pl - 2 * dw))
        wt = np.ascontiguousarray(np.tile(w.reshape(9, 1, c), (1, xb - xa, 1)).reshape(9, (xb - xa) * c))
        bt = np.tile(b, xb - xa).astype(np.float32)

        def run_rows(ins, outs, scratch):
            depthwise3x3_rows(ins[0].reshape(nb, h, wd * c), wt, bt, outs[0].reshape(nb, oh, ow * c), w, b,
                                h, wd, c, oh, ow, pt, pl, dh, dw, xa, xb, act)

        return Execution(run_rows)
    if (kh, kw, mult) == (3, 3, 1):  # strided: nine taps fused per interior pixel (dwconv.py)
        w9 = np.ascontiguousarray(w.reshape(9, c))
        b = bias if has_bias else np.zeros(c, np.float32)
        pt, pl = pads[0], pads[2]

        def run_3x3(ins, outs, scratch):
            depthwise3x3(ins[0].reshape(nb, h, wd * c), w9, b, outs[0].reshape(nb, oh, ow * c), h, wd, c,
                         sh, sw, dh, dw, pt, pl, act)

        return Execution(run_3x3)

    def run(ins, outs, scratch):
        K.depthwise(ins[0], w, bias, has_bias, outs[0], mult, sh, sw, dh, dw, pads[0], pads[2], act)

    records = None
    if mult == 1 and ckernels.library() is not None:  # any other window (5×5, 7×7, …): a program's C loop

        def records(ins, outs, scratch):
            return native.dwconv(ins[0], w, bias, has_bias, outs[0], sh, sw, dh, dw, pads[0], pads[2], act)

    return Execution(run, native=records)
