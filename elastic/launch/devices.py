"""Count this host's CPUs and NVIDIA GPUs for ``--nproc-per-node auto|cpu|gpu``, without torch.

torch answers these with ``torch.cuda.device_count()``, which costs a CUDA initialisation and
a second of imports; the launcher only needs a number. CPUs are those this process may run on
(``sched_getaffinity``, as torch counts them, so ``taskset`` and cgroup cpusets are respected).
GPUs are the NVIDIA devices the driver lists (``/proc/driver/nvidia/gpus``, else
``nvidia-smi -L``), narrowed by ``CUDA_VISIBLE_DEVICES`` the way CUDA narrows them. Other
accelerators (XPU, MPS) are not detected: give those a number.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from typing import Callable, Mapping, Protocol

NVIDIA_PROC_DIR = "/proc/driver/nvidia/gpus"
NVIDIA_SMI_TIMEOUT = 10.0


class DeviceProbe(Protocol):
    """What ``config_from_args`` asks about the host; only called for ``auto``/``cpu``/``gpu``."""

    def cpu_count(self) -> int: ...

    def gpu_count(self) -> int: ...


@dataclass(frozen=True)
class FixedDevices:
    """A host with known counts: for tests, and for callers that already know the answer."""

    cpus: int
    gpus: int = 0

    def cpu_count(self) -> int:
        return self.cpus

    def gpu_count(self) -> int:
        return self.gpus


@dataclass(frozen=True)
class HostDevices:
    """This host, seen through ``environ`` (for ``CUDA_VISIBLE_DEVICES``).

    ``list_gpus`` returns the number of physical NVIDIA GPUs; it is injectable so tests need
    neither a driver nor ``nvidia-smi``.
    """

    environ: Mapping[str, str]
    list_gpus: Callable[[], int] = lambda: count_nvidia_gpus()

    def cpu_count(self) -> int:
        if hasattr(os, "sched_getaffinity"):
            return len(os.sched_getaffinity(0))
        return os.cpu_count() or 1

    def gpu_count(self) -> int:
        return visible_gpu_count(self.list_gpus(), self.environ.get("CUDA_VISIBLE_DEVICES"))


def visible_gpu_count(physical: int, cuda_visible_devices: str | None) -> int:
    """How many of ``physical`` GPUs CUDA exposes under ``CUDA_VISIBLE_DEVICES``.

    Like CUDA, the list is read up to its first invalid entry (so ``-1`` or ``""`` hide every
    device); entries are indices below ``physical`` or ``GPU-``/``MIG-`` UUIDs.
    """
    if cuda_visible_devices is None:
        return physical
    visible = 0
    for entry in cuda_visible_devices.split(","):
        entry = entry.strip()
        if (entry.isascii() and entry.isdigit() and int(entry) < physical) or entry.startswith(("GPU-", "MIG-")):
            visible += 1
        else:
            break
    return min(visible, physical)


def count_nvidia_gpus(
    proc_dir: str = NVIDIA_PROC_DIR,
    run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run,
) -> int:
    """The number of NVIDIA GPUs the driver knows, 0 when there is no driver or no ``nvidia-smi``."""
    try:
        entries = os.listdir(proc_dir)
    except OSError:
        entries = []
    if entries:
        return len(entries)
    try:
        listing = run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT, check=False)
    except (OSError, subprocess.SubprocessError):
        return 0
    if listing.returncode != 0:
        return 0
    return sum(1 for line in listing.stdout.splitlines() if line.startswith("GPU "))
