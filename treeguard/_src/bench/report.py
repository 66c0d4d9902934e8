"""Benchmark files: JSON of schema ``treeguard.bench/1`` and an offline HTML page.

A file holds one run of one or more results and the machine's conditions
once. The HTML draws each result's histogram and phase times as inline SVG
and loads nothing from anywhere.
"""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .. import strictjson
from ..atomic import atomic_write, read_regular
from ..display import fmt_bytes, fmt_seconds
from ..errors import FormatError
from ..htmlpage import escape, key_table, page, table
from .run import BenchResult

FORMAT = "treeguard.bench/1"

#: The largest benchmark file ``load`` reads.
MAX_BYTES = 64 * 1024 * 1024


def to_document(
    results: Sequence[BenchResult], /, *, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The JSON document of ``results`` (schema ``treeguard.bench/1``).

    The first result's conditions are stored once, at the top.
    """
    conds = results[0].conditions if results else {}
    doc: dict[str, Any] = {
        "format": FORMAT,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "conditions": dict(conds),
        "results": [r.to_dict(with_conditions=False) for r in results],
    }
    doc.update(extra or {})
    return strictjson.json_ready(doc)  # type: ignore[no-any-return]


def save_results(
    path: str | os.PathLike[str],
    results: Sequence[BenchResult],
    /,
    *,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Writes ``results`` to ``path`` as JSON, atomically.

    Args:
      path: the file.
      results: the results, from one run on one machine.
      extra: more top-level keys (an A/B comparison).

    Returns:
      The path written.

    Raises:
      OSError: if the file cannot be written.

    Example:
      >>> import os, tempfile, jax.numpy as jnp
      >>> from treeguard.bench import run
      >>> r = run(jnp.sin, jnp.ones(4), samples=3, min_time=0.0)
      >>> p = save_results(os.path.join(tempfile.mkdtemp(), "b.json"), [r])
      >>> [x.name for x in load_results(p)]
      ['sin']
    """
    text = json.dumps(to_document(results, extra=extra), indent=1, allow_nan=False) + "\n"
    target = Path(path)
    atomic_write(target, text.encode("utf-8"))
    return target


def load_results(path: str | os.PathLike[str], /) -> list[BenchResult]:
    """Reads the results of a ``treeguard.bench/1`` file.

    Each result gets the file's conditions.

    Args:
      path: the file.

    Returns:
      The results, in file order.

    Raises:
      FormatError: if the file is too large, not JSON, of another or newer
        format, or a result is malformed (the message names the field).
      OSError: if the file cannot be read.
    """
    p = Path(path)
    hint = "pass a file written by `treeguard bench MODULE:ATTR --json FILE`"
    try:
        raw = read_regular(p, limit=MAX_BYTES, what="benchmark file")
    except FileNotFoundError:
        raise FormatError("no such file", context=str(p), hint=hint) from None
    doc = strictjson.loads(raw, "the benchmark file", context=str(p), hint=hint)
    return from_document(doc, where=str(p))


def from_document(doc: Any, /, *, where: str = "document") -> list[BenchResult]:
    """The results of a parsed ``treeguard.bench/1`` document.

    Raises:
      FormatError: as ``load``.
    """
    if not isinstance(doc, dict):
        raise FormatError(f"{where}: a JSON {type(doc).__name__}, not a benchmark document")
    fmt = doc.get("format")
    if fmt != FORMAT:
        if isinstance(fmt, str) and fmt.startswith("treeguard.bench/"):
            raise FormatError(
                f"{where}: format {fmt!r} is newer than {FORMAT!r}; hint: upgrade treeguard"
            )
        raise FormatError(
            f"{where}: format {fmt!r}, expected {FORMAT!r}; hint: write it with "
            "`treeguard bench MODULE:ATTR --json FILE`"
        )
    conds = doc.get("conditions")
    if not isinstance(conds, dict):
        raise FormatError(f"{where}['conditions']: expected an object")
    results = doc.get("results")
    if not isinstance(results, list) or not results:
        raise FormatError(f"{where}['results']: expected a non-empty list")
    out = []
    for i, item in enumerate(results):
        r = BenchResult.from_dict(item, where=f"{where}['results'][{i}]")
        if not r.conditions:
            r = BenchResult(**{**_fields(r), "conditions": conds})
        out.append(r)
    return out


def _fields(r: BenchResult) -> dict[str, Any]:
    return {
        k: getattr(r, k)
        for k in (
            "name",
            "status",
            "reason",
            "samples_s",
            "loops",
            "warmup",
            "phases",
            "compiles",
            "memory",
            "cost",
            "conditions",
            "meta",
            "cpu_samples_s",
        )
    }


# -- HTML -------------------------------------------------------------------------

#: The classes a bench page adds to the shared style.
_CSS = ".bad{color:#9b1c1c;font-weight:600}.ok{color:#17642b;font-weight:600}table{width:auto}"
_e = escape


def histogram_svg(result: BenchResult) -> str:
    """An SVG histogram of the samples, with the median and p95 marked."""
    s = result.stats
    h = s.histogram
    width, height, left, top, bottom = 640, 180, 40, 20, 34
    plot_w, plot_h = width - left - 10, height - top - bottom
    peak = max(*h.counts, 1)
    lo, hi = h.edges[0], h.edges[-1]
    span = hi - lo if hi > lo else 1.0
    bw = plot_w / len(h.counts)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'role="img" aria-label="histogram of {_e(result.name)}">'
    ]
    for i, c in enumerate(h.counts):
        bar = c / peak * plot_h
        parts.append(
            f'<rect x="{left + i * bw:.1f}" y="{top + plot_h - bar:.1f}" width="{bw - 1:.1f}" '
            f'height="{bar:.1f}" fill="#3b6fb6"><title>{_e(fmt_seconds(h.edges[i]))} - '
            f"{_e(fmt_seconds(h.edges[i + 1]))}: {c}</title></rect>"
        )
    for q, value, color in (("median", s.median, "#17642b"), ("p95", s.p95, "#c62828")):
        x = left + (value - lo) / span * plot_w
        parts.append(
            f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + plot_h}" stroke="{color}" '
            f'stroke-width="2"/><text x="{x + 3:.1f}" y="{top + 10}" fill="{color}">{q}</text>'
        )
    for frac in (0.0, 0.5, 1.0):
        x = left + frac * plot_w
        parts.append(
            f'<text x="{x:.1f}" y="{top + plot_h + 14}" text-anchor="middle">'
            f"{_e(fmt_seconds(lo + frac * span))}</text>"
        )
    parts.append(
        f'<text x="{left - 4}" y="{top + 8}" text-anchor="end">{peak}</text>'
        f'<text x="{left + plot_w / 2:.1f}" y="{height - 4}" text-anchor="middle">'
        "seconds per call</text></svg>"
    )
    return "".join(parts)


def phases_svg(result: BenchResult) -> str:
    """An SVG bar per phase (trace, lower, compile, first call, median call)."""
    rows = [
        ("trace", result.phases.get("trace_s")),
        ("lower", result.phases.get("lower_s")),
        ("compile", result.phases.get("compile_s")),
        ("first call", result.phases.get("first_call_s")),
        ("median call", result.stats.median),
    ]
    peak = max((v for _, v in rows if v), default=0.0) or 1.0
    width, bar_h, gap, label_w = 640, 14, 5, 90
    height = len(rows) * (bar_h + gap) + 6
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'role="img" aria-label="phases of {_e(result.name)}">'
    ]
    for i, (label, v) in enumerate(rows):
        y = 3 + i * (bar_h + gap)
        w = (v or 0.0) / peak * (width - label_w - 90)
        parts.append(
            f'<text x="{label_w - 6}" y="{y + 11}" text-anchor="end">{_e(label)}</text>'
            f'<rect x="{label_w}" y="{y}" width="{max(w, 1):.1f}" height="{bar_h}" '
            f'fill="#b26a00"/><text x="{label_w + w + 4:.1f}" y="{y + 11}">'
            f"{_e(fmt_seconds(v))}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


def to_html(results: Sequence[BenchResult], /, *, title: str = "treeguard bench") -> str:
    """A self-contained HTML page of ``results``: for each, its status,
    distribution, histogram, phases, memory and cost; then the conditions.

    Example:
      >>> import jax.numpy as jnp
      >>> from treeguard.bench import run
      >>> page = to_html([run(jnp.sin, jnp.ones(4), samples=3, min_time=0.0)])
      >>> "<svg" in page and "http" not in page.replace('http://www.w3.org/2000/svg', '')
      True
    """
    body = [f"<h1>{_e(title)}</h1>", *_summary_table(results)]
    for r in results:
        body += _result_section(r)
    conds = results[0].conditions if results else {}
    body += ["<h2>Conditions</h2>", key_table(conds.items()), f"<p>schema {_e(FORMAT)}</p>"]
    return page(title, body, css=_CSS)


#: The columns of the summary table, one row per result.
_SUMMARY_COLUMNS = (
    "benchmark",
    "status",
    "median",
    "95% CI of median",
    "p95",
    "MAD",
    "n x loops",
    "compile",
)


def _summary_table(results: Sequence[BenchResult]) -> list[str]:
    """One row per result: status, median and its interval, p95, MAD, size, compile."""
    return [table(_SUMMARY_COLUMNS, map(_summary_row, results))]


def _summary_row(r: BenchResult) -> str:
    s = r.stats
    cls = "ok" if r.valid else "bad"
    return (
        f"<tr><td>{_e(r.name)}</td><td class={cls}>{_e(r.status)}</td>"
        f"<td>{_e(fmt_seconds(s.median))}</td><td>{_e(fmt_seconds(s.median_ci[0]))} - "
        f"{_e(fmt_seconds(s.median_ci[1]))}</td><td>{_e(fmt_seconds(s.p95))}</td>"
        f"<td>{_e(fmt_seconds(s.mad))}</td><td>{s.n} x {r.loops}</td>"
        f"<td>{_e(fmt_seconds(r.compile_total_s))}</td></tr>"
    )


def _result_section(r: BenchResult) -> list[str]:
    """One result's heading, plots and table of the rest of its distribution."""
    s = r.stats
    out = [f"<h2>{_e(r.name)}</h2>"]
    if not r.valid:
        out.append(f'<p class="bad">invalid: {_e(r.reason)}</p>')
    out.append(histogram_svg(r))
    out.append(phases_svg(r))
    cells = [
        ("mean ± sd", f"{fmt_seconds(s.mean)} ± {fmt_seconds(s.sd)}"),
        ("min / max", f"{fmt_seconds(s.min)} / {fmt_seconds(s.max)}"),
        (
            "p5 / p25 / p75 / p99",
            " / ".join(fmt_seconds(v) for v in (s.p5, s.p25, s.p75, s.p99)),
        ),
        ("IQR", fmt_seconds(s.iqr)),
        ("outliers (mild / severe)", f"{s.mild_outliers} / {s.severe_outliers}"),
        ("compiles (warm-up / timed)", _compiles(r)),
    ]
    if r.memory:
        cells.append(("memory", ", ".join(f"{k} {fmt_bytes(v)}" for k, v in r.memory.items())))
    if r.flops_per_s:
        cells.append(("achieved", f"{r.flops_per_s / 1e9:.3g} GFLOP/s"))
    for k, v in r.meta.items():
        cells.append((str(k), str(v)))
    out.append(key_table(cells))
    return out


def _compiles(r: BenchResult) -> str:
    w = sum(r.compiles.get("warmup", {}).values())
    m = sum(r.compiles.get("measure", {}).values())
    return f"{w} / {m}"


def save_html(
    path: str | os.PathLike[str],
    results: Sequence[BenchResult],
    /,
    *,
    title: str = "treeguard bench",
) -> Path:
    """Writes ``to_html(results)`` to ``path`` atomically.

    Returns:
      The path written.

    Raises:
      OSError: if the file cannot be written.
    """
    target = Path(path)
    atomic_write(target, to_html(results, title=title).encode("utf-8"))
    return target
