"""Liveness-based planning of activation memory in one arena (MNN's simulated run, TFLite's
greedy-by-size placement).

The planner sees the execution order as a list of :class:`Step` s. A tensor is *live* from the step
that writes it (graph inputs: from step 0) to the last step that reads it; graph outputs and graph
inputs stay live to the end (a later run without new feeds reuses the inputs).
Tensors that share storage form one *buffer*:

* ``aliases`` — an output that is a view of an input (reshape) always shares its buffer;
* ``inplace`` — an element-wise output may take over an input's buffer, granted only when this
  step is the last reader of every tensor already in that buffer ("no other reader") and the
  buffer does not hold a graph input (inputs survive a run, so the next run may reuse them).

Buffers with overlapping lifetimes get disjoint byte ranges; placement takes the buffers in one order
(largest first, as TFLite's greedy-by-size, or by first use, size × lifetime, lifetime:
:data:`PLACEMENT_ORDERS`), each at the lowest 64-byte-aligned offset (or the tightest gap) that fits between
the already-placed buffers it overlaps in time, and the plan keeps the order that gives the smallest arena
(session 42: MobileNet v1 4.6 MB largest-first, 3.8 MB, its lower bound, by another order). Per-step scratch
(im2col columns, Winograd tiles) is a buffer live for one step.

:class:`MemoryPlan` reports the arena size against the naive sum of all tensors (one buffer each, no
reuse) and against the lower bound: the largest total of buffers live at the same step, which no
placement of these buffers can beat.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

ALIGN = 64


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclass
class Step:
    name: str
    reads: list[str]
    writes: list[str]
    scratch: list[int] = field(default_factory=list)  # bytes of each scratch buffer
    aliases: dict[str, str] = field(default_factory=dict)  # output -> input it is a view of
    inplace: dict[str, tuple[str, ...]] = field(default_factory=dict)  # output -> candidate inputs


@dataclass
class MemoryPlan:
    offsets: dict[str, int]  # tensor -> byte offset in the arena
    scratch_offsets: dict[tuple[str, int], int]  # (step name, index) -> offset
    arena_bytes: int
    naive_bytes: int
    lower_bound_bytes: int
    inplace: dict[str, str]  # output -> input whose buffer it took over
    num_buffers: int

    def summary(self) -> str:
        return (f"arena {self.arena_bytes:,} B (naive {self.naive_bytes:,} B, lower bound "
                f"{self.lower_bound_bytes:,} B; {self.num_buffers} buffers, {len(self.inplace)} in-place)")


#: orders in which buffers (size, start, stop, key) are placed; the plan keeps the smallest arena (the first on ties)
PLACEMENT_ORDERS = (lambda b: (-b[0], b[1]), lambda b: (b[1], -b[0]), lambda b: (-b[0] * (b[2] - b[1] + 1), b[1]),
                    lambda b: (-(b[2] - b[1]), -b[0]))


def _place(bufs: list[tuple], order, best: bool) -> tuple[int, dict]:
    """Each buffer in ``order`` at the lowest offset (``best``: the tightest gap) free for its lifetime among those
    placed before it; returns the arena's size and the offsets."""
    placed: list[tuple[int, int, int, int]] = []  # (offset, size, start, stop)
    where: dict = {}
    for size, start, stop, key in sorted(bufs, key=order):
        busy = sorted((o, sz) for o, sz, a, z in placed if a <= stop and start <= z)
        off, choice = 0, None
        for o, sz in busy:
            if o - off >= size and (not best or choice is None or o - off < choice[1]):
                choice = (off, o - off)
                if not best:
                    break
            off = max(off, o + sz)
        placed.append((choice[0] if choice else off, size, start, stop))
        where[key] = placed[-1][0]
    return max((o + sz for o, sz, _, _ in placed), default=0), where


def plan_memory(steps: list[Step], sizes: dict[str, int], inputs: list[str], outputs: list[str]) -> MemoryPlan:
    """Assign every non-constant tensor in ``sizes`` an arena offset (see the module docstring)."""
    end = len(steps)
    last = {t: 0 for t in inputs}
    first = {t: 0 for t in inputs}
    for s, st in enumerate(steps):
        for t in st.reads:
            if t in sizes:
                last[t] = s
        for t in st.writes:
            first[t] = s
            last.setdefault(t, s)
    for t in list(outputs) + list(inputs):  # inputs stay intact for the next run
        last[t] = end

    pinned = set(inputs)  # graph inputs keep their values: a run may reuse the last inputs
    buf_of: dict[str, int] = {}
    members: list[list[str]] = []
    granted: dict[str, str] = {}

    def new_buffer(t: str) -> None:
        buf_of[t] = len(members)
        members.append([t])

    for t in inputs:
        new_buffer(t)
    for s, st in enumerate(steps):
        for t in st.writes:
            src = st.aliases.get(t)
            if src is not None and src in buf_of:
                buf_of[t] = buf_of[src]
                members[buf_of[src]].append(t)
                continue
            for cand in st.inplace.get(t, ()):
                b = buf_of.get(cand)
                if (b is not None and sizes[cand] == sizes[t] and max(last[m] for m in members[b]) == s
                        and not pinned & set(members[b])):
                    buf_of[t] = b
                    members[b].append(t)
                    granted[t] = cand
                    break
            else:
                new_buffer(t)

    # buffers: (size, start, stop, key)
    bufs = []
    for b, ts in enumerate(members):
        bufs.append((_align(max(sizes[t] for t in ts)), min(first[t] for t in ts), max(last[t] for t in ts), ("t", b)))
    for s, st in enumerate(steps):
        for i, nbytes in enumerate(st.scratch):
            if nbytes:
                bufs.append((_align(nbytes), s, s, ("s", st.name, i)))

    arena, where = min((_place(bufs, order, best) for order in PLACEMENT_ORDERS for best in (False, True)),
                       key=lambda aw: aw[0])
    live_peak = 0
    for s in range(end + 1):
        live_peak = max(live_peak, sum(sz for sz, a, z, _ in bufs if a <= s <= z))
    naive = sum(_align(sizes[t]) for t in buf_of) + sum(_align(n) for st in steps for n in st.scratch if n)
    return MemoryPlan(
        offsets={t: where[("t", b)] for t, b in buf_of.items()},
        scratch_offsets={k[1:]: v for k, v in where.items() if k[0] == "s"},
        arena_bytes=arena, naive_bytes=naive, lower_bound_bytes=live_peak, inplace=granted,
        num_buffers=len(members))


@lru_cache(maxsize=1)
def _malloc_trim():
    """glibc's ``malloc_trim``, or None where the C library has none (musl, macOS, Windows)."""
    import ctypes
    import ctypes.util

    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def return_freed_heap() -> bool:
    """Give the C heap's free pages back to the operating system (glibc's ``malloc_trim``); False where there is none.

    Why: building a session makes and drops large temporaries (weights read, transposed, folded with batch
    normalisation, packed or Winograd-transformed). glibc raises its mmap threshold after the first large free, so
    later temporaries come from the heap, and freed heap pages stay in the process until trimmed: a second session
    of MobileNet v1 grew the process by 49 MiB without a trim and by 38 MiB with one (TFLite's interpreter: 39 MiB;
    ``benchmarks/bench_engine_memory.py``). A trim walks the heap once (about a millisecond) and frees nothing in use.
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def file_mapping(a: np.ndarray):
    """The ``mmap`` of a model file that array ``a`` is a view of (through any chain of views), else None."""
    import mmap

    while isinstance(a, np.ndarray) and a.base is not None:
        a = a.base
    a = a.obj if isinstance(a, memoryview) else a
    return a if isinstance(a, mmap.mmap) else None


def release_mapped_weights(constants) -> int:
    """Drop from the process the pages of a model file that ``constants`` map (a ``.leti`` or ``.tflite`` file read
    through ``mmap``: weights as views of it, never copied); the number of mappings released.

    Why: a session packs, transforms or copies every weight it runs with (GEMM panels, Winograd filters, biases), so
    after ``Session.resize`` the file's pages, all read once by packing and by the checksum, are held for nothing. On
    Linux ``MADV_DONTNEED`` on a read-only file mapping unmaps them: they stay in the page cache (shared, clean,
    reclaimable) and come back if a weight is read again (another session's packing). MNN releases its original
    weights after pre-inference for the same reason. An NB101 network (20 MiB of weights): a session's growth
    74.9 → 54.6 MiB (``benchmarks/bench_engine_memory.py``).
    """
    import mmap

    advice = getattr(mmap, "MADV_DONTNEED", None)
    if advice is None:
        return 0
    maps = {id(m): m for m in map(file_mapping, constants) if m is not None}
    for m in maps.values():
        try:
            m.madvise(advice)
        except (OSError, ValueError):  # closed, or a kernel without it: the pages simply stay
            pass
    return len(maps)


def read_once(step_inputs: list[list[str]], returned: set[str]) -> set[str]:
    """The tensors exactly one step reads and the graph does not return: what a backend may compute inside the step
    that reads it without storing it (a fusion, :meth:`CPUBackend.native_program`)."""
    reads: dict[str, int] = {}
    for inputs in step_inputs:
        for t in set(inputs):
            reads[t] = reads.get(t, 0) + 1
    return {t for t, n in reads.items() if n == 1 and t not in returned}
