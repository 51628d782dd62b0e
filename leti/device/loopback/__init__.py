"""Loopback ADB device: a daemon speaking the ADB device protocol plus a benchmark_model-compatible runner,
so the whole adb path (adbutils → adb server → device) runs for real without a phone."""

from leti.device.loopback.daemon import Faults, LoopbackDevice


def write_runner_script(path, python=None):
    """See :func:`leti.device.loopback.runner.write_runner_script` (imported lazily: ``-m`` runs that module)."""
    from leti.device.loopback.runner import write_runner_script as write

    return write(path, python)

__all__ = ["Faults", "LoopbackDevice", "write_runner_script"]
