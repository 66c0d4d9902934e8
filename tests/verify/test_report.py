"""The reports: report.json's schema, report.md, and the offline report.html."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import jax
import pytest
from rich.console import Console

from treeguard.examples import mlp
from treeguard.verify import CHECKS, CheckResult, Report, run

# one worker runs the file: the two reports it reads (two verify runs, kept in _CACHE) are made
# once, not once in each worker
pytestmark = pytest.mark.xdist_group("verify_report")

_CACHE: dict[str, Report] = {}


def _report(kind: str) -> Report:
    if kind not in _CACHE:
        model = mlp.model
        if kind == "failing":
            model = dataclasses.replace(
                model, update=lambda p, g: jax.tree.map(lambda a, b: a + 0.1 * b, p, g)
            )
        _CACHE[kind] = run(model, bench=True, name=f"mlp:{kind}")
    return _CACHE[kind]


@pytest.fixture(params=["passing", "failing"])
def report(request: pytest.FixtureRequest) -> Report:
    return _report(request.param)


def test_json_schema(report: Report, tmp_path: Path) -> None:
    files = report.write(tmp_path)
    data = json.loads(files["json"].read_text())
    assert data["format"] == "treeguard.verify-report/1"
    assert set(data) == {
        "format",
        "model",
        "passed",
        "exit_code",
        "created",
        "seconds",
        "prepared_s",
        "checks",
        "environment",
        "tolerances",
        "cases",
        "references",
        "recorded",
        "benchmark",
    }
    assert [c["name"] for c in data["checks"]] == [c.name for c in report.checks]
    for c in data["checks"]:
        assert set(c) == {"name", "status", "summary", "evidence", "rows", "seconds"}
        assert c["status"] in ("pass", "fail", "skip")
    assert data["exit_code"] == (0 if data["passed"] else 1)
    assert data["environment"]["jax"] == jax.__version__
    assert data["tolerances"] == {"default": {"rtol": 1e-5, "atol": 1e-6}}
    bench = data["benchmark"]
    assert bench["compile_s"] > 0 and bench["runs"] == len(bench["latencies_s"]) >= 20
    assert bench["p50_s"] <= bench["p90_s"] <= bench["p99_s"]


def test_failing_report_says_why() -> None:
    report = _report("failing")
    assert report.failed == ["training"] and report.exit_code == 1
    md = report.to_markdown()
    assert md.startswith("# treeguard verify `mlp:failing`: FAILED (training)\n")
    assert "| `training` | FAIL | training does not work |" in md
    assert "## `training` failed\n\n- loss went " in md
    data = json.loads(report.to_json())
    assert data["checks"][7]["evidence"][0].startswith("loss went ")


def test_markdown_lists_checks_environment_and_tolerances() -> None:
    md = _report("passing").to_markdown()
    for name in CHECKS:
        status = "SKIP" if name == "performance" else "PASS"  # the example sets no budgets
        assert f"| `{name}` | {status} |" in md
    assert "| jax | `" in md and "| default | 1e-05 | 1e-06 |" in md
    assert "## Benchmark of `jit(apply)`\n\ncompile " in md


def test_html_is_self_contained(report: Report) -> None:
    page = report.to_html()
    assert page.startswith("<!DOCTYPE html>")
    assert not re.search(r"(src|href)\s*=", page), "the page must load nothing"
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "https://" not in page and "<script" not in page
    # a plot of the errors that are not exact (on a TPU eager and jit agree bit
    # for bit, and its own references too), and the latency
    drawn = [
        name
        for name in ("regression", "transforms")
        if any(float(r.get("ratio") or 0.0) != 0.0 for r in report[name].rows)  # "inf", "nan" too
    ]
    assert page.count("<svg") == 1 + len(drawn)
    assert ("error / tolerance, log scale" in page) == bool(drawn) and "compile (apart)" in page
    headline = (
        '<p><span class="verdict pass">all checks passed</span>'
        if report.passed
        else f'<p><span class="verdict fail">failed: {", ".join(report.failed)}</span>'
    )
    assert headline in page


def test_html_verdicts() -> None:
    passing, failing = _report("passing"), _report("failing")
    assert passing.passed and failing.failed == ["training"]
    assert '<p><span class="verdict pass">all checks passed</span>' in passing.to_html()
    assert 'class="verdict fail"' not in passing.to_html()
    page = failing.to_html()
    assert '<p><span class="verdict fail">failed: training</span>' in page
    assert '<td><code>training</code></td><td><span class="verdict fail">' in page
    assert "all checks passed" not in page


def test_html_marks_leaves_beyond_tolerance() -> None:
    model = dataclasses.replace(mlp.model, init=_drifted)
    page = run(model, bench=False).to_html()
    assert 'fill="#c62828"' in page  # a red bar in the regression plot
    assert "params [&#x27;dense1&#x27;][&#x27;b&#x27;]" in page


def _drifted(key: jax.Array) -> Any:
    p = mlp.init(key)
    p["dense1"]["b"] = p["dense1"]["b"] + 1e-3
    return p


def test_terminal_table(report: Report) -> None:
    console = Console(record=True, width=200, color_system=None)
    report.print(console)
    text = console.export_text()
    for c in report.checks:
        assert re.search(rf"│ {c.name}\s+│ {c.status.upper()}\s+│", text)
    if report.passed:
        assert "all checks passed" in text
    else:
        assert "failed: training" in text and "training evidence:" in text


def test_getitem_names_the_checks() -> None:
    with pytest.raises(KeyError, match=r"no check 'kyes'; the checks are \['contract', 'keys'"):
        _report("passing")["kyes"]


def _plot(rows: list[dict[str, Any]]) -> str:
    """The error plot of a report whose one check has these rows (no run needed)."""
    check = CheckResult("transforms", "fail", "", rows=rows)
    html = Report("m", [check], environment={}, tolerances={}, cases=[]).to_html()
    start = html.index("<h2>Transforms")
    return html[start : html.index("<details>", start)]


def test_plots_draw_the_worst_leaves_and_sum_up_the_rest() -> None:
    rows = [
        {
            "case": "standard",
            "kind": "grads",
            "path": f"['layer{i}']['w']",
            "ratio": r,
            "ok": r <= 1,
        }
        for i, r in enumerate([0.0] * 300 + [1e-3 * (i + 1) for i in range(199)] + [5.0])
    ]
    svg = _plot(rows)
    drawn = list(dict.fromkeys(re.findall(r"layer\d+", svg)))  # each leaf labelled once
    assert drawn == [f"layer{i}" for i in range(499, 479, -1)]  # the worst first, 20 of them
    assert svg.count("<rect") == 20
    assert (
        "not drawn: 180 more within tolerance (the worst at 0.18 of its tolerance); 300 exact"
        in svg
    )
    exact = [{"path": f"['p{i}']", "ratio": 0.0, "ok": True} for i in range(500)]
    assert '<p class="meta">500 exact: nothing to draw</p>' in _plot(exact)
