"""A trial's memory: the peak it reached and what is held now, from CUDA's allocator statistics on
a GPU and from the process's /proc/self/status (VmHWM, VmRSS) on a CPU."""

from __future__ import annotations

import resource

import torch


def reset_peak_memory(device: torch.device) -> None:
    """Start this trial's peak: CUDA's allocator statistics, or on Linux the process's resident
    high-water mark (writing 5 to /proc/self/clear_refs resets VmHWM)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _proc_status_bytes(field: str) -> int | None:
    """A memory line of /proc/self/status (VmRSS, VmHWM) in bytes; None where /proc is missing."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def held_memory_bytes(device: torch.device) -> int:
    """What is held now, on the scale peak_memory_bytes reads: CUDA's allocated bytes, else the
    process's resident memory (VmRSS; 0 where /proc is missing)."""
    if device.type == "cuda":
        return int(torch.cuda.memory_allocated(device))
    return _proc_status_bytes("VmRSS") or 0


def peak_memory_bytes(device: torch.device) -> int:
    """CUDA: peak allocated by torch since reset_peak_memory. CPU: the process's resident
    high-water mark since then (VmHWM; where /proc is missing, the lifetime peak ru_maxrss)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    hwm = _proc_status_bytes("VmHWM")
    if hwm is not None:
        return hwm
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
