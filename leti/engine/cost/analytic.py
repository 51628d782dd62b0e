"""MNN's analytic backend cost (MNN §3.3, Appendix C), calibrated on the machine and cached.

    C_op = MUL / FLOPS × 1000            on a CPU   (ms; MUL from :mod:`leti.engine.cost.spec`)
    C_op = MUL / FLOPS × 1000 + t_schedule   on a GPU (any backend whose memory is not the host's)

**Calibration** (``calibrate=True``, at the first use of a backend, cached in a JSON file keyed by
host, backend settings and device): FLOPS is MUL per second of a 3×3 convolution (1×32×32×64 →
64) run alone on the backend; t_schedule is the time per op of a chain of 32 ReLUs on an 8-value
tensor (what a launch costs when there is nothing to compute), and the difference between a
one-ReLU run and that is ``t_run`` — the fixed cost of a run (begin and end, a graph launch, the
final synchronisation), added once per run by :meth:`~AnalyticCostModel.run_overhead`; ``bandwidth`` — bytes per second of
an add of two 1 MB tensors — feeds the optional ``memory_term``. GPU FLOPS has t_schedule
subtracted. Microbenchmarks run through sessions with ``io=False`` (so on CUDA they time the
captured graph, as a run would); the session is not imported here but handed in as
``open_session(graph, backend)``: a :class:`~leti.engine.session.Session` given this cost model
attaches :func:`leti.engine.session.calibration_session`, or pass it as ``open_session=``.

**Fixed fallbacks** (``calibrate=False``), after MNN's Appendix C: CPU FLOPS = the sum of the
``threads`` largest per-core maximum frequencies (Linux ``cpufreq``, else 2 GHz a core) times
``mul_per_cycle``; GPU FLOPS 4×10⁹ and t_schedule 0.05 ms (MNN's OpenCL/OpenGL value; CUDA launches
are the same kind of call). MNN counts one MUL a cycle (``mul_per_cycle=1``, its exact constants), but
LETI's CPU kernels are vectorised: on a 2-core AMD EPYC VM (AVX2, no ``cpufreq``) calibration measured
17.9×10⁹ MUL/s where MNN's constant says 2×10⁹, so an uncalibrated plan of a NB101 network said 90 ms
for a network that runs in 11-14 ms. The default ``mul_per_cycle`` was therefore 4 (about 9×10⁹ MUL/s a
thread measured there at ~2.2 GHz). LETI's C kernels then made the engine 2-4× faster: in session 14 calibration
measured 34×10⁹ MUL/s a thread on such a VM (the 3×3 convolution by Winograd, counted as direct MULs), and the
calibrated plan of a 32×32×64 NB101 cell was 0.32-0.46 ms where 4 MUL a cycle guessed 1.23 (2.7-3.9×).
:data:`CPU_MUL_PER_CYCLE` is now 8 (16×10⁹ MUL/s a thread at 2 GHz): that guess is 0.61 ms, 1.3-1.9× the
calibrated plan; an uncalibrated estimate is still a guess within a factor ~2 — calibrate for more. Where the
engine's products run 16-lane AVX-512 tiles (:func:`cpu_mul_per_cycle`), twice that: on a Zen 5 the same cell's
calibrated plan was 0.18 ms with the paired-panel AVX-512 products (session 22), 3.4× the 8-a-cycle guess.

Two extensions, off by default so that the model stays MNN's: ``cpu_overhead`` adds the calibrated
per-op overhead on CPUs too (a Python engine pays one), ``memory_term`` takes
``max(MUL/FLOPS, bytes/bandwidth)`` (ops with little arithmetic are memory-bound).
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import numpy as np

from leti.engine.backends.base import Backend
from leti.engine.cost.base import CostModel
from leti.engine.cost.spec import OpSpec, op_spec
from leti.errors import LetiError

CPU_FLOPS_FALLBACK = 2e9  # MNN: the CPU's MUL/s when its frequency is unknown (one MUL a cycle at 2 GHz)
#: MUL a cycle a core sustains in LETI's vectorised kernels (see the module docstring); MNN's is 1
CPU_MUL_PER_CYCLE = 8.0


def cpu_mul_per_cycle() -> float:
    """:data:`CPU_MUL_PER_CYCLE`, doubled where the engine's products use AVX-512 (twice the lanes of AVX2)."""
    try:
        from leti.engine.backends.cpu import ckernels

        return CPU_MUL_PER_CYCLE * (2.0 if ckernels.set_avx512(None) else 1.0)
    except Exception:  # noqa: BLE001 - no compiler or library: the AVX2-era constant
        return CPU_MUL_PER_CYCLE
GPU_FLOPS_FALLBACK = 4e9
GPU_T_SCHEDULE_MS = 0.05
BANDWIDTH_FALLBACK = {"cpu": 20e9, "gpu": 100e9}  # cpu: 40e9 B/s calibrated on the 2-core VM above, halved
CACHE_VERSION = 4  # 3: the fastest of the runs, not their median (session 44); 4: CPU runs timed inside (45)


def default_cache() -> Path:
    root = os.environ.get("LETI_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "leti")
    return Path(root) / "engine_costs.json"


def is_gpu(backend: Backend) -> bool:
    return backend.memory_domain != "host"


def cpu_max_frequencies(root: str | os.PathLike = "/sys/devices/system/cpu") -> list[float]:
    """Per-core maximum frequencies in Hz, largest first ([] where the OS does not expose them)."""
    freqs = []
    for f in sorted(Path(root).glob("cpu[0-9]*/cpufreq/cpuinfo_max_freq")):
        try:
            freqs.append(float(f.read_text().strip()) * 1e3)  # kHz
        except (OSError, ValueError):
            continue
    return sorted(freqs, reverse=True)


def fallback_params(backend: Backend, sysfs: str | os.PathLike = "/sys/devices/system/cpu",
                    mul_per_cycle: float = 1.0) -> dict:
    """The uncalibrated parameters; ``mul_per_cycle=1`` gives MNN's Appendix C exactly (where the
    frequencies are unknown, 2×10⁹ for the whole CPU), more scales a 2 GHz core per thread."""
    if is_gpu(backend):
        return {"flops": GPU_FLOPS_FALLBACK, "t_schedule_ms": GPU_T_SCHEDULE_MS,
                "bandwidth": BANDWIDTH_FALLBACK["gpu"], "source": "fallback"}
    k = backend.threads or os.cpu_count() or 1
    freqs = cpu_max_frequencies(sysfs)
    if mul_per_cycle == 1.0:
        flops = float(sum(freqs[:k])) if freqs else CPU_FLOPS_FALLBACK
    else:
        flops = (float(sum(freqs[:k])) if freqs else CPU_FLOPS_FALLBACK * k) * mul_per_cycle
    return {"flops": flops, "t_schedule_ms": 0.0, "bandwidth": BANDWIDTH_FALLBACK["cpu"], "source": "fallback"}


def _device_id(backend: Backend) -> str:
    name = getattr(backend, "device_name", None) or f"{platform.machine()} x{os.cpu_count()}"
    return f"{platform.node()}|{backend.cost_key}|{name}"


def _single_op_graph(op: str, shape, consts=(), n: int = 1, **attrs):
    from leti.engine.graph import Graph

    g = Graph()
    g.add_tensor("x", shape)
    g.inputs = ["x"]
    names = [g.add_constant(f"c{i}", c) for i, c in enumerate(consts)]
    prev = "x"
    for i in range(n):
        out = f"y{i}"
        g.add_tensor(out, shape if op != "conv2d" else shape[:3] + (consts[0].shape[3],))
        g.add_node(op, [prev, *names], [out], **attrs)
        prev = out
    g.outputs = [prev]
    return g


def _fastest_run_ms(session, runs: int, inside: bool = False, most: int = 60, pause_s: float = 0.001) -> float:
    """The fastest run after two untimed ones: what the ops cost when nothing else takes the cores. At least ``runs``
    runs, a short pause before each, and on (``most`` at the most) until the two fastest agree within 25 %. Other
    processes only ever add time: on a loaded 2-core host (a test run's other worker) most of a calibration's runs had
    read a 3x3 convolution ~10x slow, and their median with them (``leti engine plan`` then predicted 8.3 ms for a
    0.3 ms model, session 44). ``inside``: each run's time is the sum of its steps timed inside it (a native program's
    by its step clock, ``Session.profile(in_run=True)``), not the call's: with busy processes on both cores a run of a
    two-thread session waits at its end for the second thread to get a core, ~0.3-0.5 ms that no pause avoided (a 4 us
    op read 0.56 ms in every one of 60 runs, session 45), and the fixed cost it puts on every run would be cached."""
    session.run({t: np.zeros(session.shapes[t], np.float32) for t in session.graph.inputs})
    session.run(io=False)
    ts = []
    while len(ts) < most:
        time.sleep(pause_s)
        if inside:
            ts.append(sum(r["ms"] for r in session.profile(runs=1, in_run=True)) * 1e-3)
        else:
            t0 = time.perf_counter()
            session.run(io=False)
            ts.append(time.perf_counter() - t0)
        if len(ts) >= runs:
            a, b = sorted(ts)[:2]
            if b <= 1.25 * a:
                break
    return float(min(ts) * 1e3)


def calibrate_backend(backend: Backend, open_session, runs: int = 7) -> dict:
    """Measure FLOPS, t_schedule and bandwidth of ``backend`` (see the module docstring) with
    sessions from ``open_session(graph, backend)`` (resized, on ``backend`` alone, unoptimised)."""
    rng = np.random.default_rng(0)
    chain = 32
    relu = open_session(_single_op_graph("relu", (1, 1, 1, 8), n=chain), backend)
    inside = not is_gpu(backend)
    t_chain = _fastest_run_ms(relu, runs, inside)
    one = open_session(_single_op_graph("relu", (1, 1, 1, 8), n=1), backend)
    t_one = _fastest_run_ms(one, runs, inside)
    t_sched = max((t_chain - t_one) / (chain - 1), 1e-5)  # per op, without the run's fixed cost
    t_run = max(t_one - t_sched, 0.0)
    w = (rng.standard_normal((3, 3, 64, 64)) * 0.05).astype(np.float32)
    conv = open_session(_single_op_graph("conv2d", (1, 32, 32, 64), [w], padding="same"), backend)
    mul = op_spec(next(st.ctx for st in conv.steps if st.op == "conv2d")).mul
    t_conv = _fastest_run_ms(conv, runs, inside) - (t_sched if is_gpu(backend) else 0.0)
    shape = (1, 64, 64, 64)
    add = open_session(_single_op_graph("add", shape, [rng.standard_normal(shape).astype(np.float32)]), backend)
    t_add = max(_fastest_run_ms(add, runs, inside) - (t_sched if is_gpu(backend) else 0.0), 1e-4)
    return {"flops": mul / max(t_conv, 1e-4) * 1e3, "t_schedule_ms": t_sched, "t_run_ms": t_run,
            "bandwidth": 3 * 4 * float(np.prod(shape)) / t_add * 1e3, "source": "calibrated"}


class AnalyticCostModel(CostModel):
    """MNN's C_op (module docstring). ``params`` fixes a backend's ``{"flops", "t_schedule_ms",
    "bandwidth"}`` by its ``cost_key`` (tests, or parameters measured elsewhere); ``open_session``
    is what calibration runs its microbenchmarks with (a Session attaches one); ``mul_per_cycle`` sets
    the uncalibrated CPU FLOPS (1 = MNN's constants exactly; default :func:`cpu_mul_per_cycle`)."""

    name = "mnn"

    def __init__(self, calibrate: bool = True, cache: str | os.PathLike | None = None, params: dict | None = None,
                 cpu_overhead: bool = False, memory_term: bool = False, transfers=None, open_session=None,
                 mul_per_cycle: float | None = None):
        self.calibrate = calibrate
        self.mul_per_cycle = cpu_mul_per_cycle() if mul_per_cycle is None else mul_per_cycle
        self.open_session = open_session
        self.cache = Path(cache) if cache is not None else default_cache()
        self.params = dict(params or {})
        self.cpu_overhead = cpu_overhead
        self.memory_term = memory_term
        if transfers is not None:
            self.transfers = transfers

    def attach(self, open_session) -> None:
        if self.open_session is None:
            self.open_session = open_session

    # ---- parameters ------------------------------------------------------------------------
    def _read_cache(self) -> dict:
        try:
            data = json.loads(self.cache.read_text())
            return data.get("entries", {}) if data.get("version") == CACHE_VERSION else {}
        except (OSError, ValueError, AttributeError):
            return {}  # a missing or unreadable cache is recalibrated, never fatal

    def _write_cache(self, key: str, params: dict) -> None:
        entries = self._read_cache()
        entries[key] = params
        self.cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.cache.with_suffix(".tmp")
        tmp.write_text(json.dumps({"version": CACHE_VERSION, "entries": entries}, indent=1))
        tmp.replace(self.cache)

    def backend_params(self, backend: Backend) -> dict:
        key = backend.cost_key
        if key in self.params:
            return self.params[key]
        if not self.calibrate:
            p = fallback_params(backend, mul_per_cycle=self.mul_per_cycle)
        else:
            dev = _device_id(backend)
            p = self._read_cache().get(dev)
            if p is None:
                if self.open_session is None:
                    raise LetiError("calibrating a backend runs sessions: use the cost model in a Session, or pass "
                                    "open_session=leti.engine.session.calibration_session")
                p = calibrate_backend(backend, self.open_session)
                self._write_cache(dev, p)
        self.params[key] = p
        return p

    # ---- the model -------------------------------------------------------------------------
    def run_overhead(self, backends) -> float:
        """The calibrated fixed cost of a run (``t_run_ms``: a one-op run minus its op), summed
        over the session's backends (each one's begin/end of run happens every run)."""
        return float(sum(self.backend_params(b).get("t_run_ms", 0.0) for b in backends))

    def op_cost(self, spec: OpSpec, backend: Backend) -> float:
        p = self.backend_params(backend)
        ms = spec.mul / p["flops"] * 1e3
        if self.memory_term:
            ms = max(ms, (spec.bytes_in + spec.bytes_out) / p["bandwidth"] * 1e3)
        if is_gpu(backend) or self.cpu_overhead:
            ms += p["t_schedule_ms"]
        return float(ms)
