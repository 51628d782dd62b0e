"""The CPU backend: NumPy/BLAS for matrix products, numba kernels (cached on disk) for the rest.

``threads`` sets numba's thread pool (per run: cheap). Every matrix product runs as single-threaded
BLAS calls inside that pool (see :mod:`.conv`), so BLAS itself is limited to one thread: with two
pools on the same cores (OpenBLAS threads spinning after each product while numba's threads need
the cores, and the reverse), two threads ran several times slower than one on a loaded 2-core
machine. The BLAS limit is
process-wide and costs milliseconds to apply, so it is applied on the first run and kept until
:meth:`CPUBackend.close` (or the backend is garbage-collected).
An op whose execution needs something this backend does not handle (weights computed at run time,
a scheme it lacks) is declined, so the next backend in the session's list takes it.
"""

from __future__ import annotations

import os

# numba's OpenMP pool spins while waiting by default; on a busy or small machine a spinning thread
# steals the core its partner needs, making two threads many times slower than one. Passive waiting
# must be chosen before the pool starts (the first parallel kernel), i.e. here.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numba  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

from leti.engine.backends.base import Backend, Execution, OpContext  # noqa: E402
from leti.engine.backends.cpu import basic, conv  # noqa: E402

FACTORIES = {"conv2d": conv.conv2d, "depthwise_conv2d": conv.depthwise_conv2d, **basic.FACTORIES}


class CPUBackend(Backend):
    name = "cpu"

    def __init__(self, threads: int | None = None, **options):
        super().__init__(threads, **options)
        self._limits = None

    def create_execution(self, ctx: OpContext) -> Execution | None:
        factory = FACTORIES.get(ctx.node.op)
        if factory is None or any(d != "float32" for d in ctx.dtypes):
            return None
        return factory(ctx)

    def begin_run(self) -> None:
        if self.threads:
            numba.set_num_threads(min(self.threads, numba.config.NUMBA_NUM_THREADS))
        if self._limits is None:
            self._limits = threadpool_limits(limits=1, user_api="blas")

    def close(self) -> None:
        """Restore the BLAS thread count this backend changed."""
        if self._limits is not None:
            self._limits.restore_original_limits()
            self._limits = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
