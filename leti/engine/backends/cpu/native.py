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
GEMM, DWCONV, PAD, WINDOW = 1, 2, 3, 4


def _addr(a: np.ndarray | None) -> int:
    return 0 if a is None else a.ctypes.data


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
    """The 3×3 depthwise convolution of ``x`` (N, H, W, C) into ``y`` (N, OH, OW, C), ``w9`` (9, C)."""
    nb, h, wd, c = x.shape
    _, oh, ow, _ = y.shape
    return [[DWCONV, _addr(x), _addr(y), _addr(w9), _addr(bias) if has_bias else 0, h, wd, c, oh, ow, sh, sw, dh, dw,
             pt, pl, act, nb * oh]]


def conv_window(x, xp, bp, y, bias, has_bias: bool, res, groups, kh, kw, sh, sw, pt, pl, act) -> list[list[int]]:
    """A window over few channels or a grouped convolution (as :func:`gemm.conv_window_leti`): per image, the
    zero-padded copy into ``xp`` (when the window reads padding), then the window's rows."""
    nb, h, wd, c = x.shape
    oh, ow, n = y.shape[1], y.shape[2], y.shape[3]
    hp, wp = (oh - 1) * sh + kh, (ow - 1) * sw + kw
    padded = window_reads_padding(h, wd, oh, ow, kh, kw, sh, sw, pt, pl)
    out = []
    for b in range(nb):
        xb = _addr(x) + b * h * wd * c * 4
        src, row = xb, wd
        if padded:
            src, row = _addr(xp), wp
            out.append([PAD, xb, h, wd, c, src, hp, wp, pt, pl])
        out.append([WINDOW, src, row, c // groups, groups, kh, kw, sh, sw, _addr(bp), n // groups,
                    _addr(y) + b * oh * ow * n * 4, ow, _addr(bias) if has_bias else 0,
                    _addr(res) + b * oh * ow * n * 4 if res is not None else 0, act, oh])
    return out


class Program:
    """The records of a run of steps, run by ``leti_run_program`` on numba's current thread count."""

    def __init__(self, records: list[list[int]], runner):
        table = np.zeros((len(records), RECORD), np.int64)
        for i, r in enumerate(records):
            table[i, :len(r)] = r
        self.table, self.steps = table, len(records)
        self._run, self._addr = runner, table.ctypes.data

    def __call__(self) -> None:
        self._run(self._addr, self.steps, numba.get_num_threads())
