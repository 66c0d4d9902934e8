"""The machine's conditions while a benchmark ran, and its fingerprint.

``conditions()`` extends the environment fingerprint (``treeguard.environment``)
with what moves timings: the CPU model, the cores this process may use
(affinity and the cgroup quota), the frequency governor and clock, the load
average, memory, ``XLA_FLAGS`` and the git commit. Every reader takes the
filesystem root, so tests point it at a fixture ``/proc`` and ``/sys`` tree,
and returns None for a file that is missing or unreadable (containers hide
many of them).

``fingerprint()`` keeps the keys that must match for two results' times to
be comparable; load, clock and commit are conditions, not identity.
"""

from __future__ import annotations

import math
import os
import platform
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..env import environment

#: The keys of ``conditions()`` that identify a machine and its set-up.
FINGERPRINT_KEYS: tuple[str, ...] = (
    "cpu_model",
    "usable_cores",
    "backend",
    "device_kind",
    "device_count",
    "jax",
    "jaxlib",
    "x64",
    "matmul_precision",
    "xla_flags",
)


def _read(root: str | os.PathLike[str], rel: str) -> str | None:
    try:
        return (Path(root) / rel).read_text(encoding="utf-8", errors="replace")
    except (OSError, ValueError):
        return None


def _values(text: str, name: str) -> Iterator[str]:
    """The values, stripped, of the ``name: value`` lines of a proc file."""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == name:
            yield value.strip()


def cpu_model(root: str | os.PathLike[str] = "/") -> str | None:
    """The CPU model from ``proc/cpuinfo`` (``model name``, else ``Hardware``
    or ``Processor`` as ARM kernels write it).

    Example:
      >>> cpu_model("/nonexistent") is None
      True
    """
    text = _read(root, "proc/cpuinfo") or ""
    for key in ("model name", "Hardware", "Processor", "cpu model"):
        found = next((v for v in _values(text, key) if v), None)
        if found is not None:
            return found
    return None


def parse_cpu_list(text: str) -> int | None:
    """The number of CPUs in a kernel CPU list such as ``0-3,8,10-11``.

    Example:
      >>> parse_cpu_list("0-3,8,10-11"), parse_cpu_list("junk")
      (7, None)
    """
    total = 0
    for part in text.strip().split(","):
        lo, sep, hi = part.strip().partition("-")
        try:
            a = int(lo)
            b = int(hi) if sep else a
        except ValueError:
            return None
        if b < a or a < 0:
            return None
        total += b - a + 1
    return total or None


def affinity_cores(root: str | os.PathLike[str] = "/") -> int | None:
    """The CPUs this process may run on (``Cpus_allowed_list`` of
    ``proc/self/status``).

    Example:
      >>> affinity_cores("/nonexistent") is None
      True
    """
    text = _read(root, "proc/self/status") or ""
    allowed = next(_values(text, "Cpus_allowed_list"), None)
    return None if allowed is None else parse_cpu_list(allowed)


def cgroup_cpu_quota(root: str | os.PathLike[str] = "/") -> float | None:
    """The cgroup's CPU quota in cores (``cpu.max`` of cgroup v2, else
    ``cpu.cfs_quota_us / cpu.cfs_period_us`` of v1); None when unlimited or
    unreadable.

    Example:
      >>> cgroup_cpu_quota("/nonexistent") is None
      True
    """
    text = _read(root, "sys/fs/cgroup/cpu.max")
    if text is not None:
        parts = text.split()
        if len(parts) >= 2 and parts[0] != "max":
            try:
                quota, period = float(parts[0]), float(parts[1])
            except ValueError:
                return None
            return quota / period if quota > 0 and period > 0 else None
        return None
    quota_s = _read(root, "sys/fs/cgroup/cpu/cpu.cfs_quota_us")
    period_s = _read(root, "sys/fs/cgroup/cpu/cpu.cfs_period_us")
    if quota_s is None or period_s is None:
        return None
    try:
        quota, period = float(quota_s.strip()), float(period_s.strip())
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def usable_cores(root: str | os.PathLike[str] = "/") -> int | None:
    """The cores this process can keep busy: its affinity, capped by the
    cgroup quota (rounded up).

    Example:
      >>> usable_cores("/nonexistent") is None
      True
    """
    cores = affinity_cores(root)
    quota = cgroup_cpu_quota(root)
    if quota is not None:
        capped = max(1, math.ceil(quota - 1e-9))
        cores = capped if cores is None else min(cores, capped)
    return cores


def _khz_to_mhz(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value / 1000.0 if value > 0 else None


def cpu_frequency(root: str | os.PathLike[str] = "/") -> dict[str, Any]:
    """CPU 0's frequency governor and its current and maximum clock in MHz.

    Example:
      >>> cpu_frequency("/nonexistent")
      {'governor': None, 'mhz': None, 'max_mhz': None}
    """
    base = "sys/devices/system/cpu/cpu0/cpufreq/"
    governor = _read(root, base + "scaling_governor")
    mhz = _khz_to_mhz(_read(root, base + "scaling_cur_freq"))
    if mhz is None:
        value = next(_values(_read(root, "proc/cpuinfo") or "", "cpu MHz"), None)
        try:
            mhz = None if value is None else float(value)
        except ValueError:
            mhz = None
    return {
        "governor": governor.strip() or None if governor is not None else None,
        "mhz": mhz,
        "max_mhz": _khz_to_mhz(_read(root, base + "cpuinfo_max_freq")),
    }


def load_average(root: str | os.PathLike[str] = "/") -> dict[str, Any] | None:
    """The 1, 5 and 15 minute load averages and the runnable threads, from
    ``proc/loadavg``.

    Example:
      >>> load_average("/nonexistent") is None
      True
    """
    text = _read(root, "proc/loadavg")
    if text is None:
        return None
    parts = text.split()
    try:
        loads = [float(p) for p in parts[:3]]
        running = int(parts[3].split("/")[0]) if len(parts) > 3 else None
    except (ValueError, IndexError):
        return None
    if len(loads) != 3:
        return None
    return {"1m": loads[0], "5m": loads[1], "15m": loads[2], "runnable": running}


def memory(root: str | os.PathLike[str] = "/") -> dict[str, Any]:
    """Total and available memory in bytes (``proc/meminfo``) and the
    cgroup's memory limit (``memory.max``; None when unlimited).

    Example:
      >>> memory("/nonexistent")
      {'total_bytes': None, 'available_bytes': None, 'cgroup_limit_bytes': None}
    """
    values: dict[str, int] = {}
    for line in (_read(root, "proc/meminfo") or "").splitlines():
        name, sep, value = line.partition(":")
        fields = value.split()
        if sep and fields:
            try:
                values[name.strip()] = int(fields[0]) * (1024 if fields[1:] == ["kB"] else 1)
            except ValueError:
                continue
    limit_text = _read(root, "sys/fs/cgroup/memory.max")
    limit: int | None = None
    if limit_text is not None and limit_text.strip() not in ("", "max"):
        try:
            limit = int(limit_text.strip())
        except ValueError:
            limit = None
    return {
        "total_bytes": values.get("MemTotal"),
        "available_bytes": values.get("MemAvailable"),
        "cgroup_limit_bytes": limit,
    }


def git_state(directory: str | os.PathLike[str] = ".") -> dict[str, Any]:
    """The git commit of ``directory`` and whether its tree has changes;
    Nones outside a repository or without git.

    Example:
      >>> sorted(git_state("/"))
      ['commit', 'dirty']
    """

    def git(*args: str) -> str | None:
        try:
            proc = subprocess.run(
                ["git", *args],
                cwd=directory,
                capture_output=True,
                text=True,
                timeout=5,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return proc.stdout if proc.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None}
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit.strip(), "dirty": None if status is None else bool(status.strip())}


def conditions(
    root: str | os.PathLike[str] = "/", *, repo: str | os.PathLike[str] = "."
) -> dict[str, Any]:
    """The machine's conditions now: the environment fingerprint plus the CPU,
    cores, clock, load, memory, ``XLA_FLAGS`` and git state.

    Args:
      root: the filesystem root to read ``proc`` and ``sys`` under.
      repo: the directory whose git commit is recorded.

    Returns:
      A JSON-ready dict: every key of ``treeguard.environment()``, then
      ``cpu_model``, ``logical_cores``, ``affinity_cores``,
      ``cgroup_cpu_quota``, ``usable_cores``, ``governor``, ``mhz``,
      ``max_mhz``, ``load``, ``memory``, ``xla_flags``, ``git_commit`` and
      ``git_dirty``. An unreadable value is None.

    Example:
      >>> c = conditions("/nonexistent")
      >>> c["cpu_model"] is None or isinstance(c["cpu_model"], str), "jax" in c
      (True, True)
    """
    env: dict[str, Any] = environment()
    freq = cpu_frequency(root)
    git = git_state(repo)
    return {
        **env,
        "cpu_model": cpu_model(root) or platform.processor() or None,
        "logical_cores": os.cpu_count(),
        "affinity_cores": affinity_cores(root),
        "cgroup_cpu_quota": cgroup_cpu_quota(root),
        "usable_cores": usable_cores(root),
        "governor": freq["governor"],
        "mhz": freq["mhz"],
        "max_mhz": freq["max_mhz"],
        "load": load_average(root),
        "memory": memory(root),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "git_commit": git["commit"],
        "git_dirty": git["dirty"],
    }


def fingerprint(conds: dict[str, Any], /) -> dict[str, Any]:
    """The keys of ``conds`` that identify the machine (``FINGERPRINT_KEYS``).

    Example:
      >>> fingerprint({"cpu_model": "X", "load": {"1m": 3.0}})["cpu_model"]
      'X'
    """
    return {k: conds.get(k) for k in FINGERPRINT_KEYS}


def fingerprint_diff(a: dict[str, Any], b: dict[str, Any], /) -> list[tuple[str, Any, Any]]:
    """``(key, a's value, b's value)`` for each fingerprint key on which two
    conditions differ.

    Example:
      >>> fingerprint_diff({"cpu_model": "X"}, {"cpu_model": "Y"})
      [('cpu_model', 'X', 'Y')]
    """
    fa, fb = fingerprint(a), fingerprint(b)
    return [(k, fa[k], fb[k]) for k in FINGERPRINT_KEYS if fa[k] != fb[k]]
