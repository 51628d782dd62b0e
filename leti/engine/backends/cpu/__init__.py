"""The CPU backend: LETI's own C kernels for matrix products, windows over few channels and 3×3 depthwise
convolutions (:mod:`.ckernels`; MKL/OpenBLAS and numba where they cannot build), numba kernels (cached on
disk) for the rest (:mod:`.kernels`, :mod:`.winograd_transforms`, :mod:`.pooling`, :mod:`.dwconv`).

``threads`` sets numba's thread pool (per run: cheap). Every matrix product runs as single-threaded
calls inside that pool (see :mod:`.conv`): two thread pools on the same cores ran several times
slower. The BLAS limit is process-wide and slow to apply, so it is reference-counted: the
first backend's first run applies it, the last backend to :meth:`CPUBackend.close` restores it
(``docs/engine.md`` has the measurements). Executions register in ``executions_of("cpu")``
(:mod:`.basic`, :mod:`.conv`); one that cannot handle a configuration (weights computed at run
time, a scheme it lacks) declines, and the next backend in the session's list takes it.
"""

from __future__ import annotations

import os
import threading

# numba's OpenMP pool spins while waiting by default; on a busy or small machine a spinning thread
# steals the core its partner needs, making two threads many times slower than one. Passive waiting
# must be chosen before the pool starts (the first parallel kernel), i.e. here. A fully passive
# worker sleeps between two ops, though, and waking it cost ~21 µs per parallel region (6 µs when it
# spins) — a millisecond of MobileNet v2's ~65 steps at two threads. libgomp's GOMP_SPINCOUNT (which
# overrides the passive policy's zero) lets it spin ~0.1 ms first: through one inference's ops, then
# asleep (two threads 5-15 % faster on MobileNet v1/v2 and an NB101 network; docs/engine.md).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("GOMP_SPINCOUNT", "10000")

import numba  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

from leti.engine.backends.base import BACKENDS, Backend, executions_of  # noqa: E402
from leti.engine.backends.cpu import basic, conv, elementwise  # noqa: E402,F401  (they register the executions)
from leti.engine.backends.cpu import ckernels, native  # noqa: E402
from leti.engine.ops._common import pair  # noqa: E402

_blas_lock = threading.Lock()
_blas_users = 0
_blas_limit = None


def _acquire_blas_limit() -> None:
    global _blas_users, _blas_limit
    with _blas_lock:
        if _blas_users == 0:
            _blas_limit = threadpool_limits(limits=1, user_api="blas")
        _blas_users += 1


def _release_blas_limit() -> None:
    global _blas_users, _blas_limit
    with _blas_lock:
        _blas_users -= 1
        if _blas_users == 0 and _blas_limit is not None:
            _blas_limit.restore_original_limits()
            _blas_limit = None


def blas_limit_users() -> int:
    """How many CPU backends currently hold the single-thread BLAS limit."""
    return _blas_users


@BACKENDS.register()
class CPUBackend(Backend):
    name = "cpu"
    executions = executions_of("cpu")
    takes_residual = True

    def __init__(self, threads: int | None = None, **options):
        super().__init__(threads, **options)
        self._holds_blas = False

    def begin_run(self) -> None:
        if self.threads:
            numba.set_num_threads(self._threads())
        if not self._holds_blas:
            _acquire_blas_limit()
            self._holds_blas = True

    def native_program(self, steps, sole_reader: set[str] | None = None):
        """One callable for a run of steps whose executions describe themselves as C-kernel records (:mod:`.native`),
        or None to run them one by one: with ``native=False``, without LETI's C kernels, or where the library was
        built without OpenMP and the steps would lose their threads. ``sole_reader``: the tensors that one step alone
        reads (and the graph does not return); a 1×1 convolution whose output is one of them and which a 3×3 depthwise
        convolution reads runs fused with it (:func:`.native.fuse_products_into_depthwise`; ``fuse=False`` not)."""
        if not self.options.get("native", True):
            return None
        runner = ckernels.program_runner()
        if runner is None or not runner[1]:
            return None
        records, owners = [], []
        try:
            for st in steps:
                if not st.execution.alias:
                    mine = st.execution.native(st.in_views, st.out_views, st.scratch_views)
                    records.extend(mine)
                    owners.extend([st] * len(mine))
        except ValueError:  # an operand the kernels cannot read in place (a strided constant): step by step
            return None
        if sole_reader and self.options.get("fuse", True):
            records, owners = native.fuse_products_into_depthwise(records, owners, sole_reader, self._threads())
        return native.Program(records, runner[0], owners) if records else None

    def fusion(self, prev, st, sole_reader: set[str], nbytes: dict[str, int]) -> tuple[list[str], list[str]]:
        """What the memory plan must know where step ``prev`` may run fused into ``st`` (see :meth:`native_program`):
        the tensors to keep alive through ``st`` (a 1×1 convolution's input, read band by band while the depthwise
        convolution writes; without it the plan may give the depthwise output the input's space, and the pair cannot
        fuse) and the tensors the pair never stores (the product's output, computed band by band into a thread's
        buffer). The session keeps the latter out of the arena (``Session._bind``): MobileNet v1's arena 6.2 → 3.8 MB."""
        if (not self.options.get("fuse", True) or prev.backend is not self or st.backend is not self
                or st.op != "depthwise_conv2d" or prev.op != "conv2d" or not prev.inputs
                or prev.outputs[0] != st.inputs[0] or st.inputs[0] not in sole_reader
                or nbytes.get(st.inputs[0], 0) < native.FUSE_MIN_BYTES or not self._fusible(prev, st)
                or not native.fuse_pays(st.ctx.in_shapes[0][1], self._threads(), prev.ctx.in_shapes[0][-1])):
            return [], []
        return [prev.inputs[0]], [prev.outputs[0]]

    def _threads(self) -> int:
        """The threads this backend's programs run on (numba's pool where it was given none)."""
        return min(self.threads, numba.config.NUMBA_NUM_THREADS) if self.threads else numba.config.NUMBA_NUM_THREADS

    @staticmethod
    def _fusible(prev, st) -> bool:
        """Whether the pair's native records are the ones native.fuse_products_into_depthwise fuses: one product (a
        1×1 convolution's ``gemm`` scheme, no residual, one image) and one 3×3 depthwise convolution of multiplier 1
        and dilation 1 (csrc/dwconv.c) over its output."""
        if ckernels.library() is None or prev.scheme is None or st.ctx is None or prev.ctx is None:
            return False
        w = st.ctx.constants.get(1)
        return (prev.scheme.name == "gemm" and not prev.scheme.params.get("depth") and len(prev.inputs) <= 3
                and prev.ctx.in_shapes[0][0] == 1 and w is not None and tuple(w.shape[:2]) == (3, 3)
                and int(st.ctx.attrs.get("multiplier", 1)) == 1 and tuple(pair(st.ctx.attrs.get("dilations"), 1)) == (1, 1))

    def close(self) -> None:
        """Give up this backend's hold on the BLAS limit (restored when no CPU backend holds it)."""
        if self._holds_blas:
            self._holds_blas = False
            _release_blas_limit()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
