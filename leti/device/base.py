"""What every measurement device offers: the :class:`Device` interface, its typed errors, and the
:class:`Measurement` record that :func:`leti.device.protocol.measure` makes of its runs.

A :class:`Device` executes *batches*: load a model, warm up, time ``n`` runs, report the statistics of
those runs (:class:`~leti.device.stats.Batch`). What "a measurement" means (reruns, adaptive stop,
paired measurement) lives in :mod:`leti.device.protocol`, so the devices cannot disagree on it.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

from leti.device.stats import CLOCKS, NAN, Batch
from leti.errors import DeviceError


class DeviceOfflineError(DeviceError):
    """The device disappeared (transport gone) and did not come back in time."""


class DeviceTimeoutError(DeviceError):
    """A command on the device ran past its time limit and was stopped."""


class StorageFullError(DeviceError):
    """The device has no space left for the model or the benchmark binary."""


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


# ---- the device protocol -----------------------------------------------------------------------
class Device(ABC):
    """A place where models run. Subclasses implement :meth:`run`; the rest has sensible defaults.

    ``artifact`` says what model file the device consumes (``"tflite"`` or ``"keras"``);
    ``shares_host_cpu`` tells a campaign not to convert the next model while this one is timed (the
    conversion would compete with the measurement for the same cores).
    """

    id: str = "device"
    backend: str = "cpu"
    artifact: str = "tflite"
    shares_host_cpu: bool = False
    #: whether :func:`~leti.device.protocol.measure` adds one op-profiled run per measurement (:meth:`op_times`)
    op_profiling: bool = False

    @abstractmethod
    def run(self, model: Path, runs: int, warmup: int) -> Batch:
        """Load ``model`` (cached between calls on the same model), warm up, time ``runs`` runs."""

    def op_times(self, model: Path, runs: int, warmup: int) -> tuple[list, str]:
        """Per-op times of ``model`` (:class:`~leti.device.op_profile.OpTime` rows) from one extra run under the
        runtime's op profiler, and that run's log. Devices without an op profiler return ``([], "")``."""
        return [], ""

    #: what in-process timing reads (ns): the clock of the protocol being applied (:meth:`timing`)
    clock_ns: Callable[[], int] = staticmethod(CLOCKS["wall"])

    def clocks(self) -> tuple[str, ...]:
        """The clocks (:data:`~leti.device.stats.CLOCKS`) this device can time runs with: wall time only,
        unless the device runs a model entirely on the measuring thread."""
        return ("wall",)

    @contextmanager
    def timing(self, clock: str) -> Iterator[None]:
        """Time runs on ``clock`` while the context lasts (:func:`leti.device.protocol.measure` applies its
        protocol's clock); a clock the device cannot honour raises :class:`DeviceError`."""
        if clock not in self.clocks():
            raise DeviceError(f"{self.id}: cannot time runs by the {clock!r} clock (it offers: "
                              f"{', '.join(self.clocks())}); the CPU clock needs a device that runs the model on the "
                              "measuring thread (local or engine CPU, one thread)")
        saved = self.__dict__.get("clock_ns")
        self.clock_ns = CLOCKS[clock]
        try:
            yield
        finally:
            if saved is None:
                del self.clock_ns
            else:
                self.clock_ns = saved

    def info(self) -> dict:
        """Static facts about the device (model, SoC, cores, versions...)."""
        return {"id": self.id, "backend": self.backend}

    def identity(self) -> str:
        """What identifies this device across connections (a campaign is bound to it): its ``id`` unless
        the id names only a route to the device (an adb transport such as ``127.0.0.1:5555``)."""
        return self.id

    def tool_versions(self) -> dict:
        return {}

    def temperature_c(self) -> float | None:
        """Current temperature used for thermal care, or None when the device does not report one."""
        return None

    def runner(self, model: Path) -> Callable[[], None]:
        """A callable that runs ``model`` once, the model loaded and kept (paired measurement).

        Only devices that run models in this process offer it; a phone's ``benchmark_model`` cannot
        alternate two models within one process run.
        """
        raise DeviceError(f"{self.id}: paired measurement against a reference needs a device that runs models "
                          "in this process (local, engine)")

    @property
    def pairable(self) -> bool:
        return type(self).runner is not Device.runner

    def release(self, model: Path) -> None:
        """Forget ``model`` (drop interpreters, remove remote copies)."""

    def close(self) -> None:
        """Free everything the device holds."""

    def wait_online(self, timeout_s: float) -> bool:
        """After a :class:`DeviceOfflineError`: wait until the device is back; False when it is not."""
        return False

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---- the record ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Measurement:
    """The result of measuring one model once under a :class:`Protocol`."""

    device_id: str
    backend: str
    mean_ms: float
    median_ms: float
    std_ms: float
    min_ms: float
    max_ms: float
    runs: int
    warmup: int
    attempts: int
    stable: bool
    ci_half_width_ms: float
    delegation: str
    mem_init_mb: float
    mem_overall_mb: float
    mem_peak_mb: float
    temperature_c: float | None
    cooldown_s: float
    started_at: str
    finished_at: str
    raw_log: str = field(default="", repr=False)
    #: paired measurement only: mean of the reference's timed runs, and mean and std of the normalised samples
    ref_ms: float = NAN
    ratio: float = NAN
    ratio_std: float = NAN
    #: delegate coverage of the model: the delegate's name, the nodes it ran and the graph's nodes
    #: (None when the device does not report them); total - delegated nodes fell back to the CPU kernels
    delegate: str = ""
    delegated_nodes: int | None = None
    total_nodes: int | None = None
    #: op profiling (devices with ``op_profiling``): the per-op rows of the extra profiled run and its log;
    #: ``ops_log`` None when the measurement was not profiled
    ops: tuple = field(default=(), repr=False)
    ops_log: str | None = field(default=None, repr=False)

    @property
    def rel_std(self) -> float:
        return self.std_ms / self.mean_ms if self.mean_ms > 0 else math.inf

    def to_dict(self) -> dict:
        return asdict(self)

    def with_(self, **kw) -> Measurement:
        return replace(self, **kw)

