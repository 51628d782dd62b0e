"""Convolutions of the CUDA backend: its own schemes, cuDNN's, and the choice between them.

Own schemes (float32 and 16-bit storage alike, except Winograd, float32 only): a 1×1 convolution is
one cuBLAS product, a k×k one Winograd (α² batched products between the transform kernels) or
``im2col`` + one product, each followed by a bias + activation kernel; depthwise convolutions have
their own kernel. cuDNN (:mod:`.cudnn`) adds tensor-core convolutions in TF32/FP16/BF16, NHWC
implicit-GEMM kernels, grouped (depthwise) convolutions and a fused bias + ReLU epilogue.

Unless the user forced a scheme (``conv_scheme``) or the backend was told (``cudnn="off"|"on"``),
both candidates are prepared and timed on the op's shapes (:mod:`.tune`); the faster one runs and
the step's scheme says which (``cudnn(algo=N)`` or the own scheme). Weights are uploaded in the
backend's storage precision (and the Winograd filter transformed) here, at pre-inference.
"""

from __future__ import annotations

import cupy as cp
import numpy as np

from leti.engine.backends.base import Execution, OpContext, Scheme, executions_of
from leti.engine.backends.cuda import blas, cudnn, tune
from leti.engine.backends.cuda import kernels as K
from leti.engine.ops.conv2d import geometry
from leti.engine.winograd import winograd_matrices
from leti.errors import DeviceError

EXECUTIONS = executions_of("cuda")
ACT = {"none": 0, None: 0, "relu": 1, "relu6": 2}
I32, I64 = np.int32, np.int64


def gemm(be, a, b, c, m: int, n: int, k: int, batch: int = 1, sa: int = 0, sb: int = 0, sc: int = 0) -> None:
    blas.gemm(be.handle, be.stream.ptr, a, b, c, m, n, k, batch, sa, sb, sc, dtype=be.prec.cuda_type)


def bias_act(be, y2, bias, act: int) -> None:
    """Bias and activation in place over the last axis (16-byte vectors when the channels allow)."""
    if bias is None and not act:
        return
    total, ch = y2.size, y2.shape[-1]
    mod, v = K.basic(be.prec.kernel), K.vec(be.prec.kernel)
    if ch % v == 0:
        K.launch(mod.get_function("bias_act_vec"), total // v,
                 (y2, bias if bias is not None else y2, I32(total // v), I32(ch // v), I32(bias is not None), I32(act)))
        return
    K.launch(mod.get_function("bias_act"), total,
             (y2, bias if bias is not None else y2, I64(total), I32(ch), I32(bias is not None), I32(act)))


def _own_conv2d(ctx: OpContext, be, w, bias, act) -> Execution | None:
    x_shape = ctx.in_shapes[0]
    pads, (oh, ow), (sh, sw), (dh, dw) = geometry(x_shape, w.shape, ctx.attrs)
    kh, kw, ic, oc = w.shape
    nb, h, wd, _ = x_shape
    rows = nb * oh * ow
    scheme = ctx.scheme
    item = be.prec.storage.itemsize

    if scheme.name in ("gemm", "strassen"):
        if (kh, kw, sh, sw) != (1, 1, 1, 1) or any(pads):
            return None
        ctx.scheme = Scheme("gemm", forced=scheme.forced)
        w2 = be.dev(w.reshape(ic, oc))

        def run_gemm(ins, outs, scratch):
            gemm(be, ins[0], w2, outs[0], rows, oc, ic)
            bias_act(be, outs[0], bias, act)

        return Execution(run_gemm)

    if scheme.name == "winograd" and not be.prec.half:
        n = int(scheme.params["n"])
        if kh != kw or (sh, sw, dh, dw) != (1, 1, 1, 1):
            return None
        at, bt, g = winograd_matrices(n, kh)
        alpha = n + kh - 1
        u = be.dev(np.einsum("ai,bj,ijco->abco", g, g, w.astype(np.float64)).reshape(alpha * alpha, ic, oc))
        at_d, bt_d = be.dev(at), be.dev(bt)
        th, tw = -(-oh // n), -(-ow // n)
        tiles = nb * th * tw
        mod = K.winograd(alpha, n)
        k_in, k_out = mod.get_function("wino_in"), mod.get_function("wino_out")
        pt, pl = pads[0], pads[2]
        v_bytes, m_bytes = alpha * alpha * tiles * ic * 4, alpha * alpha * tiles * oc * 4
        dummy = bias if bias is not None else at_d

        def run_winograd(ins, outs, scratch):
            v = scratch[0].view(cp.float32)
            m = scratch[1].view(cp.float32)
            K.launch(k_in, tiles * ic, (ins[0], bt_d, v, I64(tiles * ic), I32(h), I32(wd), I32(ic), I32(th),
                                        I32(tw), I32(pt), I32(pl)))
            gemm(be, v, u, m, tiles, oc, ic, batch=alpha * alpha, sa=tiles * ic, sb=ic * oc, sc=tiles * oc)
            K.launch(k_out, tiles * oc, (m, at_d, dummy, outs[0], I64(tiles * oc), I32(oh), I32(ow), I32(oc),
                                         I32(th), I32(tw), I32(bias is not None), I32(act)))

        return Execution(run_winograd, scratch=(v_bytes, m_bytes))

    ctx.scheme = Scheme("im2col", forced=scheme.forced)
    w2 = be.dev(w.reshape(kh * kw * ic, oc))
    cols = kh * kw * ic
    pt, pl = pads[0], pads[2]
    k_col = K.basic(be.prec.kernel).get_function("im2col")

    def run_im2col(ins, outs, scratch):
        col = scratch[0].view(be.prec.storage)
        K.launch(k_col, rows * cols, (ins[0], col, I64(rows * cols), I32(h), I32(wd), I32(ic), I32(kh), I32(kw),
                                      I32(sh), I32(sw), I32(dh), I32(dw), I32(pt), I32(pl), I32(oh), I32(ow)))
        gemm(be, col, w2, outs[0], rows, oc, cols)
        bias_act(be, outs[0], bias, act)

    return Execution(run_im2col, scratch=(rows * cols * item,))


def _cudnn_conv(ctx: OpContext, be, w_krsc: np.ndarray, groups: int, bias, act: int) -> Execution | None:
    """The convolution on cuDNN (``w_krsc``: out channels, kh, kw, in channels per group), or None."""
    if not be.cudnn_ready():
        return None
    x_shape, out_shape = ctx.in_shapes[0], ctx.out_shapes[0]
    w_hw = (w_krsc.shape[1], w_krsc.shape[2], 1, 1)  # geometry reads only the window of the filter
    pads, _, strides, dil = geometry(x_shape, w_hw, ctx.attrs)
    w_dev = be.dev(w_krsc)
    key = _key(ctx, be)
    with be.device, be.stream:
        rng = cp.random.RandomState(1)
        bufs = (tune.random_input(x_shape, be.prec, rng), w_dev, cp.empty(out_shape, be.prec.storage),
                cp.empty(cudnn.WORKSPACE_CAP, cp.uint8))
        try:
            plan = cudnn.Conv(be.cudnn_handle, x_shape, w_krsc.shape, out_shape, pads, strides, dil, groups, be.prec,
                              act, bufs, algo=_ALGOS.get(key))
        except DeviceError as exc:
            be.cudnn_declined[ctx.node.name] = str(exc)
            return None
        finally:
            be.stream.synchronize()
    _ALGOS[key] = (plan.algo, plan.math)
    b_dev = bias if bias is not None else be.dev(np.zeros(out_shape[-1], np.float32))

    def run(ins, outs, scratch):
        plan(ins[0], w_dev, b_dev, outs[0], scratch[0] if plan.workspace else None)
        if not plan.fused:
            bias_act(be, outs[0], bias, act)

    ex = Execution(run, scratch=(plan.workspace,) if plan.workspace else ())
    ex.scheme = Scheme("cudnn", {"algo": plan.algo})
    return ex


#: choices made in this process, by op configuration and precision: a second session of the same
#: model gets the same schemes (and cuDNN algorithms), so op tables and plans keyed by scheme agree
_ALGOS: dict[tuple, tuple[int, int]] = {}
_CHOICES: dict[tuple, tuple[int, dict]] = {}


def _key(ctx: OpContext, be) -> tuple:
    return (ctx.node.op, tuple(map(tuple, ctx.in_shapes)), repr(sorted(ctx.attrs.items())), str(ctx.scheme),
            be.prec.name, be.device_name)


def _choose(ctx: OpContext, be, own: Execution | None, forced: bool, make_dnn) -> Execution | None:
    """``own`` or the cuDNN execution ``make_dnn()``, whichever is faster (see the module docstring)."""
    if forced or be.cudnn_mode == "off":
        return own
    own_scheme = ctx.scheme
    key = _key(ctx, be)
    if own is not None and be.cudnn_mode != "on" and _CHOICES.get(key, (None,))[0] == 0:
        be.tuned[ctx.node.name] = _CHOICES[key][1]
        return own  # measured slower than the own scheme before: no cuDNN preparation at all
    dnn = make_dnn()
    if dnn is None:
        return own
    if own is not None and be.cudnn_mode != "on":
        if key not in _CHOICES:
            best, times = tune.fastest(be, ctx, [own, dnn])
            _CHOICES[key] = (best, {"own": times[0], "cudnn": times[1], "own_scheme": str(own_scheme)})
        best, be.tuned[ctx.node.name] = _CHOICES[key]
        if best == 0:
            ctx.scheme = own_scheme
            return own
    ctx.scheme = dnn.scheme
    return dnn


@EXECUTIONS.register("conv2d")
def conv2d(ctx: OpContext, be) -> Execution | None:
    if len(ctx.in_shapes) > 3:  # a fused residual (passes.fuse_residual_adds): the CPU backend's
        return None
    w = ctx.constants.get(1)
    if w is None:
        return None
    forced = ctx.scheme.forced
    bias = be.dev(ctx.constants[2]) if 2 in ctx.constants else None
    act = ACT[ctx.attrs.get("activation", "none")]
    own = _own_conv2d(ctx, be, w, bias, act)
    return _choose(ctx, be, own, forced, lambda: _cudnn_conv(ctx, be, np.ascontiguousarray(w.transpose(3, 0, 1, 2)),
                                                             1, bias, act))


@EXECUTIONS.register("depthwise_conv2d")
def depthwise_conv2d(ctx: OpContext, be) -> Execution | None:
    w = ctx.constants.get(1)
    if w is None:
        return None
    pads, (oh, ow), (sh, sw), (dh, dw) = geometry(ctx.in_shapes[0], w.shape, ctx.attrs)
    kh, kw, oc = w.shape
    nb, h, wd, c = ctx.in_shapes[0]
    wd_dev = be.dev(w)
    bias = be.dev(ctx.constants[2]) if 2 in ctx.constants else None
    act = ACT[ctx.attrs.get("activation", "none")]
    mult = int(ctx.attrs.get("multiplier", 1))
    total = nb * oh * ow * oc
    mod, v = K.basic(be.prec.kernel), K.vec(be.prec.kernel)
    b_arg = bias if bias is not None else wd_dev
    if mult == 1 and c % v == 0:  # 16-byte channel vectors, one output row per grid row
        k = mod.get_function("depthwise_vec")

        def run(ins, outs, scratch):
            K.launch_rows(k, nb * oh, ow * (c // v),
                          (ins[0], wd_dev, b_arg, outs[0], I32(nb * oh), I32(h), I32(wd), I32(c), I32(oh), I32(ow),
                           I32(kh), I32(kw), I32(sh), I32(sw), I32(dh), I32(dw), I32(pads[0]), I32(pads[2]),
                           I32(bias is not None), I32(act)))
    else:
        k = mod.get_function("depthwise")

        def run(ins, outs, scratch):
            K.launch(k, total, (ins[0], wd_dev, b_arg, outs[0], I64(total), I32(h), I32(wd), I32(c), I32(oh),
                                I32(ow), I32(oc), I32(mult), I32(kh), I32(kw), I32(sh), I32(sw), I32(dh), I32(dw),
                                I32(pads[0]), I32(pads[2]), I32(bias is not None), I32(act)))

    # cuDNN: a grouped convolution with one input channel per group (KRSC = oc, kh, kw, 1)
    return _choose(ctx, be, Execution(run), False,
                   lambda: _cudnn_conv(ctx, be, np.ascontiguousarray(w.transpose(2, 0, 1)[..., None]), c, bias, act))
