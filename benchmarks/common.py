"""Helpers the benchmarks share.  Standard library only, so importing this adds nothing to the
memory a benchmark measures."""

from __future__ import annotations

import json
import resource
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
"""Where each benchmark writes ``<name>.json``."""


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


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by linear interpolation; NaN when empty."""
    vals = sorted(values)
    if not vals:
        return float("nan")
    pos = (len(vals) - 1) * q
    lo, hi = int(pos), min(int(pos) + 1, len(vals) - 1)
    return vals[lo] + (vals[hi] - vals[lo]) * (pos - lo)


def ms(values: Sequence[float], q: float, digits: int = 1) -> float:
    """The ``q`` quantile of durations in seconds, in milliseconds."""
    return round(quantile(values, q) * 1000, digits)


def saved(name: str) -> dict[str, Any]:
    """What ``benchmarks/results/<name>.json`` holds ({} when there is none)."""
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def save(name: str, result: Any, key: str | None = None) -> Path:
    """Write ``result`` to ``benchmarks/results/<name>.json``, or under ``key`` of the results
    already there (a benchmark with subcommands keeps one entry per subcommand)."""
    if key is not None:
        result = {**saved(name), key: result}
    path = RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path


def printer(quiet: bool) -> Callable[[str], None]:
    """``print`` (flushed) for the human report, or nothing with ``--json``."""

    def say(msg: str) -> None:
        if not quiet:
            print(msg, flush=True)

    return say


def shared_paths(shared_data: str) -> tuple[Path, Path] | None:
    """The shared corpus's passages and barexam_dev QA files under ``shared_data``; None (after
    one line on stderr) when the passages are not there."""
    import sys

    data = Path(shared_data)
    passages = data / "corpus" / "passages.jsonl"
    if not passages.exists():
        print(f"error: {passages} not found (give --shared-data)", file=sys.stderr)
        return None
    return passages, data / "qa" / "barexam_dev.jsonl"
