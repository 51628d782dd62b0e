"""Devices by name: ``local``, ``cuda``, or anything else, which is an adb serial (``127.0.0.1:PORT``...)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from leti.device.base import Device
from leti.errors import DeviceError


def _local(backend: str, threads: int, xnnpack: bool, **_) -> Device:  # adb-only options are ignored
    from leti.device.local import LocalDevice

    if backend != "cpu":
        raise DeviceError(f"the local device has no {backend!r} backend (only 'cpu'); use --device cuda for a GPU")
    return LocalDevice(threads=threads, xnnpack=xnnpack)


def _cuda(backend: str, **_) -> Device:
    from leti.device.cuda import CudaDevice

    if backend not in ("gpu", "cuda"):
        raise DeviceError(f"the cuda device measures on the GPU; use --backend gpu, not {backend!r}")
    return CudaDevice()


def _adb(serial: str, backend: str, threads: int, benchmark_binary: Path | None, xnnpack: bool, **kw) -> Device:
    from leti.device.adb import AdbDevice

    return AdbDevice(serial, benchmark_binary=benchmark_binary, backend=backend, threads=threads,
                     xnnpack=xnnpack, **kw)


#: Named device kinds; every other name is taken as an adb serial.
KINDS: dict[str, Callable[..., Device]] = {"local": _local, "cuda": _cuda}
BACKENDS = ("cpu", "gpu")


def open_device(name: str, backend: str = "cpu", threads: int = 1, benchmark_binary: str | Path | None = None,
                xnnpack: bool = True, **kw) -> Device:
    """Open the device called ``name`` for ``backend`` measurements."""
    if backend not in BACKENDS:
        raise DeviceError(f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}")
    if name in KINDS:
        return KINDS[name](backend=backend, threads=threads, xnnpack=xnnpack, **kw)
    binary = Path(benchmark_binary) if benchmark_binary else None
    return _adb(name, backend=backend, threads=threads, benchmark_binary=binary, xnnpack=xnnpack, **kw)
