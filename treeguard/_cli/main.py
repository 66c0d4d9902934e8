"""The ``treeguard`` command line.

Exit codes, for every command, from the class of the error that ends it
(``treeguard._cli.failures``): 0 when the inputs match (or the check
passes), 1 when they differ (or it fails), 2 for usage errors and unreadable
input, 3 for a check that could not be made in full (``ckpt verify`` of a
file without hashes, ``diagnose`` of a divergence that vanishes when cut), 4
when a model's own code fails to import, build, or raises ``SystemExit``,
130 when interrupted, 141 when the output's reader went away (``| head``);
the one table of them is ``failures.EXIT_CODES``.

The command line starts without JAX: each command group's module is imported
when the group is used, and commands that only read files (``spec``,
``diff``, ``ckpt inspect``, ``store ls``, every ``--help``) never import it.
Output that is not a terminal is never cut at 80 columns, so a key path
reads whole on one line in a log or a pipe.
"""

from __future__ import annotations

import importlib
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from .._src.display import fmt_bytes, printable
from .console import Branch, console, print_tree, shown
from .failures import FAILED, PASSED, Group

if TYPE_CHECKING:
    from .._src.leaf import Record
    from .._src.spec import TreeSpec
    from .._src.walk import Node


def read_spec(path: Path) -> TreeSpec:
    """Reads a spec from a spec JSON file or any format a reader understands.

    Raises:
      FormatError: for a file that is neither.
      OSError: for a file that cannot be read.
    """
    from .._src.spec import TreeSpec

    if _may_be_safetensors(path):
        # the checkpoint readers (and what they import) only for a file that may need them
        from .._src.checkpoint import spec_reader

        spec = spec_reader(path)
        if spec is not None:
            return spec
    return TreeSpec.load(path)


def _may_be_safetensors(path: Path) -> bool:
    """Whether ``path`` may be a safetensors file. Its first 8 bytes are the
    header's length, little-endian, under 2**32 (the readers take at most
    100 MB), so they hold a zero byte; text (a spec's JSON) holds none.

    Raises:
      OSError: for a file that cannot be read.
    """
    with open(path, "rb") as f:
        head = f.read(8)
    return len(head) < 8 or 0 in head


def _size(record: Record) -> int | None:
    shape = record[0]
    if any(isinstance(d, str) for d in shape):
        return None
    return math.prod(int(d) for d in shape)


def _spec_tree(file: Path, spec: TreeSpec) -> Branch:
    """The lines ``treeguard spec`` prints for ``spec``, read from ``file``."""
    from .._src.leaf import summarize

    params = spec.num_params
    tree = Branch(
        [
            (printable(file), "bold"),
            (f"  {spec.num_leaves} leaves  ", ""),
            ((f"{params:,} params  " if params is not None else "symbolic dims  "), ""),
            (fmt_bytes(spec.nbytes), ""),
        ]
    )
    root = spec.structure
    if root.kind == "leaf":
        rec = spec.records[0]
        tree.add([(printable(summarize(rec[0], rec[1])), "cyan")])
    else:
        _render(root, spec.records, 0, tree)
    return tree


def _render(node: Node, records: list[Record], start: int, branch: Branch) -> None:
    from .._src.leaf import summarize
    from .._src.paths import entry_str

    off = start
    for entry, child in zip(node.entries, node.children):
        label = (printable(entry_str(entry)), "bold")
        if child.kind == "leaf":
            rec = records[off]
            n = _size(rec)
            count = f"{n:,}" if n is not None else "symbolic"
            nbytes = n * rec[1].itemsize if n is not None else None
            branch.add(
                [
                    label,
                    (" ", ""),
                    (printable(summarize(rec[0], rec[1])), "cyan"),
                    (f"  {count} params  {fmt_bytes(nbytes)}", ""),
                ]
            )
        else:
            sub = records[off : off + child.num_leaves]
            params = _sum_params(sub)
            kind = (
                child.type_name.rsplit(".", 1)[-1]
                if child.kind in ("custom", "namedtuple")
                else child.kind
            )
            sub_branch = branch.add(
                [
                    label,
                    (" ", ""),
                    (printable(kind), "magenta"),
                    (f"  {child.num_leaves} leaves", ""),
                    ((f"  {params:,} params" if params is not None else ""), ""),
                ]
            )
            _render(child, records, off, sub_branch)
        off += child.num_leaves


def _sum_params(records: list[Record]) -> int | None:
    sizes = [_size(r) for r in records]
    return None if any(s is None for s in sizes) else sum(s for s in sizes if s is not None)


class _LazyGroup(Group):
    """A group whose subcommands live in modules imported on first use.

    Its help lists each command by the summary it was given, so ``--help``
    imports none of them (a test holds each summary to its command's help).
    """

    def __init__(self, *args: Any, lazy: dict[str, tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = lazy  # command name -> ("module:attribute", the first line of its help)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.lazy or cmd_name in self.commands:
            return super().get_command(ctx, cmd_name)
        module, attr = self.lazy[cmd_name][0].split(":")
        command = getattr(importlib.import_module(module, __package__), attr)
        if not isinstance(command, click.Command):  # pragma: no cover - a wiring slip
            raise TypeError(f"{module}:{attr} is not a click command")
        self.add_command(command, cmd_name)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(len(name) for name in names)
        rows = []
        for name in names:
            if name in self.lazy and name not in self.commands:
                # its summary as a command of its own, so click shortens it as it would the real one
                command: click.Command | None = click.Command(name, help=self.lazy[name][1])
            else:
                command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(
    cls=_LazyGroup,
    lazy={
        "bench": (
            ".bench:bench",
            "Compile-aware benchmarks: `treeguard bench MODULE:ATTR`, `bench compare`, `bench ab`.",
        ),
        "ckpt": (".ckpt:ckpt", "Inspect and verify checkpoint files."),
        "diagnose": (
            ".diagnose:diagnose",
            "Localise a divergence on the Model at MODULE:ATTR, stage by stage.",
        ),
        "export": (
            ".export:export_command",
            "Export MODULE:ATTR's serving function for VERSION's params into the store.",
        ),
        "import": (
            ".importing:import_command",
            "Turn the weights in SRC into a verified treeguard checkpoint DST.",
        ),
        "keys": (".keys:keys", "Make EC key pairs and show their fingerprints."),
        "serve": (
            ".serve:serve",
            "Serve a Model over the KServe V2 protocol, plan its buckets, or hot-swap it.",
        ),
        "store": (
            ".store:store",
            "Manage an artifact store: list, verify, promote, roll back, collect garbage, repair.",
        ),
        "verify": (".verify:verify", "Run the acceptance protocol on the Model at MODULE:ATTR."),
    },
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(package_name="treeguard")
def main() -> None:
    """treeguard: contracts for JAX parameter trees."""


@main.command("spec")
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the spec as JSON.")
def spec_command(file: Path, as_json: bool) -> None:
    """Print the contract in FILE as a tree with shapes, dtypes, sizes and counts."""
    spec = read_spec(file)
    if as_json:
        click.echo(spec.to_json(), nl=False)
        return
    print_tree(_spec_tree(file, spec))


@main.command("diff")
@click.argument("expected", type=click.Path(path_type=Path))
@click.argument("actual", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the mismatches as JSON.")
@click.pass_context
def diff_command(ctx: click.Context, expected: Path, actual: Path, as_json: bool) -> None:
    """Compare two contracts and print every mismatch (EXPECTED first)."""
    from .._src.diff import mismatches
    from .._src.mismatch import format_mismatches

    e, a = read_spec(expected), read_spec(actual)
    found = mismatches(a, e)
    if as_json:
        payload: dict[str, Any] = {
            "expected": str(expected),
            "actual": str(actual),
            "match": not found,
            "mismatches": [
                {
                    "path": m.path,
                    "kind": m.kind,
                    "expected": _jsonable(m.expected),
                    "actual": _jsonable(m.actual),
                }
                for m in found
            ],
        }
        click.echo(json.dumps(payload, indent=1))
    elif found:
        console().print(
            printable(
                format_mismatches(found, expected_from=str(expected), actual_from=str(actual)),
                newlines=True,
            ),
            markup=False,
        )
    else:
        console().print(
            f"[green]match[/green]: {shown(actual)} has the contract of {shown(expected)}"
        )
    ctx.exit(FAILED if found else PASSED)


def _jsonable(x: object) -> object:
    if isinstance(x, tuple):
        return list(x)
    return x


if __name__ == "__main__":  # pragma: no cover
    main()
