"""The ``treeguard bench`` commands.

- ``treeguard bench MODULE:ATTR`` (the same as ``treeguard bench run
  MODULE:ATTR``) benchmarks a ``treeguard.verify.Model`` (``apply`` and
  ``loss+grad`` per batch size, then ``update``) or a
  ``treeguard.bench.Target``;
- ``treeguard bench compare A.json B.json`` gives B's verdict against A;
- ``treeguard bench ab MODULE:ATTR MODULE:ATTR`` runs both interleaved
  (ABBA) in this process and gives the second's verdict against the first.

Exit codes, as for every treeguard command: 0 when nothing regressed (and
every result is valid), 1 for a regression or an invalid result (something
compiled while it was timed), 2 for usage errors and unreadable files, 4
when the model's own code fails to import, build, or raises ``SystemExit``.
JAX is imported only inside the commands, so ``--help`` starts without it.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
from rich import box
from rich.console import Console
from rich.table import Table

from .._src.display import fmt_bytes, fmt_range, fmt_seconds, fmt_si
from .._src.errors import BenchError, ConfigError, FormatError
from .console import console, shown
from .failures import FAILED, PASSED, Group
from .loader import load_target


class _TargetFirstGroup(Group):
    """A group whose first argument, when it names no command, is the target
    of ``run``: ``treeguard bench pkg.mod:model`` is ``treeguard bench run pkg.mod:model``."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("-h", "--help"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


def resolve(target: str) -> Any:
    """Imports ``MODULE:ATTR``: a ``treeguard.verify.Model``, a
    ``treeguard.bench.Target``, or a function of no arguments returning one
    (see ``treeguard._cli.loader.load_target``)."""
    # Both modules import JAX: only once a target is asked for.
    from .._src.bench.run import Target
    from .._src.verify.model import Model

    return load_target(
        target,
        (Model, Target),
        what="treeguard.verify.Model or a treeguard.bench.Target",
        command="bench",
        fix="wrap a function and its arguments in treeguard.bench.Target(fn, args)",
    )


#: The most fresh processes one ``bench run --processes`` starts.
MAX_PROCESSES = 100
#: The most seconds one of them may take.
PROCESS_TIMEOUT_S = 3600


def _run_in_processes(
    ctx: click.Context, target: str, processes: int, *, json_out: Path | None, html_out: Path | None
) -> None:
    """``bench run`` once in each of ``processes`` fresh interpreters, one
    after another (pyperf's way: each process draws its own memory layout
    and compiled code); every run's results are kept, under one name."""
    from .._src.bench.report import load_results, save_html, save_results  # imports JAX

    resolve(target)  # a target that cannot be loaded is named here, with its exit status
    results = []
    with tempfile.TemporaryDirectory(prefix="treeguard-bench-") as tmp:
        for i in range(processes):
            out = Path(tmp) / f"run{i}.json"
            argv = [sys.executable, "-m", "treeguard", "bench", "run", target, "--json", str(out)]
            for option in ("batch_sizes", "samples", "min_time"):
                argv += [f"--{option.replace('_', '-')}", str(ctx.params[option])]
            proc = subprocess.run(
                argv, capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S, check=False
            )
            if proc.returncode not in (PASSED, FAILED) or not out.is_file():
                first = (proc.stderr.strip().splitlines() or ["(nothing on stderr)"])[0]
                raise BenchError(
                    f"run {i + 1} of {processes} exited {proc.returncode}: {first}",
                    hint=f"run `treeguard bench run {target}` alone to see its whole output",
                )
            for r in load_results(out):
                results.append(dataclasses.replace(r, meta={**r.meta, "process": i}))
    out_console = console()
    out_console.print(
        result_table(results, f"treeguard bench {shown(target)} ({processes} processes)")
    )
    _print_invalid(out_console, results)
    out_console.print(
        "\n".join(shown(line) for line in conditions_line(results[0].conditions).splitlines()),
        soft_wrap=True,
    )
    if json_out is not None:
        out_console.print(f"results: {shown(save_results(json_out, results))}", soft_wrap=True)
    if html_out is not None:
        title = f"treeguard bench {target} ({processes} processes)"
        path = save_html(html_out, results, title=title)
        out_console.print(f"report: {shown(path)}", soft_wrap=True)
    ctx.exit(PASSED if all(r.valid for r in results) else FAILED)


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        sizes = ()
    if not sizes or any(s < 1 for s in sizes):
        raise ConfigError(f"--batch-sizes {text!r}: expected positive ints such as 1,8,64")
    return sizes


# -- rendering ----------------------------------------------------------------------


def result_table(results: Sequence[Any], title: str) -> Table:
    """The compact table of benchmark results: distribution, phases, memory."""
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for name, justify in (
        ("benchmark", "left"),
        ("median", "right"),
        ("95% CI", "right"),
        ("MAD", "right"),
        ("p95", "right"),
        ("p99", "right"),
        ("n x loops", "right"),
        ("outl.", "right"),
        ("trace", "right"),
        ("lower", "right"),
        ("compile", "right"),
        ("1st call", "right"),
        ("temp", "right"),
        ("FLOP/s", "right"),
        ("status", "left"),
    ):
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for r in results:
        s = r.stats
        table.add_row(
            shown(r.name),
            fmt_seconds(s.median),
            fmt_range(*s.median_ci),
            fmt_seconds(s.mad),
            fmt_seconds(s.p95),
            fmt_seconds(s.p99),
            f"{s.n}x{r.loops}",
            f"{s.mild_outliers}+{s.severe_outliers}",
            fmt_seconds(r.phases.get("trace_s")),
            fmt_seconds(r.phases.get("lower_s")),
            fmt_seconds(r.phases.get("compile_s")),
            fmt_seconds(r.phases.get("first_call_s")),
            fmt_bytes((r.memory or {}).get("temp")),
            fmt_si(r.flops_per_s),
            "[green]ok[/]" if r.valid else "[bold red]INVALID[/]",
        )
    return table


def conditions_line(c: dict[str, Any]) -> str:
    """The machine's conditions in two lines."""
    load = c.get("load") or {}
    mem = c.get("memory") or {}
    quota = c.get("cgroup_cpu_quota")
    freq = f"{c['mhz']:.0f} MHz" if c.get("mhz") else "clock ?"
    git = c.get("git_commit")
    git_text = "no git" if not git else f"{git[:10]}{' (dirty)' if c.get('git_dirty') else ''}"
    return (
        f"machine: {c.get('cpu_model') or '?'}, {c.get('usable_cores') or '?'} usable cores "
        f"(affinity {c.get('affinity_cores') or '?'}, cgroup quota "
        f"{'none' if quota is None else f'{quota:g}'}), governor {c.get('governor') or '?'}, "
        f"{freq}, load {load.get('1m', '?')}/{load.get('5m', '?')}/{load.get('15m', '?')}, "
        f"memory {fmt_bytes(mem.get('available_bytes'))} free of "
        f"{fmt_bytes(mem.get('total_bytes'))}\n"
        f"jax {c.get('jax')} on {c.get('backend')} ({c.get('device_kind')} x"
        f"{c.get('device_count')}), x64 {'on' if c.get('x64') else 'off'}, matmul precision "
        f"{c.get('matmul_precision') or 'default'}, XLA_FLAGS {c.get('xla_flags')!r}, "
        f"git {git_text}"
    )


def _print_invalid(console: Console, results: Sequence[Any]) -> None:
    for r in results:
        if not r.valid:
            console.print(f"[bold red]{shown(r.name)}[/] invalid: {shown(r.reason)}")


# -- commands -----------------------------------------------------------------------


@click.group(
    "bench", cls=_TargetFirstGroup, context_settings={"help_option_names": ["-h", "--help"]}
)
def bench() -> None:
    """Compile-aware benchmarks: `treeguard bench MODULE:ATTR`, `bench compare`, `bench ab`.

    `treeguard bench MODULE:ATTR` is `treeguard bench run MODULE:ATTR`.
    """


@bench.command("run")
@click.argument("target", metavar="MODULE:ATTR")
@click.option("--json", "json_out", type=click.Path(path_type=Path), help="Write the results here.")
@click.option("--html", "html_out", type=click.Path(path_type=Path), help="Write an HTML page.")
@click.option(
    "--batch-sizes", default="1,8,64", show_default=True, help="Batch sizes of a Model's suite."
)
@click.option("--samples", default=30, show_default=True, help="Timed samples per benchmark.")
@click.option("--min-time", default=0.02, show_default=True, help="Least seconds one sample lasts.")
@click.option(
    "--processes",
    type=click.IntRange(1, MAX_PROCESSES),
    default=1,
    show_default=True,
    help="Run the benchmarks in this many fresh processes, one after another; each is a run "
    "that `bench compare` weighs (9 or more per side for a verdict).",
)
@click.pass_context
def run_command(  # noqa: PLR0917 - click passes each option by name
    ctx: click.Context,
    target: str,
    json_out: Path | None,
    html_out: Path | None,
    batch_sizes: str,
    samples: int,
    min_time: float,
    processes: int,
) -> None:
    """Benchmark the Model (or Target) at MODULE:ATTR.

    A Model gets apply and loss+grad per batch size, then update. Exit 0
    when every result is valid, 1 when something compiled while it was
    timed, 2 for usage errors.
    """
    if processes > 1:
        _run_in_processes(ctx, target, processes, json_out=json_out, html_out=html_out)
        return
    from rich.progress import Progress

    from .._src.bench.conditions import conditions
    from .._src.bench.report import save_html, save_results
    from .._src.bench.run import Target, run_target
    from .._src.verify.model import Model
    from .._src.verify.performance import model_targets

    sizes = _sizes(batch_sizes)
    obj = resolve(target)
    conds = conditions()
    targets = model_targets(obj, batch_sizes=sizes) if isinstance(obj, Model) else [obj]
    results = []
    with Progress(console=console(stderr=True), transient=True) as progress:
        task = progress.add_task("benchmarking", total=len(targets))
        for t in targets:
            assert isinstance(t, Target)
            progress.update(task, description=shown(t.label))
            meta = {"target": target}
            results.append(
                run_target(t, samples=samples, min_time=min_time, conditions=conds, meta=meta)
            )
            progress.advance(task)
    out = console()
    out.print(result_table(results, f"treeguard bench {shown(target)}"))
    _print_invalid(out, results)
    out.print(
        "\n".join(shown(line) for line in conditions_line(conds).splitlines()), soft_wrap=True
    )
    if json_out is not None:
        out.print(f"results: {shown(save_results(json_out, results))}", soft_wrap=True)
    if html_out is not None:
        title = f"treeguard bench {target}"
        out.print(f"report: {shown(save_html(html_out, results, title=title))}", soft_wrap=True)
    ctx.exit(PASSED if all(r.valid for r in results) else FAILED)


def comparison_table(comparisons: Sequence[Any], title: str) -> Table:
    """One row per comparison: both medians, the change and its interval, p, verdict."""
    colour = {
        "regression": "bold red",
        "invalid": "bold red",
        "improvement": "green",
        "no_change": "green",
        "inconclusive": "yellow",
    }
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("benchmark", "base", "candidate", "change", "CI", "p", "n", "verdict"):
        table.add_column(
            name, justify="left" if name in ("benchmark", "verdict") else "right", no_wrap=True
        )
    for c in comparisons:
        lo, hi = c.ratio_ci
        verdict = f"[{colour[c.verdict]}]{c.verdict}[/]"
        if c.verdict == "inconclusive" and c.needed_samples:
            verdict += f" (~{c.needed_samples}/side)"
        table.add_row(
            shown(c.name),
            fmt_seconds(c.base_median),
            fmt_seconds(c.cand_median),
            f"{c.change:+.1%}",
            f"[{lo - 1:+.1%}, {hi - 1:+.1%}]",
            f"{c.p_value:.2g}",
            f"{c.n_base}/{c.n_cand}",
            verdict,
        )
    return table


def _gate(comparisons: Sequence[Any]) -> int:
    return FAILED if any(c.verdict in ("regression", "invalid") for c in comparisons) else PASSED


def load_runs(path: Path) -> dict[str, list[Any]]:
    """The runs of each benchmark in ``path``: a results file (which may hold
    several runs of a benchmark, one per process) or a directory of them
    (its ``*.json`` files; links and other kinds are refused by ``load``).

    Raises:
      FormatError: for a file that is not a benchmark file, or a directory
        without one.
    """
    from .._src.bench.report import load_results  # imports JAX: only once a file is read

    files = sorted(path.glob("*.json")) if path.is_dir() else [path]
    if not files:
        raise FormatError(
            "no *.json results in the directory",
            context=str(path),
            hint="write each run with treeguard bench run ... --json DIR/runN.json",
        )
    runs: dict[str, list[Any]] = {}
    for f in files:
        for r in load_results(f):
            runs.setdefault(r.name, []).append(r)
    return runs


@bench.command("compare")
@click.argument("base", type=click.Path(path_type=Path))
@click.argument("candidate", type=click.Path(path_type=Path))
@click.option("--alpha", default=0.05, show_default=True, help="Significance level.")
@click.option(
    "--min-effect", default=0.02, show_default=True, help="Smallest relative change that counts."
)
@click.option(
    "--allow-different-machines", is_flag=True, help="Compare results from different machines."
)
@click.option(
    "--clock",
    type=click.Choice(["wall", "cpu"]),
    default="wall",
    show_default=True,
    help="Compare wall time, or this process's CPU time.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the comparisons as JSON.")
@click.pass_context
def compare_command(  # noqa: PLR0917 - click passes each option by name
    ctx: click.Context,
    base: Path,
    candidate: Path,
    alpha: float,
    min_effect: float,
    allow_different_machines: bool,
    clock: str,
    as_json: bool,
) -> None:
    """Compare CANDIDATE's runs with BASE's, benchmark by benchmark.

    BASE and CANDIDATE are each a results file or a directory of them; each
    run (a process: `bench run --processes N`, or one file per run) gives
    one median, and the verdict compares the medians of the runs, so the
    variance from one process to the next is in it. Fewer than 9 runs per
    side give `inconclusive`, never a regression. Exit 0 when nothing
    regressed, 1 for a regression or an invalid result, 2 for unreadable
    files, results from different machines (without
    --allow-different-machines) or no benchmark in common.
    """
    from .._src.bench.compare import compare_runs  # imports JAX: only once the command runs

    a, b = load_runs(base), load_runs(candidate)
    common = [name for name in b if name in a]
    if not common:
        raise BenchError(
            f"{base} and {candidate} share no benchmark name ({sorted(a)} and {sorted(b)})",
            hint="compare runs of the same target",
        )
    comparisons = [
        compare_runs(
            a[name],
            b[name],
            alpha=alpha,
            min_effect=min_effect,
            allow_different_machines=allow_different_machines,
            clock=clock,
        )
        for name in common
    ]
    only = sorted(set(a) ^ set(b))
    if as_json:
        payload = {
            "format": "treeguard.bench-compare/1",
            "base": str(base),
            "candidate": str(candidate),
            "comparisons": [c.to_dict() for c in comparisons],
            "unpaired": only,
        }
        click.echo(json.dumps(payload, indent=1))
    else:
        out = console()
        title = f"treeguard bench compare {shown(base)} {shown(candidate)} (runs per side)"
        out.print(comparison_table(comparisons, title))
        for c in comparisons:
            if c.verdict in ("invalid", "inconclusive"):
                out.print(f"[bold]{shown(c.name)}[/]: {shown(c.reason)}")
        if only:
            out.print(f"not in both: {shown(', '.join(only))}")
    ctx.exit(_gate(comparisons))


@bench.command("ab")
@click.argument("target_a", metavar="A")
@click.argument("target_b", metavar="B")
@click.option("--rounds", default=30, show_default=True, help="ABBA rounds (4 samples each).")
@click.option("--min-time", default=0.02, show_default=True, help="Least seconds per sample.")
@click.option("--batch-size", type=int, default=None, help="A Model's batch (its batch_size).")
@click.option("--alpha", default=0.05, show_default=True, help="Significance level.")
@click.option(
    "--min-effect", default=0.02, show_default=True, help="Smallest relative change that counts."
)
@click.option(
    "--clock",
    type=click.Choice(["auto", "wall", "cpu"]),
    default="auto",
    show_default=True,
    help="What the verdict compares; auto is CPU time on JAX's CPU backend, else wall time.",
)
@click.option("--json", "json_out", type=click.Path(path_type=Path), help="Write both results.")
@click.pass_context
def ab_command(  # noqa: PLR0917 - click passes each option by name
    ctx: click.Context,
    target_a: str,
    target_b: str,
    rounds: int,
    min_time: float,
    batch_size: int | None,
    alpha: float,
    min_effect: float,
    clock: str,
    json_out: Path | None,
) -> None:
    """Time A and B interleaved (ABBA) in this process; B's verdict against A.

    Each of A and B is a Target, or a Model whose jit(apply) is timed on a
    batch of --batch-size. Exit 0 when B did not regress, 1 when it did (or
    a result is invalid), 2 for usage errors.
    """
    from rich.progress import Progress

    from .._src.bench.ab import ab
    from .._src.bench.report import save_results
    from .._src.bench.run import Target
    from .._src.verify.model import Model
    from .._src.verify.performance import model_batch

    def as_target(obj: Any, label: str) -> Target:
        if isinstance(obj, Target):
            return obj
        assert isinstance(obj, Model)
        params = obj.init(obj.key())
        batch = model_batch(obj, batch_size or obj.batch_size)
        return Target(obj.apply, (params, batch), name=f"{label} apply")

    ta, tb = (as_target(resolve(t), t) for t in (target_a, target_b))
    with Progress(console=console(stderr=True), transient=True) as progress:
        task = progress.add_task("A/B", total=4 * rounds)
        result = ab(
            ta.fn,
            tb.fn,
            *ta.args,
            args_b=tb.args,
            rounds=rounds,
            min_time=min_time,
            jit=ta.jit and tb.jit,
            alpha=alpha,
            min_effect=min_effect,
            names=(target_a, target_b),
            clock=clock,
            progress=lambda done, total: progress.update(task, completed=done),
        )
    out = console()
    out.print(result_table([result.a, result.b], f"treeguard bench ab (ABBA x {rounds})"))
    cmp = result.comparison
    out.print(comparison_table([cmp], f"B against A, paired by round, on the {cmp.clock} clock"))
    _print_invalid(out, [result.a, result.b])
    out.print(shown(result.comparison.describe()), soft_wrap=True)
    out.print(
        "\n".join(shown(line) for line in conditions_line(result.a.conditions).splitlines()),
        soft_wrap=True,
    )
    if json_out is not None:
        extra = {"ab": {"order": "ABBA", "rounds": rounds, **result.comparison.to_dict()}}
        path = save_results(json_out, [result.a, result.b], extra=extra)
        out.print(f"results: {shown(path)}", soft_wrap=True)
    ctx.exit(_gate([result.comparison]))


if __name__ == "__main__":
    bench()
