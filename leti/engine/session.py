"""Session: MNN's split of pre-inference and execution.

``Session(model).resize()`` runs once: graph passes, shape inference, a scheme per op, a backend per
op (the first in the list whose ``create_execution`` accepts it), copies where a tensor crosses
memory domains, the memory plan, and binding of every execution to views of one arena per domain.
``Session.run()`` then only copies the inputs in, calls the bound executions and copies the outputs
out.

    >>> s = Session("model.leti", threads=1).resize()
    >>> y = s.run({"input": x})["dense"]
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace

import numpy as np

from leti.engine import format as fmt
from leti.engine import ops, passes
from leti.engine.backends.base import (PRECISIONS, Backend, Execution, HostBackend, OpContext, Scheme, get_backend,
                                       pinned_allocator)
from leti.engine.graph import Graph
from leti.engine.memory import MemoryPlan, Step, plan_memory, read_once, release_mapped_weights, return_freed_heap
from leti.engine.schedule import ScheduleOptions, choose_scheme
from leti.errors import ConversionError


@dataclass
class BoundStep:
    """One executable step: a node (or a cross-domain copy) bound to its buffers."""

    name: str
    op: str
    backend: Backend
    scheme: Scheme
    execution: Execution | None
    inputs: list[str]
    outputs: list[str]
    in_views: list[np.ndarray] = field(default_factory=list)
    out_views: list[np.ndarray] = field(default_factory=list)
    scratch_views: list[np.ndarray] = field(default_factory=list)
    copy_from: Backend | None = None
    ctx: OpContext | None = None  # the context the execution was created for (cost models read it)
    io: bool = False  # a copy of a graph input in, or of a graph output back to the host

    def __call__(self) -> None:
        if self.copy_from is not None:
            self.backend.copy_in(self.in_views[0], self.copy_from, self.out_views[0])
        elif not self.execution.alias:
            self.execution.run(self.in_views, self.out_views, self.scratch_views)


class Session:
    """Prepare a model once, run it many times. ``model`` is a :class:`Graph` or a ``.leti`` path.

    ``backends`` are tried in order for every op (names, ``"cpu:2"`` for a thread count, or
    instances); ``threads`` goes to each backend named without one; ``optimize`` runs
    :func:`leti.engine.passes.optimize`; other keyword arguments are :class:`ScheduleOptions`
    (``winograd_max_tile``, ``strassen_min_dim``, ``conv_scheme``).

    With a ``cost_model`` (:mod:`leti.engine.cost`) ``resize()`` plans a backend per op that
    minimises the predicted latency including transfers (:mod:`leti.engine.hybrid`; the plan is
    ``self.plan``); a backend that declines an op hands it to the next one in the list (MNN's
    fallback). ``graphs`` lets backends that can (CUDA) capture each run of consecutive steps as
    one replayable graph in ``resize()``; ``run()`` then replays it. ``precision`` (``fp32``,
    ``tf32``, ``fp16``, ``bf16``) goes to every backend named in ``backends`` (instances keep their
    own); host backends stay FP32, so a precision other than ``fp32`` needs a backend that runs it (CUDA).
    """

    def __init__(self, model: Graph | str | os.PathLike, backends=("cpu", "reference"), threads: int | None = None,
                 optimize: bool = True, cost_model=None, graphs: bool = True, precision: str | None = None,
                 **schedule_options):
        graph = model if isinstance(model, Graph) else fmt.load(model)
        for n in graph.nodes:
            ops.get(n.op)  # unsupported ops fail here, listing the known ones
        self.source = graph
        self.pass_report: dict[str, int] = {}
        self.options = ScheduleOptions(**schedule_options)
        if precision is not None and precision not in PRECISIONS:
            raise ConversionError(f"unknown precision {precision!r}; known: {', '.join(PRECISIONS)}")
        extra = {"precision": precision} if precision not in (None, "fp32") else {}
        self.backends = [get_backend(b, threads=threads, **extra) for b in backends]
        if not self.backends:
            raise ConversionError("a session needs at least one backend")
        if optimize:
            graph, self.pass_report = passes.optimize(graph)
            if all(b.takes_residual for b in self.backends):  # every backend adds a shortcut in its conv
                graph, self.pass_report["fuse_residual_adds"] = passes.fuse_residual_adds(graph)
        self.graph = graph
        if extra and not any(b.precision == precision for b in self.backends):
            raise ConversionError(f"precision {precision!r} needs a backend that computes in it (cuda); this "
                                  f"session's backends ({', '.join(b.name for b in self.backends)}) run fp32 only")
        self.precision = precision or "fp32"
        self.host = next((b for b in self.backends if b.memory_domain == "host"), None) or HostBackend()
        self.cost_model = cost_model
        if hasattr(cost_model, "attach"):
            cost_model.attach(calibration_session)  # cost models calibrate through sessions, never import them
        self.graphs = graphs
        self.plan = None
        self.steps: list[BoundStep] = []
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.memory: dict[str, MemoryPlan] = {}
        self._views: dict[str, np.ndarray] = {}
        self._out_map: dict[str, str] = {}
        self._program: list = []
        self._program_noio: list = []
        self.captured = 0
        self._resized = False

    # ---- pre-inference -----------------------------------------------------------------
    def contexts(self, input_shapes=None) -> list[OpContext]:
        """Shapes, dtypes, constants and the scheme of every node, before any backend is asked."""
        g = self.graph
        if input_shapes:
            for name in input_shapes:
                if name not in g.inputs:
                    raise ConversionError(f"unknown input {name!r}; inputs: {', '.join(g.inputs)}")
        self.shapes = shapes = ops.infer_shapes(g, input_shapes)
        ctxs = []
        for node in g.nodes:
            in_shapes = [shapes[t] for t in node.inputs]
            consts = {i: g.constants[t] for i, t in enumerate(node.inputs) if t in g.constants}
            ctxs.append(OpContext(node, in_shapes, [shapes[t] for t in node.outputs], consts,
                                  choose_scheme(node, in_shapes, self.options),
                                  [g.tensors[t].dtype for t in node.inputs]))
        return ctxs

    def resize(self, input_shapes: dict[str, tuple[int, ...]] | None = None) -> Session:
        g = self.graph
        ctxs = self.contexts(input_shapes)
        shapes = self.shapes
        dtype = {t: g.tensors[t].dtype for t in g.tensors}
        made: dict[tuple[int, int], tuple[Execution | None, OpContext]] = {}

        def attempt(i: int, b: int) -> tuple[Execution | None, OpContext]:
            """Ask backend ``b`` for node ``i`` once (on its own copy of the context)."""
            if (i, b) not in made:
                c = replace(ctxs[i])
                made[(i, b)] = (self.backends[b].create_execution(c), c)
            return made[(i, b)]

        self.plan = None
        if self.cost_model is not None:
            from leti.engine.hybrid import plan_session

            self.plan = plan_session(self, ctxs, attempt)
        domain = {t: "host" for t in g.inputs}
        owner: dict[str, Backend] = {t: self.host for t in g.inputs}
        steps: list[BoundStep] = []
        copies: dict[tuple[str, str], str] = {}

        def fetch(t: str, backend: Backend, io: bool) -> str:
            key = (t, backend.memory_domain)
            if key not in copies:  # tensor crosses memory domains: a copy step
                copies[key] = c = f"{t}@{backend.memory_domain}"
                shapes[c], dtype[c], domain[c] = shapes[t], dtype[t], backend.memory_domain
                steps.append(BoundStep(f"copy:{c}", "copy", backend, Scheme("copy"), None, [t], [c],
                                       copy_from=owner[t], io=io))
            return copies[key]

        for i, node in enumerate(g.nodes):
            backend, ex, ctx = self._create(i, ctxs[i], attempt)
            inputs = [t if t in g.constants or domain[t] == backend.memory_domain
                      else fetch(t, backend, t in g.inputs) for t in node.inputs]
            for t in node.outputs:
                domain[t], owner[t] = backend.memory_domain, backend
            steps.append(BoundStep(node.name, node.op, backend, ctx.scheme, ex, inputs, list(node.outputs), ctx=ctx))
        self._out_map = {t: fetch(t, self.host, True) for t in g.outputs
                         if t not in g.constants and domain[t] != "host"}
        self._bind(steps, shapes, dtype, domain)
        self.steps = steps
        self._compile()
        self._resized = True
        return_freed_heap()  # the temporaries of packing and folding, freed but still in the heap
        release_mapped_weights(g.constants.values())  # the model file's pages: packed, transformed or read on demand
        return self

    def _create(self, i: int, ctx: OpContext, attempt) -> tuple[Backend, Execution, OpContext]:
        order = list(range(len(self.backends)))
        if self.plan is not None:
            first = self.plan.backend_index[i]
            order = [first] + [b for b in order if b != first]
        for b in order:
            ex, c = attempt(i, b)
            if ex is not None:
                return self.backends[b], ex, c
        raise ConversionError(f"no backend can run node {ctx.node.name!r} ({ctx.node.op}, scheme {ctx.scheme}); "
                              f"tried {', '.join(b.name for b in self.backends)}")

    def _domain_backend(self, dom: str) -> Backend:
        return next((b for b in self.backends if b.memory_domain == dom), None) or self.host

    def _bind(self, steps: list[BoundStep], shapes, dtype, domain) -> None:
        g = self.graph
        cand = passes.inplace_candidates(g)
        # a tensor is stored as its domain's backend stores it (16-bit precisions of a device)
        store = {t: self._domain_backend(domain[t]).storage_dtype(dtype[t]) for t in shapes if t not in g.constants}
        nbytes = {t: int(np.prod(shapes[t], dtype=np.int64)) * store[t].itemsize for t in store}
        self.memory, self._views = {}, {}
        outputs = [self._out_map.get(t, t) for t in g.outputs]
        # a step fused with the next (CPUBackend.fusion) reads its input until that one ends and never stores its
        # output: that one lives outside the arena, in pages only a step-by-step run touches
        returned = set(g.outputs) | set(outputs)
        self._read_once, later, unstored = read_once([st.inputs for st in steps], returned), {}, {}
        for prev, st in zip(steps, steps[1:]):
            if getattr(st.backend, "fusion", None) is not None:
                keep, never = st.backend.fusion(prev, st, self._read_once, nbytes)
                later[st.name] = [t for t in keep if t not in st.inputs]
                unstored.update((t, st.backend) for t in never)
        for dom in sorted(set(domain.values())):
            plan_steps = []
            for st in steps:
                mine = st.backend.memory_domain == dom
                ex = st.execution
                aliases = {st.outputs[0]: st.inputs[0]} if mine and ex is not None and ex.alias else {}
                inplace = {}
                if mine and st.name in cand and ex is not None and not ex.alias:
                    inplace = {st.outputs[0]: tuple(st.inputs[i] for i in cand[st.name])}
                plan_steps.append(Step(st.name, [t for t in st.inputs + later.get(st.name, [])
                                                 if domain.get(t) == dom and t not in unstored],
                                       [t for t in st.outputs if domain[t] == dom and t not in unstored],
                                       list(ex.scratch) if mine and ex is not None else [], aliases, inplace))
            sizes = {t: n for t, n in nbytes.items() if domain[t] == dom}
            plan = plan_memory(plan_steps, sizes, [t for t in g.inputs if domain[t] == dom],
                               [t for t in outputs if domain.get(t) == dom])
            self.memory[dom] = plan
            backend = self._domain_backend(dom)
            # the host arena in page-locked memory when a device backend offers it (fast, steady copies)
            pinned = pinned_allocator(self.backends)
            arena = (pinned if dom == "host" and pinned is not None else backend.acquire)(max(plan.arena_bytes, 64))
            for t, off in plan.offsets.items():
                self._views[t] = backend.view(arena, off, shapes[t], store[t])
            for st in steps:
                if st.backend.memory_domain == dom and st.execution is not None:
                    st.scratch_views = [arena[plan.scratch_offsets[(st.name, i)]:
                                              plan.scratch_offsets[(st.name, i)] + n]
                                        for i, n in enumerate(st.execution.scratch) if n]
        for t, backend in unstored.items():
            self._views[t] = backend.view(backend.acquire(nbytes[t]), 0, shapes[t], store[t])
        for st in steps:
            st.in_views = [g.constants[t] if t in g.constants else self._views[t] for t in st.inputs]
            st.out_views = [self._views[t] for t in st.outputs]

    def _compile(self) -> None:
        """The run program: steps, with each run of consecutive steps on a backend that can
        ``capture`` (CUDA graphs) replaced by one replayable callable."""
        prog, i, steps = [], 0, self.steps
        self.captured = 0
        while i < len(steps):
            st = steps[i]
            j = i
            while j < len(steps) and self._native(steps[j], st.backend):
                j += 1
            if j > i:  # a run of C-kernel steps (CPU): one native program, or the steps one by one if it declines
                fn = st.backend.native_program(steps[i:j], self._read_once)
                prog += [fn] if fn is not None else steps[i:j]
                i = j
                continue
            capture = getattr(st.backend, "capture", None) if self.graphs and st.copy_from is None else None
            if capture is None:
                prog.append(st)
                i += 1
                continue
            j = i
            while j < len(steps) and steps[j].backend is st.backend and steps[j].copy_from is None:
                j += 1
            fn = capture(steps[i:j])
            if fn is None:
                prog.extend(steps[i:j])
            else:
                prog.append(fn)
                self.captured += 1
            i = j
        self._program = prog
        self._program_noio = [p for p in prog if not getattr(p, "io", False)]

    @staticmethod
    def _native(st: BoundStep, backend) -> bool:
        """Whether ``st`` can join a native program on ``backend`` (its work described as C-kernel records)."""
        ex = st.execution
        return (st.backend is backend and st.copy_from is None and ex is not None
                and (ex.alias or ex.native is not None) and hasattr(backend, "native_program"))

    # ---- execution -----------------------------------------------------------------------
    def _feed(self, feeds) -> None:
        g = self.graph
        if not isinstance(feeds, dict):
            if len(g.inputs) != 1:
                raise ConversionError(f"the model has {len(g.inputs)} inputs: pass a dict")
            feeds = {g.inputs[0]: feeds}
        for name in g.inputs:
            if name not in feeds:
                raise ConversionError(f"missing input {name!r}")
            x = np.asarray(feeds[name])
            view = self._views[name]
            if x.shape != view.shape:
                raise ConversionError(f"input {name!r} has shape {list(x.shape)}, the session is resized for "
                                      f"{list(view.shape)} (call resize() with the new shape)")
            np.copyto(view, x, casting="same_kind")

    def run(self, feeds=None, copy: bool = True, io: bool = True) -> dict[str, np.ndarray] | None:
        """Execute once. ``feeds``: dict name → array (or one array for a single-input model).
        Returns the outputs (copies unless ``copy=False``, then views valid until the next run).

        ``io=False`` skips the copies of graph inputs onto a device and of outputs back to the
        host (the device keeps the last inputs) and returns ``None``: the latency of the model
        alone, as GPU frameworks usually report it."""
        if not self._resized:
            self.resize()
        if feeds is not None:
            self._feed(feeds)
        for b in self.backends:
            b.begin_run()
        try:
            for st in (self._program if io else self._program_noio):
                st()
        finally:
            for b in self.backends:
                b.end_run()
        return self._outputs(copy) if io else None

    def _outputs(self, copy: bool) -> dict[str, np.ndarray]:
        out = {}
        for t in self.graph.outputs:
            t_host = self._out_map.get(t, t)
            v = self._views[t_host] if t_host in self._views else self.graph.constants[t]
            out[t] = np.array(v) if copy else v
        return out

    def profile(self, feeds=None, runs: int = 10, in_run: bool = False) -> list[dict]:
        """Per-step median time (``ms``) and mean time (``mean_ms``) over ``runs``, with backend, scheme
        and output bytes. The mean is what adds up: a whole run costs the sum of its steps' means, while
        the sum of medians misses every step's tail (threads of a parallel op that wake late).

        By default each step runs as a program of its own, its data warm from its own last run. ``in_run``: the
        steps are timed inside whole runs as :meth:`run` executes them, a native program's steps by its step clock
        (``csrc/program.c``): what each costs in the network, its inputs and weights as the steps before left
        the caches, its threads awake."""
        if not self._resized:
            self.resize()
        if feeds is not None:
            self._feed(feeds)
        times = np.zeros((runs, len(self.steps)))
        index = {id(st): i for i, st in enumerate(self.steps)} if in_run else {}
        # a step that runs inside a native program is timed as a program of its own: the kernels a run calls
        calls = [] if in_run else [(self._native(st, st.backend) and st.backend.native_program([st])) or st
                                   for st in self.steps]
        for b in self.backends:
            b.begin_run()
        try:
            for r in range(runs):
                if in_run:
                    self._clocked_run(times[r], index)
                    continue
                for i, (st, call) in enumerate(zip(self.steps, calls)):
                    t0 = time.perf_counter()
                    call()
                    st.backend.synchronize()
                    times[r, i] = time.perf_counter() - t0
        finally:
            for b in self.backends:
                b.end_run()
        med = np.median(times, axis=0) * 1e3
        mean = (times[1:] if runs >= 3 else times).mean(axis=0) * 1e3  # the first run warms caches
        for i, st in enumerate(self.steps):  # device backends time their own work (CUDA: events)
            timer = getattr(st.backend, "time_step", None)
            if timer is not None:
                med[i] = mean[i] = timer(st, runs)
        from leti.engine.cost.spec import op_spec

        rows = []
        for st, ms, m in zip(self.steps, med, mean):
            rows.append({"name": st.name, "op": st.op, "backend": st.backend.name, "cost_key": st.backend.cost_key,
                         "spec": op_spec(st.ctx).key if st.ctx is not None else None, "scheme": str(st.scheme),
                         "ms": float(ms), "mean_ms": float(m), "out_shape": [list(self.shapes[t]) for t in st.outputs],
                         "out_bytes": int(sum(v.nbytes for v in st.out_views)),
                         "scratch_bytes": int(sum(v.nbytes for v in st.scratch_views))})
        return rows

    def _clocked_run(self, row: np.ndarray, index: dict) -> None:
        """One run as :meth:`run` makes it, each step's seconds added into ``row`` (``index``: id(step) → column)."""
        for item in self._program:
            clocked = getattr(item, "clocked", None)
            if clocked is not None:
                for owner, sec in zip(item.owners, clocked()):
                    if owner is not None:
                        row[index[id(owner)]] += sec
                continue
            t0 = time.perf_counter()
            item()
            if id(item) in index:
                item.backend.synchronize()
                row[index[id(item)]] += time.perf_counter() - t0

    def describe(self) -> dict:
        """Passes applied, op and scheme histograms, memory plans (for ``leti engine info``)."""
        if not self._resized:
            self.resize()
        schemes: dict[str, int] = {}
        for st in self.steps:
            key = f"{st.op}:{st.scheme}"
            schemes[key] = schemes.get(key, 0) + 1
        return {"passes": self.pass_report, "ops": self.graph.op_histogram(), "schemes": schemes,
                "backends": sorted({st.backend.name for st in self.steps}),
                "memory": {d: {"arena_bytes": p.arena_bytes, "naive_bytes": p.naive_bytes,
                               "lower_bound_bytes": p.lower_bound_bytes, "inplace": len(p.inplace)}
                           for d, p in self.memory.items()},
                "inputs": {t: list(self.shapes[t]) for t in self.graph.inputs},
                "outputs": {t: list(self.shapes[t]) for t in self.graph.outputs},
                "params": self.graph.num_params(), "captured_graphs": self.captured,
                "plan": self.plan.summary() if self.plan is not None else None}


def calibration_session(graph: Graph, backend: Backend) -> Session:
    """A resized, unoptimised session of ``graph`` on ``backend`` alone: what the analytic cost
    model's calibration times (:func:`leti.engine.cost.analytic.calibrate_backend`)."""
    return Session(graph, backends=[backend], optimize=False).resize()
