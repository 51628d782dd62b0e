"""A backend that runs every op with its plain reference implementation (slow, exact).

Like nn-Meter's debug backend it tests the whole pipeline — planning, buffers, in-place reuse —
independently of the fast kernels, and it takes any op a faster backend declines.
"""

from __future__ import annotations

import numpy as np

from leti.engine import ops
from leti.engine.backends.base import BACKENDS, Backend, Execution, OpContext, Scheme


@BACKENDS.register()
class ReferenceBackend(Backend):
    name = "reference"
    takes_residual = True

    def claims(self, op: str) -> bool:
        return op in ops.OPS

    def create_execution(self, ctx: OpContext) -> Execution | None:
        op = ops.get(ctx.node.op)
        attrs = ctx.attrs
        ctx.scheme = Scheme("reference")

        def run(ins, outs, scratch):
            for dst, val in zip(outs, op.reference(list(ins), attrs)):
                np.copyto(dst, val.reshape(dst.shape))

        return Execution(run)
