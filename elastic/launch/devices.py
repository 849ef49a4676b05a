"""Count this host's CPUs, NVIDIA GPUs and Intel XPUs for ``--nproc-per-node auto|cpu|gpu|xpu``.

torch answers these with ``torch.cuda.device_count()``, which costs a CUDA initialisation and
a second of imports; the launcher only needs a number. CPUs are those this process may run on
(``sched_getaffinity``, as torch counts them, so ``taskset`` and cgroup cpusets are respected).
GPUs are the NVIDIA devices the driver lists (``/proc/driver/nvidia/gpus``, else
``nvidia-smi -L``), narrowed by ``CUDA_VISIBLE_DEVICES`` the way CUDA narrows them. XPUs are
counted by torch itself (``torch.xpu.device_count()`` when ``torch.xpu.is_available()``, as
torchrun counts them: Level Zero's device hierarchy and ``ZE_AFFINITY_MASK`` are torch's to
read), in a child process of the workers' interpreter, and only when it can matter: for
``xpu``, and for ``auto`` without an NVIDIA GPU on a host whose kernel lists an Intel GPU.
Other accelerators (MPS, out-of-tree devices) are not detected: give those a number.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Callable, Mapping, Protocol

NVIDIA_PROC_DIR = "/proc/driver/nvidia/gpus"
NVIDIA_SMI_TIMEOUT = 10.0
DRM_CLASS_DIR = "/sys/class/drm"
INTEL_PCI_VENDOR = "0x8086"
XPU_QUERY_TIMEOUT = 120.0
"""A cold ``import torch`` on a slow shared file system takes tens of seconds."""
# Run by the workers' interpreter: the XPUs torch sees, as torchrun's determine_local_world_size asks.
XPU_QUERY = "import torch; print(torch.xpu.device_count() if torch.xpu.is_available() else 0)"


class DeviceCountError(Exception):
    """A device count could not be had (the message is one line naming the interpreter and why)."""


class DeviceProbe(Protocol):
    """What ``config_from_args`` asks about the host; only called for ``auto``/``cpu``/``gpu``."""

    def cpu_count(self) -> int: ...

    def gpu_count(self) -> int: ...

    def may_have_xpus(self) -> bool:
        """A cheap look: False when the host surely has no XPU (``auto`` then asks no further)."""
        ...

    def xpu_count(self) -> int:
        """Raises DeviceCountError when it cannot be counted."""
        ...


@dataclass(frozen=True)
class FixedDevices:
    """A host with known counts: for tests, and for callers that already know the answer."""

    cpus: int
    gpus: int = 0
    xpus: int = 0

    def cpu_count(self) -> int:
        return self.cpus

    def gpu_count(self) -> int:
        return self.gpus

    def may_have_xpus(self) -> bool:
        return self.xpus > 0

    def xpu_count(self) -> int:
        return self.xpus


@dataclass(frozen=True)
class HostDevices:
    """This host, seen through ``environ`` (``CUDA_VISIBLE_DEVICES``; ``PYTHON_EXEC``, the
    workers' interpreter, and what its torch reads, for XPUs).

    ``list_gpus`` returns the number of physical NVIDIA GPUs, ``intel_gpu`` whether the kernel
    lists an Intel GPU; both are injectable so tests need neither a driver nor the hardware.
    """

    environ: Mapping[str, str]
    list_gpus: Callable[[], int] = lambda: count_nvidia_gpus()
    intel_gpu: Callable[[], bool] = lambda: intel_gpu_listed()

    def cpu_count(self) -> int:
        if hasattr(os, "sched_getaffinity"):
            return len(os.sched_getaffinity(0))
        return os.cpu_count() or 1

    def gpu_count(self) -> int:
        return visible_gpu_count(self.list_gpus(), self.environ.get("CUDA_VISIBLE_DEVICES"))

    def may_have_xpus(self) -> bool:
        return self.intel_gpu()

    def xpu_count(self) -> int:
        return count_xpus(self.environ.get("PYTHON_EXEC") or sys.executable, self.environ)


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


def intel_gpu_listed(drm_dir: str = DRM_CLASS_DIR) -> bool:
    """Whether the kernel lists an Intel GPU: a ``renderD*`` node whose PCI vendor is Intel's.

    It says only whether asking torch about XPUs can answer more than 0 (an integrated GPU is
    listed too; torch counts it only when its compute runtime supports it).
    """
    try:
        names = os.listdir(drm_dir)
    except OSError:
        return False
    for name in names:
        if not name.startswith("renderD"):
            continue
        try:
            with open(os.path.join(drm_dir, name, "device", "vendor"), encoding="ascii") as vendor:
                if vendor.read().strip().lower() == INTEL_PCI_VENDOR:
                    return True
        except (OSError, ValueError):
            continue
    return False


def count_xpus(
    python: str,
    environ: Mapping[str, str],
    run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run,
) -> int:
    """The XPUs torch in ``python`` sees under ``environ`` (0 when ``torch.xpu`` is not available).

    Raises:
        DeviceCountError: ``python`` cannot be run, cannot import torch, or does not answer
            in time.
    """
    try:
        done = run([python, "-c", XPU_QUERY], capture_output=True, text=True, env=dict(environ),
                   timeout=XPU_QUERY_TIMEOUT, check=False)
    except (OSError, subprocess.SubprocessError) as error:
        raise DeviceCountError(f"{python} could not be asked for torch's XPU count: {error}") from None
    answer = done.stdout.strip().splitlines()[-1:] if done.returncode == 0 else []
    if not answer or not answer[0].isdigit():
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise DeviceCountError(f"torch in {python} did not count the XPUs: {last[:300]}")
    return int(answer[0])
