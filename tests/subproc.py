"""The one way tests start a Python subprocess.

Most tests run in process (click's ``CliRunner``, pytest's ``pytester``, the
ASGI app). A few need a real interpreter: a fresh ``XLA_FLAGS`` device count, a
process to kill, an import-time property, ``jax.distributed``. They all go
through :func:`run_python` or :func:`start_python`, which set the project on
``PYTHONPATH``, pin JAX to the CPU and bound every wait.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a child interpreter: this one's, on the CPU, with
    the project importable, plus ``extra``.

    A ``PYTHONPATH`` in ``extra`` comes first and this one's follows it: where
    the dependencies are themselves on ``PYTHONPATH`` (the TPU machine has no
    virtual environment), a child given a test's own path still imports them.
    """
    env = dict(os.environ)
    extra = dict(extra or {})
    paths = [extra.pop("PYTHONPATH", ""), str(ROOT), env.get("PYTHONPATH", "")]
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env.update(extra)
    return env


def run_python(
    code: str,
    *args: str,
    env: Mapping[str, str] | None = None,
    timeout: float = 120,
    cwd: str | os.PathLike[str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Runs ``python -c code args...`` to the end and returns its result.

    ``env`` is added to :func:`child_env`. The child is killed after
    ``timeout`` seconds (``subprocess.TimeoutExpired`` is raised).
    """
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=cwd or ROOT,
        env=child_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def run_on_a_small_disk(
    code: str, disk: Path, options: str, *args: str, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """Runs ``python -c code args...`` as :func:`run_python` does, with a
    fresh tmpfs (``mount -o options``, such as ``size=1m``) at ``disk`` (an
    empty directory), in a private mount namespace as a mapped root user:
    a real full disk, without root and without mocks. Skips the test where
    ``unshare(1)``, ``mount(8)`` or user namespaces are missing."""
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        pytest.skip("needs unshare(1) and mount(8) to make a small file system")
    namespace = ["unshare", "--user", "--map-root-user", "--mount"]
    probe = subprocess.run([*namespace, "true"], capture_output=True, check=False, timeout=30)
    if probe.returncode != 0:
        pytest.skip("user namespaces are not allowed here")
    mount = 'mount -t tmpfs -o "$1" tmpfs "$2" && shift 2 && exec "$@"'
    return subprocess.run(
        [
            *namespace,
            "sh",
            "-c",
            mount,
            "sh",
            options,
            str(disk),
            sys.executable,
            "-c",
            code,
            *args,
        ],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def run_module(
    module: str,
    args: Sequence[str] = (),
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = 120,
    cwd: str | os.PathLike[str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Runs ``python -m module args...`` to the end, like :func:`run_python`."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd or ROOT,
        env=child_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def start_python(
    code: str,
    *args: str,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    stdin: bool = False,
) -> subprocess.Popen[str]:
    """Starts ``python -c code args...`` with piped text stdout and stderr
    (and stdin, with ``stdin=True``).

    The caller owns the process: it must wait for it or kill it (with a
    timeout) and close its pipes, as :func:`stop` does.
    """
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        cwd=cwd or ROOT,
        env=child_env(env),
        stdin=subprocess.PIPE if stdin else None,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def stop(proc: subprocess.Popen[str], *, timeout: float = 30) -> tuple[str, str]:
    """Ends a started child (kills it if it has not exited within ``timeout``),
    closes its pipes and returns what it printed."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate(timeout=30)
    return out, err


def installed(module: str) -> pytest.MarkDecorator:
    """Marks tests that run another project's command line (``python -m
    module``): skipped, saying why, where it is not installed (the lent TPU
    machine carries only the wheels a run needs); in CI (``CI`` set), where
    ``.[dev]`` installs it, a missing module fails the test instead."""
    missing = importlib.util.find_spec(module) is None and not os.environ.get("CI")
    return pytest.mark.skipif(missing, reason=f"{module} is not installed here")
