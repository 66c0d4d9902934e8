"""Machine conditions read from fixture /proc and /sys trees, and from trees
with files missing or garbled (as in containers)."""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

import pytest
from benchresults import ran
from hypothesis import given, settings
from hypothesis import strategies as st

from treeguard.bench import BenchResult, MachineMismatchError, compare, conditions

CPUINFO_X86 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13 64-Core Processor
cpu MHz\t\t: 2449.998

processor\t: 1
model name\t: AMD EPYC 7B13 64-Core Processor
"""

CPUINFO_ARM = """processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd

Hardware\t: Graviton
"""


def _read(root: Path) -> dict[str, Any]:
    """The conditions under ``root``, for a git directory that does not exist
    (git is not even started)."""
    return conditions(root, repo=root / "no-such-directory")


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


@pytest.fixture
def machine(tmp_path: Path) -> Path:
    return _tree(
        tmp_path,
        {
            "proc/cpuinfo": CPUINFO_X86,
            "proc/self/status": "Name:\tpython\nCpus_allowed_list:\t0-3,8\n",
            "proc/loadavg": "1.50 0.75 0.25 3/412 9999\n",
            "proc/meminfo": "MemTotal:       16384 kB\nMemFree: 1 kB\nMemAvailable:    8192 kB\n",
            "sys/fs/cgroup/cpu.max": "150000 100000\n",
            "sys/fs/cgroup/memory.max": "4294967296\n",
            "sys/devices/system/cpu/cpu0/cpufreq/scaling_governor": "performance\n",
            "sys/devices/system/cpu/cpu0/cpufreq/scaling_cur_freq": "2400000\n",
            "sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq": "3500000\n",
        },
    )


def test_a_full_fixture_machine(machine: Path) -> None:
    c = conditions(machine)
    assert c["cpu_model"] == "AMD EPYC 7B13 64-Core Processor"
    assert (c["affinity_cores"], c["cgroup_cpu_quota"], c["usable_cores"]) == (5, 1.5, 2)
    assert (c["governor"], c["mhz"], c["max_mhz"]) == ("performance", 2400.0, 3500.0)
    assert c["load"] == {"1m": 1.5, "5m": 0.75, "15m": 0.25, "runnable": 3}
    assert c["memory"] == {
        "total_bytes": 16384 * 1024,
        "available_bytes": 8192 * 1024,
        "cgroup_limit_bytes": 4294967296,
    }
    assert {"jax", "backend", "x64", "matmul_precision", "xla_flags", "git_commit"} <= set(c)


def test_cgroup_v1_quota_and_an_unlimited_v2(tmp_path: Path) -> None:
    v1 = _tree(
        tmp_path / "v1",
        {
            "sys/fs/cgroup/cpu/cpu.cfs_quota_us": "300000\n",
            "sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000\n",
        },
    )
    c = _read(v1)
    assert (c["cgroup_cpu_quota"], c["usable_cores"], c["affinity_cores"]) == (3.0, 3, None)
    unlimited = _tree(
        tmp_path / "v1u",
        {
            "sys/fs/cgroup/cpu/cpu.cfs_quota_us": "-1\n",
            "sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000\n",
        },
    )
    assert _read(unlimited)["cgroup_cpu_quota"] is None
    v2 = _tree(tmp_path / "v2", {"sys/fs/cgroup/cpu.max": "max 100000\n"})
    assert _read(v2)["cgroup_cpu_quota"] is None


def test_arm_cpuinfo_and_the_mhz_fallback(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"proc/cpuinfo": CPUINFO_ARM})
    assert _read(root)["cpu_model"] == "Graviton"
    c = _read(_tree(tmp_path / "x", {"proc/cpuinfo": CPUINFO_X86}))
    assert (c["governor"], c["mhz"], c["max_mhz"]) == (None, 2449.998, None)


def test_nothing_readable_gives_nones(tmp_path: Path) -> None:
    c = conditions(tmp_path / "empty")
    for key in (
        "affinity_cores",
        "cgroup_cpu_quota",
        "usable_cores",
        "governor",
        "mhz",
        "max_mhz",
        "load",
    ):
        assert c[key] is None, key
    assert c["memory"] == {"total_bytes": None, "available_bytes": None, "cgroup_limit_bytes": None}


def test_a_directory_where_a_file_should_be(tmp_path: Path) -> None:
    (tmp_path / "proc" / "loadavg").mkdir(parents=True)
    (tmp_path / "proc" / "cpuinfo").mkdir(parents=True)
    c = _read(tmp_path)
    # no model in the fixture: the running machine's processor name, if it has one
    assert c["load"] is None and c["cpu_model"] == (platform.processor() or None)


FILES = [
    "proc/cpuinfo",
    "proc/self/status",
    "proc/loadavg",
    "proc/meminfo",
    "sys/fs/cgroup/cpu.max",
    "sys/fs/cgroup/memory.max",
    "sys/devices/system/cpu/cpu0/cpufreq/scaling_cur_freq",
]


@given(st.sampled_from(FILES), st.text(max_size=200))
@settings(max_examples=80, deadline=None)
def test_garbled_files_never_crash(
    tmp_path_factory: pytest.TempPathFactory, rel: str, text: str
) -> None:
    _read(_tree(tmp_path_factory.mktemp("g"), {rel: text}))


@pytest.mark.parametrize(
    ("text", "count"),
    [("0", 1), ("0-3", 4), ("0-3,8,10-11", 7), ("", None), ("3-1", None), ("a-b", None)],
)
def test_cpu_lists(tmp_path: Path, text: str, count: int | None) -> None:
    root = _tree(tmp_path, {"proc/self/status": f"Name:\tpython\nCpus_allowed_list:\t{text}\n"})
    assert _read(root)["affinity_cores"] == count


def test_git_state_outside_a_repository(tmp_path: Path) -> None:
    c = conditions(tmp_path, repo=tmp_path)  # git runs there and finds no repository
    assert (c["git_commit"], c["git_dirty"]) == (None, None)


def _ran_on(conds: dict[str, Any]) -> BenchResult:
    return ran((1e-3,) * 10, conds)


def test_the_fingerprint_keeps_identity_not_load(machine: Path) -> None:
    # compare refuses results of two machines: the load, the commit and the
    # clock speed may differ between runs of one machine, its CPU may not
    c = conditions(machine)
    assert c["cpu_model"] == "AMD EPYC 7B13 64-Core Processor" and c["usable_cores"] == 2
    busier = c | {"load": {"1m": 9.0}, "git_commit": "other", "mhz": 1.0}
    assert compare(_ran_on(c), _ran_on(busier)).verdict == "no_change"
    with pytest.raises(MachineMismatchError, match="cpu_model"):
        compare(_ran_on(c), _ran_on(c | {"cpu_model": "Another CPU"}))
