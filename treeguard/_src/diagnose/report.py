"""A diagnosis and its reports: the ``StageResult`` of each stage, the
``Diagnosis`` of the ladder, and their renderings: a terminal summary, JSON
``treeguard.diagnose/1``, Markdown, and one self-contained HTML page with the
stage ladder, the per-leaf errors and the culprit equation with its source
line."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from ..atomic import atomic_write
from ..htmlpage import error_plot, escape, page, table
from ..verify.compare import LeafError
from ..verify.context import Status, by_name, result_dict
from ..verify.report import rich_escape, status_row, status_table
from .divergence import Divergence
from .nan import NanSite

FORMAT = "treeguard.diagnose/1"


@dataclasses.dataclass
class StageResult:
    """One stage's outcome.

    Attributes:
      name: the stage (one of ``STAGES``, or ``trace``).
      status: ``pass``, ``fail`` or ``skip``.
      summary: one line.
      evidence: the lines that show why.
      leaves: per-leaf errors of the comparison that failed.
      divergence: the equation-level result, when one was searched.
      nan_sites: where non-finite values are born, for a non-finite failure.
      seconds: how long it took.
    """

    name: str
    status: Status
    summary: str
    evidence: list[str] = dataclasses.field(default_factory=list)
    leaves: list[LeafError] = dataclasses.field(default_factory=list)
    divergence: Divergence | None = None
    nan_sites: list[NanSite] = dataclasses.field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return result_dict(
            self,
            leaves=[e.to_dict() for e in self.leaves],
            divergence=self.divergence.to_dict() if self.divergence else None,
            nan_sites=[s.to_dict() for s in self.nan_sites],
        )


@dataclasses.dataclass
class Diagnosis:
    """The ladder's result.

    Attributes:
      model: how the model is named.
      stages: every stage that ran, then those skipped after a failure.
      environment: the running environment's fingerprint.
      tolerances: the tolerances used.
      recorded: the trace file written, if any.
      created: when (UTC, ISO 8601).
      seconds: how long it took.
    """

    model: str
    stages: list[StageResult]
    environment: dict[str, Any]
    tolerances: dict[str, Any]
    recorded: str | None = None
    created: str = ""
    seconds: float = 0.0

    @property
    def failed(self) -> StageResult | None:
        """The first failing stage, if any."""
        return next((s for s in self.stages if s.status == "fail"), None)

    @property
    def exit_code(self) -> int:
        """0 nothing diverges, 1 a stage fails, 3 the divergence vanishes when cut."""
        bad = self.failed
        if bad is None:
            return 0
        if bad.divergence is not None and bad.divergence.exit_code == 3:
            return 3
        return 1

    def __getitem__(self, name: str) -> StageResult:
        """The result of the stage called ``name``.

        Raises:
          KeyError: naming the stages that ran.
        """
        return by_name(self.stages, name, "stage")

    def print(self, console: Any = None) -> None:
        """Prints the ladder and the failing stage's evidence (rich)."""
        print_summary(self, console)

    def to_json(self) -> str:
        """The ``diagnosis.json`` document (schema ``treeguard.diagnose/1``)."""
        return to_json(self)

    def write(self, directory: str | os.PathLike[str]) -> dict[str, Path]:
        """Writes ``diagnosis.json``, ``.md`` and ``.html`` into ``directory``.

        Raises:
          OSError: if the directory cannot be written.
        """
        return write(self, directory)


def to_dict(d: Diagnosis) -> dict[str, Any]:
    """The JSON document of a diagnosis (schema ``treeguard.diagnose/1``).

    Example:
      >>> from treeguard.examples.mlp import model
      >>> from treeguard.diagnose import diagnose
      >>> doc = to_dict(diagnose(model, stages=("data",)))
      >>> doc["format"], doc["exit_code"], doc["stages"][0]["status"]
      ('treeguard.diagnose/1', 0, 'pass')
    """
    failed = d.failed
    return {
        "format": FORMAT,
        "model": d.model,
        "exit_code": d.exit_code,
        "failed_stage": failed.name if failed else None,
        "created": d.created,
        "seconds": round(d.seconds, 6),
        "stages": [s.to_dict() for s in d.stages],
        "environment": dict(d.environment),
        "tolerances": d.tolerances,
        "recorded": d.recorded,
    }


def to_json(d: Diagnosis) -> str:
    return json.dumps(to_dict(d), indent=1, allow_nan=False, default=str)


def print_summary(d: Diagnosis, console: Any = None) -> None:
    """Prints the ladder and the failing stage's evidence with rich."""
    from rich.console import Console  # lazy: import treeguard never imports rich

    console = console or Console()
    table = status_table(f"treeguard diagnose {d.model}", "stage")
    for s in d.stages:
        status_row(table, s.name, s.status, s.summary, s.seconds)
    console.print(table)
    bad = d.failed
    if bad is not None:
        console.print(f"[bold red]{bad.name}[/] evidence:")
        for line in bad.evidence[:20]:
            console.print("  " + rich_escape(line), soft_wrap=True)
        if len(bad.evidence) > 20:
            console.print(f"  ... and {len(bad.evidence) - 20} more (see diagnosis.md)")
        if bad.divergence is not None:
            shown = " ".join(bad.evidence)
            for line in bad.divergence.describe().splitlines():
                text = line.strip().removeprefix("note: ").removeprefix("first diverging ")
                if text and text not in shown:
                    console.print(rich_escape(line), soft_wrap=True)
    if d.recorded:
        console.print(f"recorded trace: {d.recorded}")
    console.print(f"exit status {d.exit_code}")


def _md(text: str) -> str:
    return text.replace("|", r"\|")


def _culprit_md(div: Divergence) -> list[str]:
    out = [f"- candidate `{div.candidate}` against `{div.reference}`"]
    out.append(f"- outcome **{div.outcome}**, cause **{div.classification}**")
    for s in div.enclosing:
        out.append(f"- in equation `{s.index}` (`{s.primitive}`) at `{s.source}`")
    if div.equation is not None:
        e = div.equation
        out.append(
            f"- first diverging equation `{e.index}` (`{e.primitive}`) at `{e.source}`, "
            f"role **{e.role}**" + (f", iteration {e.iteration}" if e.iteration is not None else "")
        )
    if div.reaches:
        out.append(f"- reaches outputs {', '.join(f'`{p}`' for p in div.reaches)}")
    for p in div.propagators:
        out.append(f"- then `{p.index}` (`{p.primitive}`) at `{p.source}`: {p.role}")
    for k, a, b in div.environment:
        out.append(f"- environment `{k}`: `{a}` recorded, `{b}` here")
    out += [f"- note: {_md(n)}" for n in div.notes]
    return out


def to_markdown(d: Diagnosis) -> str:
    """The ``diagnosis.md`` document."""
    failed = d.failed
    out = [
        f"# treeguard diagnose `{d.model}`",
        "",
        f"**{'no divergence' if failed is None else f'first failing stage: {failed.name}'}** "
        f"(exit status {d.exit_code}) · {d.created} · {d.seconds:.1f} s · "
        f"jax {d.environment.get('jax')} on {d.environment.get('backend')}",
        "",
        "| stage | status | summary | time |",
        "|---|---|---|---|",
    ]
    for s in d.stages:
        out.append(f"| `{s.name}` | {s.status.upper()} | {_md(s.summary)} | {s.seconds:.2f}s |")
    if failed is not None:
        out += ["", f"## `{failed.name}`", ""]
        out += [f"- {_md(line)}" for line in failed.evidence[:40]]
        if failed.leaves:
            out += ["", "### Per-leaf errors", "", "| leaf | ref | max abs | max rel | beyond |"]
            out.append("|---|---|---|---|---|")
            for e in failed.leaves[:40]:
                out.append(
                    f"| `{_md(e.path or '<root>')}` | {e.summary} | {e.max_abs:.3g} | "
                    f"{e.max_rel:.3g} | {e.bad} of {e.size} |"
                )
        if failed.divergence is not None:
            out += ["", "### First diverging equation", "", *_culprit_md(failed.divergence)]
        if failed.nan_sites:
            out += ["", "### Where non-finite values are born", ""]
            out += [f"- {_md(s.describe())}" for s in failed.nan_sites[:20]]
    out += ["", "## Environment", "", "| key | value |", "|---|---|"]
    out += [f"| {k} | `{v}` |" for k, v in d.environment.items()]
    if d.recorded:
        out += ["", f"recorded trace: `{d.recorded}`"]
    out += ["", f"schema {FORMAT}", ""]
    return "\n".join(out)


_CSS = (
    ".pass{color:#17803d}.fail{color:#c0262d;font-weight:bold}"
    ".skip{color:#9a6700}.ladder{display:flex;gap:6px;flex-wrap:wrap;margin:12px 0}"
    ".step{border:1px solid #dde1e8;border-radius:6px;padding:6px 10px}"
    ".step.fail{border-color:#c0262d;background:#fdecec}.step.pass{background:#eef8f1}"
    ".culprit{border-left:4px solid #c0262d;padding:6px 12px;background:#fff7f7}"
)


def _stage_row(s: StageResult) -> str:
    """The stage's row of the ladder's table: name, status, summary, time."""
    return (
        f'<tr><td><code>{escape(s.name)}</code></td><td class="{s.status}">{s.status.upper()}'
        f"</td><td>{escape(s.summary)}</td><td>{s.seconds:.2f}s</td></tr>"
    )


def _stage_html(s: StageResult) -> str:
    return (
        f'<div class="step {s.status}"><code>{escape(s.name)}</code> '
        f'<span class="{s.status}">{s.status.upper()}</span></div>'
    )


def diagnosis_html(d: Diagnosis) -> str:
    """The ``diagnosis.html`` page: self-contained, no script, no external file."""
    failed = d.failed
    out = [
        f"<h1>treeguard diagnose <code>{escape(d.model)}</code></h1>",
        f'<p class="meta">{escape(d.created)} · {d.seconds:.1f} s · exit status {d.exit_code} · '
        f"jax {escape(d.environment.get('jax'))} on {escape(d.environment.get('backend'))}</p>",
        '<h2>Stage ladder</h2><div class="ladder">',
        *(_stage_html(s) for s in d.stages),
        "</div>",
        table(("stage", "status", "summary", "time"), map(_stage_row, d.stages)),
    ]
    if failed is not None:
        out.append(f"<h2>Evidence: <code>{escape(failed.name)}</code></h2><ul>")
        out += [f'<li class="mono">{escape(line)}</li>' for line in failed.evidence[:40]]
        out.append("</ul>")
        div = failed.divergence
        if div is not None and div.equation is not None:
            e = div.equation
            out.append(
                f'<div class="culprit"><b>{escape(e.role)}</b>: '
                f"equation <code>{escape(e.index)}</code> "
                f"(<code>{escape(e.primitive)}</code>) at <code>{escape(e.source)}</code>"
                + (f", iteration {e.iteration}" if e.iteration is not None else "")
                + f'<br><span class="mono">{escape(e.text)}</span></div>'
            )
        if div is not None:
            out.append(
                "<ul>" + "".join(f"<li>{escape(x[2:])}</li>" for x in _culprit_md(div)) + "</ul>"
            )
        if failed.leaves:
            rows = [{"case": "-", "kind": "", **e.to_dict()} for e in failed.leaves]
            out.append("<h2>Per-leaf errors</h2>")
            out.append(error_plot(rows, "error / tolerance, log scale (≤ 1 passes)"))
        if failed.nan_sites:
            out.append("<h2>Where non-finite values are born</h2><ul>")
            out += [f'<li class="mono">{escape(s.describe())}</li>' for s in failed.nan_sites[:20]]
            out.append("</ul>")
    out.append("<h2>Environment</h2><table>")
    out += [
        f"<tr><td>{escape(k)}</td><td><code>{escape(v)}</code></td></tr>"
        for k, v in d.environment.items()
    ]
    out.append(f'</table><p class="meta">schema {escape(FORMAT)}</p>')
    return page(f"treeguard diagnose {d.model}", out, css=_CSS)


def write(d: Diagnosis, directory: str | os.PathLike[str]) -> dict[str, Path]:
    """Writes ``diagnosis.json``, ``diagnosis.md`` and ``diagnosis.html`` atomically.

    Raises:
      OSError: if the directory cannot be written.
    """
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    files = {
        "json": root / "diagnosis.json",
        "md": root / "diagnosis.md",
        "html": root / "diagnosis.html",
    }
    for kind, text in (
        ("json", to_json(d) + "\n"),
        ("md", to_markdown(d)),
        ("html", diagnosis_html(d)),
    ):
        atomic_write(files[kind], text.encode("utf-8"))
    return files
