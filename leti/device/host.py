"""This machine: which host a measurement of the local CPU (or of LETI's engine on it) describes.

Why it matters: a kernel predictor of ``local`` or ``engine`` predicts the machine its kernels were timed on, and two
VMs of one CPU type are not the same machine. Measured (issue 16): the zoo's reference network took 4.04 ms on session
13's Zen 3 VM and 4.71 ms on session 46's (1.17x, both on the thread's CPU clock), and the committed Zen 3 store, Acc@10
98.8 % on its own host's zoo, scored 5.8 % on the other's (bias -15.8 %; 94.7 % with one oracle scale). Within one
hour the second VM's own speed moved by up to 1.35x (session 47: the build's reference kernel 0.152-0.207 ms). A
kernel build records the hosts it measured on (:class:`~leti.predict.kernels.build_store.BuildStore`), and a prediction
made on another machine widens its interval and says so (:mod:`leti.predict.kernels.model`).
"""

from __future__ import annotations

import hashlib
import os
import platform
from functools import lru_cache
from pathlib import Path


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what :mod:`platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@lru_cache(maxsize=1)
def host_identity() -> dict:
    """``{"id", "cpu", "cores"}``: ``id`` is a digest of the machine id (systemd's ``/etc/machine-id``, else the host
    name), so that two VMs of one CPU type differ while a reboot keeps it; the raw id is not stored."""
    raw = ""
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            raw = Path(path).read_text().strip()
        except OSError:
            continue
        if raw:
            break
    raw = raw or platform.node()
    return {"id": hashlib.sha256(raw.encode()).hexdigest()[:16], "cpu": cpu_name(), "cores": os.cpu_count()}
