"""Peak resident memory for the benchmarks (no project imports, so importing it adds nothing to
the number it measures)."""

from __future__ import annotations

import resource
from pathlib import Path


def peak_rss_mb() -> float:
    """Peak resident memory of this process in MB: VmHWM (ru_maxrss survives exec, so a child
    started by a big parent would report the parent's peak), else ru_maxrss."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
