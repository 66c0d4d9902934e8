"""Build-time pages: the command line and the error classes, read from the code.

A page holds a marker line and the build replaces it:

- ``<!-- treeguard: cli -->`` becomes every command of the ``treeguard``
  console script (found through its entry point, so a new command appears
  without editing a page): its usage, its help text (where each command says
  its exit codes), and a table of its arguments and options;
- ``<!-- treeguard: errors -->`` becomes a table of every exception class in
  ``treeguard``'s errors module, with its bases and the exit code the command
  line gives it.
"""

from __future__ import annotations

import html
import importlib
import inspect
import re
from importlib.metadata import entry_points
from typing import Any

import click

CLI_MARKER = "<!-- treeguard: cli -->"
ERRORS_MARKER = "<!-- treeguard: errors -->"
ERRORS_MODULE = "treeguard._src.errors"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replaces the markers of a page with the pages' generated parts."""
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_reference())
    if ERRORS_MARKER in markdown:
        markdown = markdown.replace(ERRORS_MARKER, errors_reference())
    return markdown


def _console_script() -> click.Command:
    (script,) = entry_points(group="console_scripts", name="treeguard")
    command = script.load()
    if not isinstance(command, click.Command):
        raise TypeError(
            f"the treeguard console script is {type(command).__name__}, not a click command"
        )
    return command


def cli_reference() -> str:
    """Markdown for every command of the ``treeguard`` console script."""
    root = _console_script()
    parts: list[str] = []
    _command(root, "treeguard", None, parts, depth=2)
    return "\n".join(parts)


def _command(
    command: click.Command, path: str, parent: click.Context | None, parts: list[str], depth: int
) -> None:
    ctx = click.Context(command, info_name=path.rsplit(maxsplit=1)[-1], parent=parent)
    anchor = path.replace(" ", "-")
    parts.append(f"{'#' * depth} `{path}` {{#{anchor}}}\n")
    usage = command.get_usage(ctx).removeprefix("Usage: ").strip()
    parts.append(f"```text\n{usage}\n```\n")
    if command.help:
        parts.append(_text(inspect.cleandoc(command.help)) + "\n")
    rows = [_param_row(p, ctx) for p in command.get_params(ctx)]
    rows = [r for r in rows if r is not None]
    if rows:
        parts.append("| argument or option | type | default | meaning |")
        parts.append("|---|---|---|---|")
        parts.extend(rows)
        parts.append("")
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is None or sub.hidden:
                continue
            _command(sub, f"{path} {name}", ctx, parts, depth=min(depth + 1, 4))


def _param_row(param: click.Parameter, ctx: click.Context) -> str | None:
    if isinstance(param, click.Option):
        if param.hidden:
            return None
        names = ", ".join(f"`{o}`" for o in [*param.opts, *param.secondary_opts])
        meaning = ("Required. " if param.required else "") + (param.help or "")
        default = "" if param.is_flag or param.default is None else _default(param, ctx)
    else:
        names = f"`{param.human_readable_name}`"
        meaning = "required" if param.required else "optional"
        default = ""
    kind = "flag" if isinstance(param, click.Option) and param.is_flag else param.type.name
    if isinstance(param.type, click.Choice):
        kind = "one of " + ", ".join(f"`{c}`" for c in param.type.choices)
    if getattr(param, "multiple", False) or param.nargs == -1:
        kind += ", repeatable"
    return f"| {names} | {_cell(kind)} | {_cell(default)} | {_cell(_text(meaning))} |"


def _default(param: click.Option, ctx: click.Context) -> str:
    value = param.get_default(ctx, call=False)
    # click 8.3 marks "no default" with a sentinel object of its own.
    if callable(value) or value is None or value == () or type(value).__name__ == "Sentinel":
        return ""
    return f"`{value}`"


def _text(text: str) -> str:
    # Help texts and docstring summaries are plain text (code spans aside):
    # keep brackets, underscores, stars and angle brackets literal.
    parts = text.replace("\b\n", "").replace("``", "`").split("`")
    for i in range(0, len(parts), 2):  # the even parts lie outside code spans
        parts[i] = re.sub(r"([\\*_\[\]])", r"\\\1", html.escape(parts[i], quote=False))
    return "`".join(parts)


PUBLIC_NAMESPACES = (
    "treeguard",
    "treeguard.verify",
    "treeguard.diagnose",
    "treeguard.bench",
    "treeguard.serving",
)


def _public_link(cls: type) -> str:
    """The class's name, linked to its reference entry when it has a public spelling."""
    for namespace in PUBLIC_NAMESPACES:
        module = importlib.import_module(namespace)
        if cls.__name__ in getattr(module, "__all__", ()) and getattr(module, cls.__name__) is cls:
            return f"[`{cls.__name__}`][{namespace}.{cls.__name__}]"
    return f"`{cls.__name__}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def errors_reference() -> str:
    """A table of every exception class of treeguard, with its exit code."""
    module = importlib.import_module(ERRORS_MODULE)
    # The classes present themselves as their public face's (``treeguard.X``,
    # ``treeguard.serving.X``: their ``__module__``), so they are found as the
    # exception and warning classes the module holds.
    classes = [
        obj
        for obj in vars(module).values()
        if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ != "builtins"
    ]
    classes.sort(key=lambda c: (len(c.__mro__), c.__name__))
    rows = ["| class | subclasses | exit code | meaning |", "|---|---|---|---|"]
    for cls in classes:
        bases = ", ".join(f"`{b.__name__}`" for b in cls.__bases__)
        code = getattr(cls, "exit_code", None)
        summary = (inspect.getdoc(cls) or "").split("\n\n")[0]
        exit_code = "" if code is None else str(code)
        rows.append(f"| {_public_link(cls)} | {bases} | {exit_code} | {_cell(_text(summary))} |")
    return "\n".join(rows) + "\n"
