"""The backend abstraction (MNN's ``Backend``): executions for ops, buffers, copies.

A backend is asked, op by op, to :meth:`Backend.create_execution` for a node whose shapes, scheme
and constant inputs are fixed (pre-inference). It returns an :class:`Execution` — a callable that
only computes — or ``None`` to decline, and the session then asks the next backend. Buffers come
from :meth:`Backend.acquire` (one arena per memory domain, planned by :mod:`leti.engine.memory`);
tensors that cross from one memory domain to another are moved with :meth:`Backend.copy_in`.
Ops never know which backend runs them, so a CUDA backend plugs in without touching op modules.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from leti.engine.graph import Node
from leti.engine.scheme import Scheme
from leti.errors import ConversionError
from leti.registry import Registry

ALIGN = 64

#: The precisions a backend may compute in (``Session(precision=...)``); host backends run ``fp32``
#: only, the CUDA backend all of them (``leti.engine.backends.cuda.precision``).
PRECISIONS = ("fp32", "tf32", "fp16", "bf16")


def aligned(raw: np.ndarray, nbytes: int) -> np.ndarray:
    """The first ``nbytes`` of ``raw`` (``nbytes + ALIGN`` bytes) that start on an ``ALIGN`` boundary."""
    start = (-raw.ctypes.data) % ALIGN
    return raw[start: start + nbytes]


def pinned_allocator(backends):
    """``pinned_host(nbytes)`` of the first backend that offers page-locked host memory, else None."""
    return next((b.pinned_host for b in backends if hasattr(b, "pinned_host")), None)


@dataclass
class OpContext:
    """Everything fixed at pre-inference that an execution may specialise on."""

    node: Node
    in_shapes: list[tuple[int, ...]]
    out_shapes: list[tuple[int, ...]]
    constants: dict[int, np.ndarray]  # input index -> constant value
    scheme: Scheme
    dtypes: list[str] = field(default_factory=list)  # input dtypes

    @property
    def attrs(self) -> dict:
        return self.node.attrs


class Execution:
    """A prepared op: ``run(inputs, outputs, scratch)`` writes into the given output arrays."""

    def __init__(self, fn: Callable, scratch: tuple[int, ...] = (), alias: bool = False,
                 native: Callable | None = None):
        self.fn = fn
        self.scratch = tuple(scratch)  # bytes of each scratch buffer it needs
        self.alias = alias  # output is a view of input 0 (no work at run time)
        #: ``native(inputs, outputs, scratch)`` → the same work as records of a native program (CPU: backends/cpu/native.py)
        self.native = native

    def run(self, inputs: list[np.ndarray], outputs: list[np.ndarray], scratch: list[np.ndarray]) -> None:
        self.fn(inputs, outputs, scratch)


#: What every backend's execution factory is: ``factory(ctx, backend)`` -> an Execution, or None to decline.
ExecutionFactory = Callable[[OpContext, "Backend"], "Execution | None"]

_EXECUTIONS: dict[str, Registry] = {}


def executions_of(backend: str) -> Registry:
    """The registry of ``backend``'s executions, by op name. A kernel module joins with
    ``EXECUTIONS = executions_of("cpu")`` and ``@EXECUTIONS.register("conv2d")`` on a factory."""
    return _EXECUTIONS.setdefault(backend, Registry(f"{backend} execution", error=ConversionError))


class Backend:
    """Base class; subclasses register in :data:`BACKENDS` (``@BACKENDS.register()``).

    ``executions`` is the backend's registry of execution factories (:func:`executions_of`); the
    default :meth:`create_execution` asks it for float32 ops and declines everything else."""

    name = "base"
    memory_domain = "host"
    executions: Registry | None = None
    precision = "fp32"
    #: whether its conv2d executions take a fused residual (input 3, :func:`leti.engine.passes.fuse_residual_adds`)
    takes_residual = False

    def __init__(self, threads: int | None = None, **options):
        self.threads = threads
        self.options = options

    def claims(self, op: str) -> bool:
        """Whether this backend has an execution for ``op`` (it may still decline a configuration)."""
        return self.executions is not None and op in self.executions

    def create_execution(self, ctx: OpContext) -> Execution | None:
        """The execution of ``ctx.node``, or ``None`` when this backend cannot run it."""
        if not self.claims(ctx.node.op) or any(d != "float32" for d in ctx.dtypes):
            return None
        return self.executions.get(ctx.node.op)(ctx, self)

    def acquire(self, nbytes: int) -> np.ndarray:
        """A fresh buffer of ``nbytes`` (64-byte aligned) in this backend's memory."""
        return aligned(np.empty(nbytes + ALIGN, dtype=np.uint8), nbytes)

    def release(self, buffer) -> None:
        """Give a buffer back (host memory is garbage-collected; device backends free here)."""

    def storage_dtype(self, dtype) -> np.dtype:
        """What a tensor of ``dtype`` is stored as in this backend's memory (a 16-bit precision
        of a device backend stores float32 tensors in 16 bits; host backends store them as they are)."""
        return np.dtype(dtype)

    def view(self, buffer, offset: int, shape, dtype) -> np.ndarray:
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        return buffer[offset: offset + nbytes].view(dtype).reshape(shape)

    def copy_in(self, src: np.ndarray, src_backend: Backend, dst: np.ndarray) -> None:
        """Copy a tensor held by ``src_backend`` into ``dst`` (held by this backend). A device
        backend with ``copy_out(src, host_dst)`` writes straight into ``dst`` (no temporary)."""
        copy_out = getattr(src_backend, "copy_out", None)
        if copy_out is not None and src_backend is not self:
            copy_out(src, dst)
        else:
            np.copyto(dst, src_backend.to_host(src))

    def to_host(self, array) -> np.ndarray:
        return array

    def begin_run(self) -> None:
        """Called before each run (thread settings, stream set-up)."""

    def end_run(self) -> None:
        """Called after each run (synchronisation)."""

    def synchronize(self) -> None:
        """Wait until the work submitted so far is done (host backends: nothing to wait for)."""

    @property
    def cost_key(self) -> str:
        """Identifies this backend *and* its settings for cost models (``cpu:t2``, ``cuda``)."""
        return f"{self.name}:t{self.threads}" if self.threads else self.name


class HostBackend(Backend):
    """Host memory that runs no op: it owns graph inputs and the host copies of outputs when no
    host backend is in the session's list (a CUDA-only session)."""

    name = "host"

    def create_execution(self, ctx: OpContext) -> Execution | None:
        return None


#: Backend classes by name; a backend's module is imported on first use, so optional backends cost nothing.
BACKENDS: Registry[type[Backend]] = Registry("backend", error=ConversionError, lazy={
    "cpu": "leti.engine.backends.cpu", "reference": "leti.engine.backends.reference",
    "cuda": "leti.engine.backends.cuda"})


def get_backend(name: str, **options) -> Backend:
    """A backend by registry name; ``"cpu:2"`` is the CPU backend with 2 threads (any ``name:N``
    sets ``threads=N``). Backend instances pass through unchanged."""
    if isinstance(name, Backend):
        return name
    if ":" in name:
        name, _, threads = name.partition(":")
        try:
            options = {**options, "threads": int(threads)}
        except ValueError:
            raise ConversionError(f"bad backend {name}:{threads!r}; use NAME or NAME:THREADS") from None
    if name not in BACKENDS:
        raise ConversionError(f"unknown backend {name!r}; available: {', '.join(BACKENDS.names())}")
    return BACKENDS.get(name)(**options)
