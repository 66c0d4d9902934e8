"""The verification report: a terminal table, ``report.json``, ``report.md`` and
a self-contained ``report.html`` whose plots are inline SVG drawn here.

The HTML loads nothing: no script, no font, no stylesheet, no image from
anywhere, so it opens offline and can be attached to a CI run as one file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..atomic import atomic_write
from ..display import printable
from ..errors import VerificationError
from ..htmlpage import as_number, error_plot, escape, leaf_label, page, table
from ..strictjson import json_ready
from .context import CheckResult, by_name

FORMAT = "treeguard.verify-report/1"

#: Exit statuses of ``treeguard verify``.
EXIT_PASS, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """A short warm benchmark of ``jit(apply)`` on the standard batch.

    Attributes:
      compile_s: lowering plus compiling, timed apart from the runs.
      latencies_s: each warm call's wall time, the result awaited.
      batch: the batch it ran on, as ``x: f32[8,2]``.
      result: the full ``treeguard.bench.BenchResult`` it came from, if any.
    """

    compile_s: float
    latencies_s: tuple[float, ...]
    batch: str
    result: Any = None

    def percentile(self, q: float) -> float:
        """The ``q``-th percentile latency in seconds."""
        return float(np.percentile(np.asarray(self.latencies_s), q)) if self.latencies_s else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "compile_s": self.compile_s,
            "runs": len(self.latencies_s),
            "p50_s": self.percentile(50),
            "p90_s": self.percentile(90),
            "p99_s": self.percentile(99),
            "mean_s": float(np.mean(self.latencies_s)) if self.latencies_s else 0.0,
            "latencies_s": list(self.latencies_s),
            "batch": self.batch,
            "bench": None if self.result is None else self.result.to_dict(with_conditions=False),
        }


def _fmt_s(s: float) -> str:
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} µs"


@dataclasses.dataclass
class Report:
    """The outcome of ``treeguard.verify.run``.

    Attributes:
      model: the model's name (``module:attr`` from the command line).
      checks: every check's result, in run order.
      environment: the environment fingerprint of this run.
      tolerances: the declared tolerances.
      cases: each case's name, batch summary, note and kind.
      references: the references file compared against, if any.
      recorded: the references file written by ``record=True``, if any.
      benchmark: the warm benchmark, if it ran.
      created: when the run started (UTC, ISO 8601).
      seconds: how long the run took.
      prepared_s: how long of it went to preparing what the checks share
        (compiling the programs while the eager reference runs), before the
        first check; each check's own time comes after.
      files: the report files written by ``write``.
    """

    model: str
    checks: list[CheckResult]
    environment: dict[str, Any]
    tolerances: dict[str, Any]
    cases: list[dict[str, Any]]
    references: str | None = None
    recorded: str | None = None
    benchmark: Benchmark | None = None
    created: str = ""
    seconds: float = 0.0
    prepared_s: float = 0.0
    files: dict[str, Path] = dataclasses.field(default_factory=dict)

    # -- verdict ------------------------------------------------------------

    @property
    def passed(self) -> bool:
        """True when no check failed (skipped checks do not fail a run)."""
        return all(c.passed for c in self.checks)

    @property
    def failed(self) -> list[str]:
        """The names of the failed checks."""
        return [c.name for c in self.checks if not c.passed]

    @property
    def exit_code(self) -> int:
        """0 when every check passed, 1 when any failed."""
        return EXIT_PASS if self.passed else EXIT_FAIL

    def raise_if_failed(self) -> None:
        """Raises when any check failed; does nothing when every check passed.

        For a test or a script that must stop on a failed verification:
        ``treeguard.verify.run(model).raise_if_failed()``.

        Raises:
          VerificationError: naming each failed check with its evidence
            (``.failed``, ``.evidence``); its ``exit_code`` is 1.

        Example:
          >>> ok = CheckResult("finite", "pass", "loss and grads are finite")
          >>> Report("mlp", [ok], {}, {}, []).raise_if_failed()
          >>> bad = CheckResult("keys", "fail", "1 key reused", ["key 0 used twice"])
          >>> Report("mlp", [ok, bad], {}, {}, []).raise_if_failed()
          Traceback (most recent call last):
          ...
          treeguard.VerificationError: treeguard verify mlp: 1 check failed: keys
            keys: key 0 used twice
          hint: ...
        """
        if self.passed:
            return
        bad = [c for c in self.checks if not c.passed]
        raise VerificationError(
            failed=[c.name for c in bad],
            evidence={c.name: c.evidence or [c.summary] for c in bad},
            context=f"treeguard verify {self.model}",
            hint="the report (Report.write or `treeguard verify`) shows every line of "
            "evidence; re-record the references with record=True only if the change is intended",
        )

    def __getitem__(self, name: str) -> CheckResult:
        """The result of the check called ``name``.

        Raises:
          KeyError: naming the checks there are.
        """
        return by_name(self.checks, name, "check")

    # -- JSON ---------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The ``report.json`` document (schema ``treeguard.verify-report/1``)."""
        return {
            "format": FORMAT,
            "model": self.model,
            "passed": self.passed,
            "exit_code": self.exit_code,
            "created": self.created,
            "seconds": round(self.seconds, 6),
            "prepared_s": round(self.prepared_s, 6),
            "checks": [c.to_dict() for c in self.checks],
            "environment": dict(self.environment),
            "tolerances": dict(self.tolerances),
            "cases": list(self.cases),
            "references": self.references,
            "recorded": self.recorded,
            "benchmark": self.benchmark.to_dict() if self.benchmark else None,
        }

    def to_json(self) -> str:
        doc = json_ready(self.to_dict(), nonfinite=_nonfinite_text)
        return json.dumps(doc, indent=1, sort_keys=False) + "\n"

    # -- Markdown -----------------------------------------------------------

    def to_markdown(self) -> str:
        """``report.md``: the check table, the evidence of failures, the environment."""
        verdict = "passed" if self.passed else f"FAILED ({', '.join(self.failed)})"
        out = [f"# treeguard verify `{self.model}`: {verdict}", ""]
        out += ["| check | status | summary |", "|---|---|---|"]
        for c in self.checks:
            out.append(f"| `{c.name}` | {c.status.upper()} | {_md(c.summary)} |")
        out.append("")
        for c in self.checks:
            if c.status == "fail":
                out += [f"## `{c.name}` failed", ""]
                out += [f"- {_md(line)}" for line in c.evidence[:40]]
                if len(c.evidence) > 40:
                    out.append(f"- ... and {len(c.evidence) - 40} more")
                out.append("")
        if self.benchmark:
            b = self.benchmark
            out += [
                "## Benchmark of `jit(apply)`",
                "",
                f"compile {_fmt_s(b.compile_s)} (apart); {len(b.latencies_s)} warm runs on "
                f"{b.batch}: p50 {_fmt_s(b.percentile(50))}, p90 {_fmt_s(b.percentile(90))}, "
                f"p99 {_fmt_s(b.percentile(99))}",
                "",
            ]
        out += ["## Environment", "", "| key | value |", "|---|---|"]
        out += [f"| {k} | `{v}` |" for k, v in self.environment.items()]
        out += ["", "## Tolerances", "", "| dtype | rtol | atol |", "|---|---|---|"]
        out += [f"| {k} | {v['rtol']:g} | {v['atol']:g} |" for k, v in self.tolerances.items()]
        out.append("")
        if self.references:
            out.append(f"References: `{self.references}`")
        if self.recorded:
            out.append(f"Recorded references: `{self.recorded}`")
        return "\n".join(out) + "\n"

    # -- HTML ---------------------------------------------------------------

    def to_html(self) -> str:
        """``report.html``: self-contained, with inline SVG plots and no network."""
        return _html(self)

    # -- files and terminal -------------------------------------------------

    def write(self, directory: str | os.PathLike[str]) -> dict[str, Path]:
        """Writes ``report.json``, ``report.md`` and ``report.html`` into ``directory``.

        Returns:
          The path of each file, by kind (``json``, ``md``, ``html``).

        Raises:
          OSError: if the directory cannot be created or written.
        """
        target = Path(directory)
        target.mkdir(parents=True, exist_ok=True)
        target = target.resolve()
        files = {
            "json": target / "report.json",
            "md": target / "report.md",
            "html": target / "report.html",
        }
        for kind, text in (
            ("json", self.to_json()),
            ("md", self.to_markdown()),
            ("html", self.to_html()),
        ):
            atomic_write(files[kind], text.encode("utf-8"))
        self.files = files
        return files

    def print(self, console: Any = None) -> None:
        """Prints the summary table (and every failure's evidence) with rich."""
        from rich.console import Console  # lazy: import treeguard never imports rich

        console = console or Console()
        table = status_table(f"treeguard verify {self.model}", "check")
        if self.prepared_s:
            table.add_row(
                "[dim](prepare)[/]",
                "",
                "[dim]compiled the shared programs while the eager reference ran[/]",
                f"{self.prepared_s:.2f}s",
            )
        for c in self.checks:
            status_row(table, c.name, c.status, c.summary, c.seconds)
        console.print(table)
        for c in self.checks:
            if c.status == "fail":
                console.print(f"[bold red]{c.name}[/] evidence:")
                for line in c.evidence[:20]:
                    console.print("  " + rich_escape(line), soft_wrap=True)
                if len(c.evidence) > 20:
                    console.print(f"  ... and {len(c.evidence) - 20} more (see report.md)")
        if self.benchmark:
            b = self.benchmark
            console.print(
                f"benchmark jit(apply): compile {_fmt_s(b.compile_s)}, {len(b.latencies_s)} warm "
                "runs, "
                f"p50 {_fmt_s(b.percentile(50))}, p99 {_fmt_s(b.percentile(99))}"
            )
        if self.recorded:
            console.print(f"recorded references: {self.recorded}")
        verdict = (
            "[green]all checks passed[/]"
            if self.passed
            else f"[bold red]failed: {', '.join(self.failed)}[/]"
        )
        console.print(f"{verdict} in {self.seconds:.1f}s")
        if "html" in self.files:
            console.print(f"report: {self.files['html']}", soft_wrap=True)


#: How a result's status reads in a terminal table.
STATUS_MARKUP = {"pass": "[green]PASS[/]", "fail": "[bold red]FAIL[/]", "skip": "[yellow]SKIP[/]"}


def status_table(title: str, column: str) -> Any:
    """A rich table of results, one row each (``status_row``): ``column``
    (the check or stage), status, summary and time."""
    from rich.table import Table  # lazy: import treeguard never imports rich

    table = Table(title=title, title_justify="left")
    table.add_column(column, style="bold")
    table.add_column("status")
    table.add_column("summary")
    table.add_column("time", justify="right")
    return table


def status_row(table: Any, name: str, status: str, summary: str, seconds: float) -> None:
    """One result's row in a ``status_table``."""
    table.add_row(name, STATUS_MARKUP[status], rich_escape(summary), f"{seconds:.2f}s")


def rich_escape(text: str) -> str:
    """Text from a model (an exception's message) as rich markup: brackets
    escaped and control characters spelled out."""
    from rich.markup import escape  # lazy: import treeguard never imports rich

    return escape(printable(text))


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _nonfinite_text(x: float) -> str:
    """A non-finite float as the report's JSON writes it: ``"nan"``, ``"inf"`` or ``"-inf"``."""
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


# -- HTML and SVG -----------------------------------------------------------------

_CSS = "".join(
    (
        ".verdict{font-weight:600;padding:2px 10px;border-radius:10px;display:inline-block}",
        ".pass{background:#dff3e4;color:#17642b}",
        ".fail{background:#fbe0e0;color:#9b1c1c}",
        ".skip{background:#fff3cd;color:#7a5b00}",
        "ul.ev{margin:4px 0 0;padding-left:18px}",
        "ul.ev li{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}",
    )
)


def latency_plot(bench: Benchmark) -> str:
    """An SVG histogram of warm latencies with p50/p90/p99 marked; compile time apart."""
    lat = np.asarray(bench.latencies_s) * 1e6
    if lat.size == 0:
        return ""
    width, height, left, right, top, bottom = 940, 260, 60, 230, 30, 40
    plot_w, plot_h = width - left - right, height - top - bottom
    lo, hi = float(lat.min()), float(np.percentile(lat, 99.5))
    hi = max(hi, lo * 1.01 + 1e-3)
    bins = 30
    counts, edges = np.histogram(np.clip(lat, lo, hi), bins=bins, range=(lo, hi))
    peak = max(int(counts.max()), 1)

    def x_of(v: float) -> float:
        return left + (min(max(v, lo), hi) - lo) / (hi - lo) * plot_w

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="100%" style="max-width:{width}px" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="latency distribution">',
        '<text x="0" y="14" style="font-size:13px;font-weight:600">'
        f"warm latency of jit(apply), {lat.size} runs on {escape(bench.batch)}</text>",
    ]
    bw = plot_w / bins
    parts += [
        f'<rect x="{left + i * bw + 0.5:.1f}" y="{top + plot_h - c / peak * plot_h:.1f}" '
        f'width="{bw - 1:.1f}" height="{c / peak * plot_h:.1f}" fill="#3b6fb6"><title>'
        f"{edges[i]:.1f}-{edges[i + 1]:.1f} µs: {c}</title></rect>"
        for i, c in enumerate(counts)
    ]
    parts.append(
        f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" '
        'stroke="#5b6475"/>'
    )
    for frac in (0.0, 0.25, 0.5, 0.75, 1.0):
        v = lo + frac * (hi - lo)
        parts.append(
            f'<text x="{x_of(v):.1f}" y="{top + plot_h + 16}" text-anchor="middle" '
            f'fill="#5b6475">{v:.0f}</text>'
        )
    parts.append(
        f'<text x="{left + plot_w / 2:.1f}" y="{height - 4}" text-anchor="middle" '
        'fill="#5b6475">µs per call</text>'
    )
    parts.append(
        f'<text x="{left - 8}" y="{top + 10}" text-anchor="end" fill="#5b6475">{peak}</text>'
    )
    for row, (q, color) in enumerate(((50, "#17642b"), (90, "#b26a00"), (99, "#c62828"))):
        v = float(np.percentile(lat, q))
        x = x_of(v)
        parts.append(
            f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + plot_h}" stroke="{color}" '
            'stroke-width="2"/>'
        )
        parts.append(f'<text x="{x + 3:.1f}" y="{top + 12 + row * 14}" fill="{color}">p{q}</text>')
    parts += _latency_box(
        bench, lat.size, x=left + plot_w + 30, top=top, width=right - 40, height=plot_h
    )
    parts.append("</svg>")
    return "".join(parts)


def _latency_box(
    bench: Benchmark, runs: int, *, x: float, top: int, width: int, height: int
) -> list[str]:
    """The box beside the latency histogram: compile time apart, p50/p90/p99, runs."""
    parts = [
        f'<rect x="{x}" y="{top}" width="{width}" height="{height}" fill="#f4f6f9" '
        'stroke="#dde1e8"/>'
    ]
    lines = [
        ("compile (apart)", _fmt_s(bench.compile_s)),
        ("p50", _fmt_s(bench.percentile(50))),
        ("p90", _fmt_s(bench.percentile(90))),
        ("p99", _fmt_s(bench.percentile(99))),
        ("runs", str(runs)),
    ]
    for i, (k, text) in enumerate(lines):
        y = top + 24 + i * 34
        parts.append(f'<text x="{x + 10}" y="{y}" fill="#5b6475">{escape(k)}</text>')
        parts.append(
            f'<text x="{x + 10}" y="{y + 16}" '
            f'style="font-size:14px;font-weight:600">{escape(text)}</text>'
        )
    return parts


def _html(report: Report) -> str:
    verdict_cls = "pass" if report.passed else "fail"
    verdict = "all checks passed" if report.passed else f"failed: {', '.join(report.failed)}"
    out = [
        f"<h1>treeguard verify <code>{escape(report.model)}</code></h1>",
        f'<p><span class="verdict {verdict_cls}">{escape(verdict)}</span> '
        f'<span class="meta">{escape(report.created)} · {report.seconds:.1f} s · '
        f"jax {escape(report.environment.get('jax'))} "
        f"on {escape(report.environment.get('backend'))} "
        f"({escape(report.environment.get('device_kind'))})</span></p>",
        "<h2>Checks</h2>",
        table(("check", "status", "summary and evidence", "time"), _check_rows(report)),
        *_error_sections(report),
    ]
    if report.benchmark:
        out.append("<h2>Latency of <code>jit(apply)</code></h2>")
        out.append(latency_plot(report.benchmark))
    out += _cases_table(report)
    out += _environment_tables(report)
    if report.references:
        out.append(f'<p class="meta">references: <code>{escape(report.references)}</code></p>')
    if report.recorded:
        out.append(f'<p class="meta">recorded: <code>{escape(report.recorded)}</code></p>')
    out.append(f'<p class="meta">schema {escape(FORMAT)}</p>')
    return page(f"treeguard verify {report.model}", out, css=_CSS)


def _check_rows(report: Report) -> list[str]:
    """One table row per check: its status, summary, evidence and time."""
    out: list[str] = []
    for c in report.checks:
        ev = ""
        if c.evidence:
            items = "".join(f"<li>{escape(line)}</li>" for line in c.evidence[:40])
            more = f"<li>... and {len(c.evidence) - 40} more</li>" if len(c.evidence) > 40 else ""
            ev = f'<ul class="ev">{items}{more}</ul>'
        out.append(
            f'<tr><td><code>{escape(c.name)}</code></td><td><span class="verdict {c.status}">'
            f"{c.status.upper()}</span></td><td>{escape(c.summary)}{ev}</td><td>{c.seconds:.2f}s</td></tr>"
        )
    return out


def _error_sections(report: Report) -> list[str]:
    """The error-over-tolerance plot and per-leaf table of regression and transforms."""
    out: list[str] = []
    for name, title in (
        ("regression", "Regression: max error per leaf against tolerance"),
        ("transforms", "Transforms: max error per leaf against tolerance (jit and vmap vs eager)"),
    ):
        try:
            rows = report[name].rows
        except KeyError:
            continue
        if rows:
            out.append(f"<h2>{escape(title)}</h2>")
            out.append(error_plot(rows, "error / tolerance, log scale (≤ 1 passes)"))
            out.append(
                f"<details><summary>per-leaf table ({len(rows)} leaves)</summary>"
                f"{_leaf_table(rows)}</details>"
            )
    return out


def _cases_table(report: Report) -> list[str]:
    """The cases: their kind, batch and note."""
    rows = (
        f"<tr><td><code>{escape(row['name'])}</code></td>"
        f"<td>{'negative' if row.get('negative') else 'positive'}</td>"
        f'<td class="mono">{escape(row["batch"])}</td><td>{escape(row.get("note", ""))}</td></tr>'
        for row in report.cases
    )
    return ["<h2>Cases</h2>", table(("case", "kind", "batch", "note"), rows)]


def _environment_tables(report: Report) -> list[str]:
    """This run's environment beside the references', and the tolerances."""
    recorded: dict[str, Any] = {}
    with contextlib.suppress(KeyError):
        recorded = {str(r["key"]): r.get("recorded") for r in report["environment"].rows}
    environment = (
        f"<tr><td>{escape(k)}</td><td><code>{escape(v)}</code></td>"
        f"<td><code>{escape(recorded.get(k, ''))}</code></td></tr>"
        for k, v in report.environment.items()
    )
    tolerances = (
        f"<tr><td>{escape(k)}</td><td>{v['rtol']:g}</td><td>{v['atol']:g}</td></tr>"
        for k, v in report.tolerances.items()
    )
    return [
        "<h2>Environment</h2>",
        table(("key", "this run", "references"), environment),
        "<h2>Tolerances</h2>",
        table(("dtype", "rtol", "atol"), tolerances),
    ]


def _leaf_table(rows: list[dict[str, Any]]) -> str:
    cols = ("leaf", "ref", "max abs", "max rel", "rtol", "atol", "beyond")
    body = []
    for r in sorted(rows, key=lambda r: -as_number(r.get("ratio")))[:60]:
        cls = "" if r.get("ok", True) else ' class="fail"'
        body.append(
            f'<tr{cls}><td class="mono">{escape(leaf_label(r))}</td><td '
            f'class="mono">{escape(r.get("summary"))}</td>'
            f"<td>{_g(r.get('max_abs'))}</td><td>{_g(r.get('max_rel'))}</td><td>{_g(r.get('rtol'))}</td>"
            f"<td>{_g(r.get('atol'))}</td>"
            f"<td>{escape(r.get('bad'))} / {escape(r.get('size'))}</td></tr>"
        )
    more = (
        f"<tr><td colspan=7>... and {len(rows) - 60} more leaves</td></tr>"
        if len(rows) > 60
        else ""
    )
    return table(cols, [*body, more])


def _g(x: Any) -> str:
    if isinstance(x, str):
        return escape(x)
    return f"{float(x or 0.0):.3g}"
