"""Runs of C-kernel steps executed as one native program (``csrc/program.c``).

An execution whose work is calls of LETI's C kernels (:mod:`.ckernels`) describes them as records
(``Execution.native(inputs, outputs, scratch)`` → a list of records); once a session's buffers are bound, the CPU
backend turns each run of consecutive such steps into one :class:`Program`: one ctypes call per run of steps
instead of a numba dispatch and a parallel region per step, the threads started once and a barrier between steps.
A record is the step's kind and the kernel's arguments, pointers as integers, so the arrays it points into (the
session's arena, the packed weights) must outlive the program: the session holds them.
"""

from __future__ import annotations

import numba
import numpy as np

from leti.engine.backends.cpu.gemm import window_reads_padding

#: int64 fields per record (``RECORD`` in program.c)
RECORD = 20
(GEMM, DWCONV, PAD, WINDOW, MEAN, SOFTMAX, GEMV, IM2COL, POOL, COPY_CHANNELS, WINOGRAD_IN, WINOGRAD_PRODUCTS,
 WINOGRAD_OUT, UNARY, BINARY, DWCONV_K, SWAP_LAST_TWO, WINDOW_IN_PLACE, GEMM_DWCONV) = range(1, 20)
#: the least bytes of a 1×1 convolution's output for :func:`fuse_products_into_depthwise` to fuse it with the depthwise
#: convolution that reads it: what fits the core's L2 gains nothing from bands
FUSE_MIN_BYTES = 512 * 1024
#: the least input rows of the depthwise convolution for a pair to fuse on more than one thread. Why: a fused step splits
#: its rows in one part per thread, each computing the product rows it shares with the next (2 of 28 at stride 1), and
#: its parts cannot be stolen; two threads, ``bench_layer_chains`` models of one pair each, fused against unfused in
#: one process (blocks of 10 runs, alternating; Zen 5, session 45): 28 × 28 × 128 → 256 then 3×3 1.05× the unfused time,
#: 28 × 28 × 256 → 256 then 3×3 / 2 1.06×, 56 × 56 and 112 × 112 pairs 0.99-1.01× (one thread: alike)
FUSE_MIN_ROWS_THREADED = 56
#: from this many input rows any pair fuses on more than one thread; below it (from FUSE_MIN_ROWS_THREADED) only a
#: product of at most FUSE_MAX_K_THREADED inner products, whose shared rows cost little to compute twice. Why: on a Zen 3
#: (AVX2, 512 KiB of L2; session 46), two threads, paired in the network (80 rounds, twice): MobileNet v1 with its 56 × 56
#: pairs (k = 64, 128) apart 0.993-0.998× the time (0.966 in a slow hour of the VM), MobileNet v2 with its (k = 24)
#: fused 0.994×
FUSE_WIDE_ROWS_THREADED = 112
FUSE_MAX_K_THREADED = 32
#: the unary kinds of ``leti_unary`` (``csrc/pointwise.c``); 1 and 2 are also the fused activations' codes
UNARY_CODE = {"relu": 1, "relu6": 2, "sigmoid": 3, "hard_swish": 4, "hard_sigmoid": 5}


def _addr(a: np.ndarray | None) -> int:
    """The address of ``a``'s first element (0 for None); a kernel reads it as C-ordered float32."""
    if a is None:
        return 0
    if a.dtype != np.float32 or not a.flags.c_contiguous:
        raise ValueError(f"a native step needs C-contiguous float32, got {a.dtype} with strides {a.strides}")
    return a.ctypes.data


def _ld(a: np.ndarray) -> int:
    """The row stride in floats of a matrix whose rows are contiguous."""
    if a.ndim != 2 or a.strides[1] != 4:
        raise ValueError(f"a native step needs rows of contiguous float32, got strides {a.strides}")
    return a.strides[0] // 4


def gemm(a, bp, y, bias, has_bias: bool, act: int, res=None) -> list[list[int]]:
    """``y = act(a @ B + bias [+ res])``: ``a`` (m × k), ``y`` and ``res`` (m × n), ``bp`` packed (:func:`ckernels.pack`)."""
    m, k = a.shape
    n = y.shape[1]
    return [[GEMM, m, n, k, _addr(a), _ld(a), _addr(bp), _addr(y), _ld(y), _addr(bias) if has_bias else 0,
             _addr(res), act]]


def dwconv3x3(x, w9, bias, has_bias: bool, y, sh, sw, dh, dw, pt, pl, act) -> list[list[int]]:
    """The 3×3 depthwise convolution of ``x`` (N, H, W, C) into ``y`` (N, OH, OW, C), ``w9`` as
    :func:`ckernels.dw3x3_weights` lays it out."""
    nb, h, wd, c = x.shape
    _, oh, ow, _ = y.shape
    return [[DWCONV, _addr(x), _addr(y), _addr(w9), _addr(bias) if has_bias else 0, h, wd, c, oh, ow, sh, sw, dh, dw,
             pt, pl, act, nb * oh]]


def conv_window(x, xp, bp, y, bias, has_bias: bool, res, groups, kh, kw, sh, sw, pt, pl, act) -> list[list[int]]:
    """A window over few channels or a grouped convolution (as :func:`gemm.conv_window_leti`): per image, the window's
    rows over the input in place, or, where the window reads padding and ``xp`` is not empty, the zero-padded copy into
    ``xp`` first."""
    nb, h, wd, c = x.shape
    oh, ow, n = y.shape[1], y.shape[2], y.shape[3]
    hp, wp = (oh - 1) * sh + kh, (ow - 1) * sw + kw
    padded = window_reads_padding.py_func(h, wd, oh, ow, kh, kw, sh, sw, pt, pl)  # not numba's: see its docstring
    out = []
    for b in range(nb):
        xb = _addr(x) + b * h * wd * c * 4
        src, row = xb, wd
        yb, rb = _addr(y) + b * oh * ow * n * 4, _addr(res) + b * oh * ow * n * 4 if res is not None else 0
        if padded and xp.size == 0:
            out.append([WINDOW_IN_PLACE, xb, h, wd, c // groups, groups, kh, kw, sh, sw, pt, pl, _addr(bp), n // groups,
                        yb, ow, _addr(bias) if has_bias else 0, rb, act, oh])
            continue
        if padded:
            src, row = _addr(xp), wp
            out.append([PAD, xb, h, wd, c, src, hp, wp, pt, pl])
        out.append([WINDOW, src, row, c // groups, groups, kh, kw, sh, sw, _addr(bp), n // groups, yb, ow,
                    _addr(bias) if has_bias else 0, rb, act, oh])
    return out


def im2col(x, col, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow) -> list[list[int]]:
    """The column matrix ``col`` (N·OH·OW × kh·kw·C) of a sliding window over ``x`` (N, H, W, C), as
    :func:`kernels.im2col`."""
    nb, h, wd, c = x.shape
    return [[IM2COL, _addr(x), _addr(col), h, wd, c, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, nb * oh]]


def pool2d(x, y, kh, kw, sh, sw, pt, pl, is_max: bool, act: int) -> list[list[int]]:
    """Max or average pooling of ``x`` (N, H, W, C) into ``y`` (N, OH, OW, C), averages over the taps inside."""
    nb, h, w, c = x.shape
    _, oh, ow, _ = y.shape
    return [[POOL, _addr(x), _addr(y), h, w, c, oh, ow, kh, kw, sh, sw, pt, pl, int(is_max), act, nb * oh]]


def add(a, b, y, act: int) -> list[list[int]]:
    """``y = act(a + b)``, all three of one shape (:func:`binary`'s same-shape sum)."""
    return binary(a, b, y, None, 0, False, act)


def concat_channels(xs, y) -> list[list[int]]:
    """``y`` (…, C) = the inputs (…, Cᵢ) side by side along the last axis: a record per input."""
    out, off, px, c = [], 0, y.size // y.shape[-1], y.shape[-1]
    for x in xs:
        out.append([COPY_CHANNELS, _addr(x), _addr(y) + 4 * off, px, x.shape[-1], x.shape[-1], c])
        off += x.shape[-1]
    return out


def slice_channels(x, y, begin: int) -> list[list[int]]:
    """``y`` (…, n) = channels ``begin .. begin + n`` of ``x`` (…, C)."""
    px, n = y.size // y.shape[-1], y.shape[-1]
    return [[COPY_CHANNELS, _addr(x) + 4 * begin, _addr(y), px, n, x.shape[-1], n]]


def _f32_bits(v: float) -> int:
    return int(np.array(v, np.float32).view(np.int32))


def unary(x, y, op: str, alpha: float = 0.0, beta: float = 0.0) -> list[list[int]]:
    """``y = op(x)`` element by element (``UNARY_CODE``), ``y`` may be ``x``."""
    return [[UNARY, _addr(x), _addr(y), y.size, UNARY_CODE[op], _f32_bits(alpha), _f32_bits(beta)]]


def binary(a, b, y, shift, mode: int, product: bool, act: int, bstride: int = 0) -> list[list[int]]:
    """``y = act(a ∘ b [+ shift])`` (∘ a product or a sum), ``a`` and ``y`` (N, …, C); ``b`` of ``a``'s shape
    (``mode`` 0), a C-vector per image ``bstride`` floats apart (1; 0: one for all) or a scalar (2); ``shift`` None or
    a C-vector."""
    c = y.shape[-1] if y.ndim else 1
    pixels = y.size // c
    px = pixels // (y.shape[0] if y.ndim > 1 else 1)
    return [[BINARY, _addr(a), _addr(b), _addr(y), _addr(shift), pixels, px, c, bstride, mode, int(product), act]]


def dwconv(x, w, bias, has_bias: bool, y, sh, sw, dh, dw, pt, pl, act) -> list[list[int]]:
    """A depthwise convolution (multiplier 1) of any window, ``w`` (kh, kw, C) contiguous."""
    nb, h, wd, c = x.shape
    _, oh, ow, _ = y.shape
    kh, kw = w.shape[:2]
    return [[DWCONV_K, _addr(x), _addr(y), _addr(w), _addr(bias) if has_bias else 0, h, wd, c, oh, ow, kh, kw, sh, sw,
             dh, dw, pt, pl, act, nb * oh]]


def swap_last_two(x3, y3) -> list[list[int]]:
    """``y3`` (L, Q, P) = ``x3`` (L, P, Q) with its last two axes swapped."""
    lead, p, q = x3.shape
    return [[SWAP_LAST_TWO, _addr(x3), _addr(y3), lead, p, q]]


def winograd(x, bt, v, up, m, at, y, bias, has_bias: bool, act: int, n: int, pt, pl, th, tw, r0) -> list[list[int]]:
    """One block of Winograd tiles (``v``: α² × cnt × C, ``m``: α² × cnt × OC, tiles ``r0 ..`` of the batch): the
    input transform, the α² products against the packed transformed filters ``up`` (P, panels, C, 16), the output
    transform with the bias and activation. ``bt`` = Bᵀ (α × α), ``at`` = Aᵀ (n × α)."""
    nb, h, w, c = x.shape
    positions, cnt, _ = v.shape
    alpha = bt.shape[0]
    oh, ow, oc = y.shape[1], y.shape[2], y.shape[3]
    return [[WINOGRAD_IN, _addr(x), _addr(bt), _addr(v), n, pt, pl, th, tw, alpha, h, w, c, r0, cnt],
            [WINOGRAD_PRODUCTS, _addr(v), _addr(up), _addr(m), positions, cnt, c, oc],
            [WINOGRAD_OUT, _addr(m), _addr(at), _addr(y), _addr(bias) if has_bias else 0, act, n, alpha, th, tw, oh, ow,
             oc, r0, cnt]]


def pad_nhwc(x, y, pt: int, pl: int) -> list[list[int]]:
    """``y`` (N, HP, WP, C) = ``x`` (N, H, W, C) placed at ``(pt, pl)``, zeros around it: a record per image."""
    nb, h, wd, c = x.shape
    _, hp, wp, _ = y.shape
    return [[PAD, _addr(x) + b * h * wd * c * 4, h, wd, c, _addr(y) + b * hp * wp * c * 4, hp, wp, pt, pl]
            for b in range(nb)]


def spatial_mean(x3, y2) -> list[list[int]]:
    """Global average pooling: ``y2[b, c]`` = the mean of ``x3[b, :, c]`` (N, H·W, C)."""
    nb, p, c = x3.shape
    return [[MEAN, _addr(x3), _addr(y2), nb, p, c]]


def softmax_rows(x2, beta: float, y2) -> list[list[int]]:
    """``y2[r] = softmax(beta · x2[r])``."""
    rows, c = x2.shape
    return [[SOFTMAX, _addr(x2), _addr(y2), rows, c, _f32_bits(beta)]]


def gemv(x, wp, y, bias, has_bias: bool, act: int) -> list[list[int]]:
    """``y = act(x @ w + bias)``: a fully connected layer at batch 1, ``wp`` the weights packed as the products'
    (``ckernels.pack``: panels of k × 16 outputs), ``y`` its n outputs."""
    k, n = wp.shape[1], y.shape[0]
    return [[GEMV, _addr(x), _addr(wp), _addr(y), _addr(bias) if has_bias else 0, k, n, act]]


def fuse_pays(rows: int, threads: int, k: int) -> bool:
    """Whether a product of ``k`` inner products and the 3×3 depthwise convolution over its ``rows`` rows fuse on
    ``threads`` threads."""
    return threads <= 1 or rows >= FUSE_WIDE_ROWS_THREADED or (rows >= FUSE_MIN_ROWS_THREADED
                                                                and k <= FUSE_MAX_K_THREADED)


def fuse_products_into_depthwise(records: list[list[int]], owners: list, sole_reader: set[str],
                                 threads: int = 1) -> tuple[list[list[int]], list]:
    """Each product record (a 1×1 convolution) followed by the 3×3 depthwise record that reads its output, where that
    output is read by nothing else (``sole_reader``: the tensors one step alone reads and the graph does not return),
    holds at least :data:`FUSE_MIN_BYTES` and the depthwise output does not overlap the product's input, becomes one
    ``GEMM_DWCONV`` record (``csrc/program.c``): the product's rows computed band by band just before the depthwise
    convolution reads them, in the core's L2. The fused record's owner is the depthwise step (the product's step then
    has no record: a step clock gives it no time of its own). Returns the new records and owners."""
    out, own, i = [], [], 0
    while i < len(records):
        r = records[i]
        if i + 1 < len(records) and r[0] == GEMM and records[i + 1][0] == DWCONV and owners[i] is not None \
                and owners[i + 1] is not None and owners[i] is not owners[i + 1]:
            d = records[i + 1]
            m, n, k, a, lda, bp, y, ldy, bias, res, act = r[1:12]
            x, yd, w9, dbias, h, wd, c, oh, ow, sh, sw, dh, dw, pt, pl, dact, rows = d[1:18]
            ok = (y == x and ldy == n == c and not res and rows == oh and m == h * wd and dh == dw == 1
                  and m * n * 4 >= FUSE_MIN_BYTES and fuse_pays(h, threads, k) and len(owners[i].outputs) == 1
                  and owners[i].outputs[0] in sole_reader and owners[i + 1].inputs[0] == owners[i].outputs[0]
                  and (yd + oh * ow * c * 4 <= a or a + m * lda * 4 <= yd))
            if ok:
                out.append([GEMM_DWCONV, a, lda, k, bp, c, bias, act, w9, dbias, h, wd, oh, ow, sh, sw, pt, pl, dact,
                            yd])
                own.append(owners[i + 1])
                i += 2
                continue
        out.append(r)
        own.append(owners[i])
        i += 1
    return out, own


class Program:
    """The records of a run of steps, run by ``leti_run_program`` on numba's current thread count; ``owners``: for each
    record, the step it belongs to (what :meth:`clocked` reports times of)."""

    def __init__(self, records: list[list[int]], runner, owners: list | None = None):
        table = np.zeros((len(records), RECORD), np.int64)
        for i, r in enumerate(records):
            table[i, :len(r)] = r
        self.table, self.steps = table, len(records)
        self.owners = list(owners) if owners is not None else [None] * len(records)
        self._run, self._addr = runner, table.ctypes.data
        self._clock = np.zeros(len(records) + 1, np.int64)

    def __call__(self) -> None:
        self._run(self._addr, self.steps, numba.get_num_threads())

    def clocked(self) -> np.ndarray:
        """Run once with the step clock set (``leti_set_step_clock``): each record's seconds inside the run, its load
        imbalance and barrier included."""
        from leti.engine.backends.cpu.ckernels import step_clock_setter

        setter = step_clock_setter()
        setter(self._clock.ctypes.data)
        try:
            self()
        finally:
            setter(None)
        return np.diff(self._clock) * 1e-9
