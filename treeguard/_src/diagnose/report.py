"""The diagnosis reports: a terminal summary, JSON ``treeguard.diagnose/1``,
Markdown, and one self-contained HTML page with the stage ladder, the
per-leaf errors and the culprit equation with its source line."""

from __future__ import annotations

import html
import json
import os
from pathlib import Path
from typing import Any

from ..display import printable
from ..verify.report import error_plot
from .ladder import Diagnosis, StageResult
from .locate import Divergence

FORMAT = "treeguard.diagnose/1"

_STATUS = {"pass": "[green]PASS[/]", "fail": "[bold red]FAIL[/]", "skip": "[yellow]SKIP[/]"}


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


def divergence_dict(div: Divergence) -> dict[str, Any]:
    """The JSON document of one ``locate`` result (schema ``treeguard.diagnose/1``)."""
    return {"format": FORMAT, "divergence": div.to_dict()}


def to_json(d: Diagnosis) -> str:
    return json.dumps(to_dict(d), indent=1, allow_nan=False, default=str)


def _esc(text: str) -> str:
    """Text from a model as rich markup: brackets escaped, control characters spelled out."""
    return printable(text).replace("[", r"\[")


def print_summary(d: Diagnosis, console: Any = None) -> None:
    """Prints the ladder and the failing stage's evidence with rich."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    table = Table(title=f"treeguard diagnose {d.model}", title_justify="left")
    table.add_column("stage", style="bold")
    table.add_column("status")
    table.add_column("summary")
    table.add_column("time", justify="right")
    for s in d.stages:
        table.add_row(s.name, _STATUS[s.status], _esc(s.summary), f"{s.seconds:.2f}s")
    console.print(table)
    bad = d.failed
    if bad is not None:
        console.print(f"[bold red]{bad.name}[/] evidence:")
        for line in bad.evidence[:20]:
            console.print("  " + _esc(line), soft_wrap=True)
        if len(bad.evidence) > 20:
            console.print(f"  ... and {len(bad.evidence) - 20} more (see diagnosis.md)")
        if bad.divergence is not None:
            shown = " ".join(bad.evidence)
            for line in bad.divergence.describe().splitlines():
                text = line.strip().removeprefix("note: ").removeprefix("first diverging ")
                if text and text not in shown:
                    console.print(_esc(line), soft_wrap=True)
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


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


_CSS = (
    "body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1100px;"
    "color:#1d2330;padding:0 16px}table{border-collapse:collapse;width:100%;margin:6px 0}"
    "td,th{border:1px solid #dde1e8;padding:4px 8px;text-align:left;vertical-align:top}"
    "th{background:#f4f6f9}code,.mono{font-family:ui-monospace,Menlo,Consolas,monospace;"
    "font-size:12.5px}.pass{color:#17803d}.fail{color:#c0262d;font-weight:bold}"
    ".skip{color:#9a6700}.ladder{display:flex;gap:6px;flex-wrap:wrap;margin:12px 0}"
    ".step{border:1px solid #dde1e8;border-radius:6px;padding:6px 10px}"
    ".step.fail{border-color:#c0262d;background:#fdecec}.step.pass{background:#eef8f1}"
    ".culprit{border-left:4px solid #c0262d;padding:6px 12px;background:#fff7f7}"
    ".meta{color:#5b6475}svg text{font-family:ui-monospace,Menlo,monospace;font-size:11px}"
)


def _stage_html(s: StageResult) -> str:
    return (
        f'<div class="step {s.status}"><code>{_e(s.name)}</code> '
        f'<span class="{s.status}">{s.status.upper()}</span></div>'
    )


def to_html(d: Diagnosis) -> str:
    """The ``diagnosis.html`` page: self-contained, no script, no external file."""
    failed = d.failed
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>treeguard diagnose {_e(d.model)}</title><style>{_CSS}</style></head><body>",
        f"<h1>treeguard diagnose <code>{_e(d.model)}</code></h1>",
        f'<p class="meta">{_e(d.created)} · {d.seconds:.1f} s · exit status {d.exit_code} · '
        f"jax {_e(d.environment.get('jax'))} on {_e(d.environment.get('backend'))}</p>",
        '<h2>Stage ladder</h2><div class="ladder">',
        *(_stage_html(s) for s in d.stages),
        "</div><table><tr><th>stage</th><th>status</th><th>summary</th><th>time</th></tr>",
    ]
    for s in d.stages:
        out.append(
            f'<tr><td><code>{_e(s.name)}</code></td><td class="{s.status}">{s.status.upper()}'
            f"</td><td>{_e(s.summary)}</td><td>{s.seconds:.2f}s</td></tr>"
        )
    out.append("</table>")
    if failed is not None:
        out.append(f"<h2>Evidence: <code>{_e(failed.name)}</code></h2><ul>")
        out += [f'<li class="mono">{_e(line)}</li>' for line in failed.evidence[:40]]
        out.append("</ul>")
        div = failed.divergence
        if div is not None and div.equation is not None:
            e = div.equation
            out.append(
                f'<div class="culprit"><b>{_e(e.role)}</b>: equation <code>{_e(e.index)}</code> '
                f"(<code>{_e(e.primitive)}</code>) at <code>{_e(e.source)}</code>"
                + (f", iteration {e.iteration}" if e.iteration is not None else "")
                + f'<br><span class="mono">{_e(e.text)}</span></div>'
            )
        if div is not None:
            out.append(
                "<ul>" + "".join(f"<li>{_e(x[2:])}</li>" for x in _culprit_md(div)) + "</ul>"
            )
        if failed.leaves:
            rows = [{"case": "-", "kind": "", **e.to_dict()} for e in failed.leaves]
            out.append("<h2>Per-leaf errors</h2>")
            out.append(error_plot(rows, "error / tolerance, log scale (≤ 1 passes)"))
        if failed.nan_sites:
            out.append("<h2>Where non-finite values are born</h2><ul>")
            out += [f'<li class="mono">{_e(s.describe())}</li>' for s in failed.nan_sites[:20]]
            out.append("</ul>")
    out.append("<h2>Environment</h2><table>")
    out += [
        f"<tr><td>{_e(k)}</td><td><code>{_e(v)}</code></td></tr>" for k, v in d.environment.items()
    ]
    out.append(f'</table><p class="meta">schema {_e(FORMAT)}</p></body></html>')
    return "\n".join(out) + "\n"


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
    for kind, text in (("json", to_json(d) + "\n"), ("md", to_markdown(d)), ("html", to_html(d))):
        tmp = files[kind].with_name(files[kind].name + f".tmp-{os.getpid()}")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, files[kind])
    return files
