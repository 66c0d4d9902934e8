"""The self-contained HTML page every report writes (verify, diagnose, bench): one
page shell and style sheet, one escaping function, and the SVG plot of each
leaf's error over its tolerance. No script and no external file.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from typing import Any

#: The style every report page shares; a page adds its own classes.
CSS = "".join(
    (
        "body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;",
        "margin:24px auto;max-width:1100px;color:#1d2330;padding:0 16px}",
        "h1{font-size:22px;margin:0 0 4px}",
        "h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #dde1e8;padding-bottom:4px}",
        "table{border-collapse:collapse;width:100%;margin:6px 0}",
        "td,th{border:1px solid #dde1e8;padding:4px 8px;text-align:left;vertical-align:top}",
        "th{background:#f4f6f9}",
        "code,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12.5px}",
        ".meta{color:#5b6475}",
        "svg text{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:11px}",
    )
)


def escape(x: Any) -> str:
    """``x`` as text safe inside an element or a quoted attribute.

    Example:
      >>> escape('<b a="1">')
      '&lt;b a=&quot;1&quot;&gt;'
    """
    return html.escape(str(x), quote=True)


def page(title: str, body: Iterable[str], *, css: str = "") -> str:
    """A whole HTML document: ``title`` (escaped here), the shared style plus
    ``css``, and the ``body`` fragments (already HTML) one per line.

    Example:
      >>> doc = page("a < b", ["<p>hi</p>"])
      >>> "<title>a &lt; b</title>" in doc, doc.splitlines()[-2:]
      (True, ['<p>hi</p>', '</body></html>'])
    """
    head = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{escape(title)}</title>\n<style>{CSS}{css}</style></head><body>"
    )
    return "\n".join([head, *body, "</body></html>"]) + "\n"


def table(head: Sequence[str], rows: Iterable[str]) -> str:
    """A table of ``rows`` (``<tr>`` elements, already HTML) under a header
    row of the column titles ``head`` (escaped here; none when it is empty).

    Example:
      >>> table(["a", "b<c"], ["<tr><td>1</td><td>2</td></tr>"])
      '<table><tr><th>a</th><th>b&lt;c</th></tr><tr><td>1</td><td>2</td></tr></table>'
    """
    titles = "".join(f"<th>{escape(h)}</th>" for h in head)
    return "<table>" + (f"<tr>{titles}</tr>" if titles else "") + "".join(rows) + "</table>"


def key_table(pairs: Iterable[tuple[Any, Any]]) -> str:
    """A table of one row per ``(key, value)``: the key as the row's header
    cell, the value beside it, both escaped.

    Example:
      >>> key_table([("python", "3.11"), ("n", 3)])
      '<table><tr><th>python</th><td>3.11</td></tr><tr><th>n</th><td>3</td></tr></table>'
    """
    return table((), (f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in pairs))


def as_number(x: Any) -> float:
    if x in ("inf", "nan"):
        return float("inf")
    return float(x or 0.0)


def leaf_label(row: dict[str, Any]) -> str:
    case = row.get("case", "")
    kind = row.get("kind", "")
    variant = row.get("variant")
    where = f"{case} {kind}" if case != "-" else kind
    if variant:
        where += f" [{variant}]"
    return f"{where} {row.get('path') or '<root>'}"


#: How many leaves a plot draws: the worst ones; a line sums up the rest.
PLOT_ROWS = 20


def plot_rows(
    rows: list[dict[str, Any]], *, limit: int = PLOT_ROWS
) -> tuple[list[dict[str, Any]], str]:
    """The rows a plot draws (the ``limit`` worst that are not exact, worst
    first) and one line summing up the rest.

    Example:
      >>> rows = [{"ratio": 0.0}, {"ratio": 0.5}, {"ratio": 2.0, "ok": False}, {"ratio": 0.1}]
      >>> drawn, rest = plot_rows(rows, limit=2)
      >>> [r["ratio"] for r in drawn], rest
      ([2.0, 0.5], '1 more within tolerance (the worst at 0.1 of its tolerance); 1 exact')
    """
    ranked = sorted(rows, key=lambda r: -as_number(r.get("ratio")))
    inexact = [r for r in ranked if as_number(r.get("ratio")) != 0.0]
    exact = len(ranked) - len(inexact)
    drawn, rest = inexact[:limit], inexact[limit:]
    parts = []
    if rest:
        beyond = sum(1 for r in rest if not r.get("ok", True))
        head = f"{len(rest)} more" + (f", {beyond} beyond tolerance" if beyond else "")
        parts.append(
            f"{head} {'' if beyond else 'within tolerance '}(the worst at {_ratio(rest[0])} "
            "of its tolerance)"
        )
    if exact:
        parts.append(f"{exact} exact")
    return drawn, "; ".join(parts)


def _ratio(row: dict[str, Any]) -> str:
    v = as_number(row.get("ratio"))
    return "∞" if not math.isfinite(v) else f"{v:.2g}"


def error_plot(rows: list[dict[str, Any]], title: str, *, limit: int = PLOT_ROWS) -> str:
    """An SVG bar chart of the worst leaves' error over their tolerance, on a log scale.

    A bar that crosses the red line at 1 is beyond tolerance. Only the
    ``limit`` worst rows are drawn; exact rows (error 0) are not; a line
    under the plot sums up what was left out, so a model of any size keeps
    one plot of at most ``limit`` bars.
    """
    if not rows:
        return ""
    rows, rest = plot_rows(rows, limit=limit)
    if not rows:
        return f'<p class="meta">{escape(rest)}: nothing to draw</p>'
    lo_exp = -8
    ratios = [as_number(r.get("ratio", 0.0)) for r in rows]
    finite = [v for v in ratios if math.isfinite(v) and v > 0]
    hi_exp = max(1, math.ceil(math.log10(max(finite)))) if finite else 1
    hi_exp = min(hi_exp, 12)
    label_w, plot_w, bar_h, gap, top = 360, 560, 13, 4, 34
    height = top + len(rows) * (bar_h + gap) + 30 + (18 if rest else 0)
    axis = height - (18 if rest else 0)
    width = label_w + plot_w + 90

    def x_of(v: float) -> float:
        if not math.isfinite(v):
            return label_w + plot_w
        if v <= 0:
            return label_w
        e = min(max(math.log10(v), lo_exp), hi_exp)
        return label_w + (e - lo_exp) / (hi_exp - lo_exp) * plot_w

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="100%" style="max-width:{width}px" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">',
        f'<text x="0" y="14" style="font-size:13px;font-weight:600">{escape(title)}</text>',
    ]
    for e in range(lo_exp, hi_exp + 1):
        x = x_of(10.0**e)
        parts.append(
            f'<line x1="{x:.1f}" y1="{top - 6}" x2="{x:.1f}" y2="{axis - 26}" stroke="#e6e9ef"/>'
        )
        parts.append(
            f'<text x="{x:.1f}" y="{axis - 12}" text-anchor="middle" fill="#5b6475">1e{e}</text>'
        )
    for i, (r, v) in enumerate(zip(rows, ratios)):
        parts += _bar(r, v, y=top + i * (bar_h + gap), x0=label_w, x1=x_of(v), bar_h=bar_h)
    x_tol = x_of(1.0)
    parts.append(
        f'<line x1="{x_tol:.1f}" y1="{top - 10}" x2="{x_tol:.1f}" y2="{axis - 26}" '
        'stroke="#c62828" stroke-width="2" stroke-dasharray="5 3"/>'
    )
    if rest:
        parts.append(
            f'<text x="0" y="{height - 4}" fill="#5b6475">not drawn: {escape(rest)}</text>'
        )
    parts.append(
        f'<text x="{x_tol - 4:.1f}" y="{top - 12}" text-anchor="end" fill="#c62828">'
        "tolerance: |err| = atol + rtol·|ref|</text>"
    )
    parts.append("</svg>")
    return "".join(parts)


def _bar(row: dict[str, Any], v: float, *, y: float, x0: float, x1: float, bar_h: int) -> list[str]:
    """One leaf's label, bar from ``x0`` to ``x1`` (its details in a tooltip) and ratio."""
    color = "#2f8f4e" if bool(row.get("ok", True)) else "#c62828"
    label = leaf_label(row)
    if len(label) > 52:
        label = label[:49] + "..."
    text = "exact" if v == 0 else ("∞" if not math.isfinite(v) else f"{v:.2g}")
    return [
        f'<text x="{x0 - 6}" y="{y + bar_h - 2}" text-anchor="end">{escape(label)}</text>',
        f'<rect x="{x0}" y="{y}" width="{max(x1 - x0, 1.5):.1f}" height="{bar_h}" '
        f'fill="{color}" opacity="0.85"><title>{escape(label)}: max abs {row.get("max_abs")}, '
        f"max rel {row.get('max_rel')}, rtol {row.get('rtol')}, atol {row.get('atol')}"
        "</title></rect>",
        f'<text x="{x1 + 4:.1f}" y="{y + bar_h - 2}" fill="#5b6475">{escape(text)}</text>',
    ]
