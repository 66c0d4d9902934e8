"""``TreeguardError``, the base of every exception: a message rendered from
its fields (context, message, hint) with an exit code; how an error is
pickled (from its fields, never through its ``__init__``) and which module
it names; and the cap on listed lines."""

from __future__ import annotations

import importlib
import pickle
from collections.abc import Sequence
from typing import Any

#: How many problems a message lists before it says how many it left out.
LISTED = 20


def cap_lines(lines: Sequence[str], *, limit: int = LISTED, indent: str = "  ") -> list[str]:
    """The first ``limit`` lines, then one line saying how many were left out.

    Example:
      >>> cap_lines(["a", "b", "c"], limit=2)
      ['a', 'b', '  ... and 1 more']
    """
    out = list(lines[:limit])
    if len(lines) > limit:
        out.append(f"{indent}... and {len(lines) - limit} more")
    return out


def rebuild(cls: type[BaseException] | str, args: tuple[Any, ...], fields: dict[str, Any]) -> Any:
    """The error (or warning) of class ``cls`` with ``args`` and ``fields`` as
    its attributes, made without calling its ``__init__``: what unpickling
    one calls (see ``by_fields``). ``cls`` may be given as
    ``"module:qualname"``, found as pickle finds a class: by importing the
    module, which must be treeguard's (``by_fields`` names no other), and
    only when the name is an exception class of treeguard's under that name
    there (defined there, or, for a pickle an older build wrote, imported
    from where it is defined now). So a pickle calls this to make nothing but an exception: an
    unpickler that admits treeguard's globals alone (as a process taking
    errors from peers it does not trust may use) admits no other module or
    class through it.

    Raises:
      pickle.UnpicklingError: for any other ``cls``, before a module
        outside treeguard is imported.

    Example:
      >>> e = rebuild("treeguard:TreeguardError", ("m: bad",),
      ...             {"message": "bad", "context": "m", "hint": None})
      >>> type(e).__name__, str(e), e.args
      ('TreeguardError', 'm: bad', ('m: bad',))
      >>> rebuild("subprocess:Popen", (), {})
      Traceback (most recent call last):
      ...
      _pickle.UnpicklingError: 'subprocess:Popen' is not an exception class of treeguard's; ...
    """
    found: object = cls
    if isinstance(cls, str):
        module, _, name = cls.partition(":")
        found = None
        if module.split(".")[0] == "treeguard":
            found = getattr(importlib.import_module(module), name, None)
        if (
            not isinstance(found, type)
            or found.__module__.split(".")[0] != "treeguard"
            or found.__qualname__ != name
        ):
            found = None  # not a class of treeguard's, or one under another name
    if not (isinstance(found, type) and issubclass(found, BaseException)):
        shown = repr(cls[:200]) if isinstance(cls, str) else repr(cls)[:200]
        raise pickle.UnpicklingError(
            f"{shown} is not an exception class of treeguard's; a pickle of a treeguard "
            "error names only treeguard's own exception classes"
        )
    err = found.__new__(found)
    err.args = args
    err.__dict__.update(fields)
    return err


def by_fields(err: BaseException) -> tuple[Any, ...]:
    """How pickle (and ``copy``) takes ``err`` apart: its class, its ``args``
    and its fields, which ``rebuild`` puts back as they were.

    Exception pickling would call ``type(err)(*err.args)``, which fails for
    any class whose ``__init__`` takes other arguments than its text (the
    keyword-only fields most treeguard errors have): a Ray replica, a
    ``multiprocessing`` worker or a ``ProcessPoolExecutor`` would then get a
    ``TypeError`` instead of the error. Its ``__cause__`` and traceback are
    left behind, as pickle leaves them for every exception.

    A class of treeguard's goes by its module and name: cloudpickle (Ray's
    pickler) would copy, by value, a class whose module this process has
    not imported yet (``treeguard.serving`` in a replica), and the copy is
    another class, which no ``except ServingError`` catches. Any other class
    (a subclass in ``__main__``) goes as pickle takes it.

    Example:
      >>> import pickle
      >>> e = pickle.loads(pickle.dumps(TreeguardError("bad", hint="fix it")))
      >>> type(e) is TreeguardError, e.hint
      (True, 'fix it')
    """
    cls = type(err)
    name = f"{cls.__module__}:{cls.__qualname__}"
    ours = cls.__module__.split(".")[0] == "treeguard"
    return rebuild, (name if ours else cls, err.args, dict(vars(err)))


def present_as(face: str, *classes: type[BaseException]) -> None:
    """Name the public face that exports each of ``classes`` as its
    ``__module__``: tracebacks then show ``treeguard.serving.ServingError``,
    and pickle finds the class there. A class no face exports keeps the
    module it is defined in, which pickle finds as well.

    Example:
      >>> class Local(Exception): ...
      >>> present_as("treeguard.examples", Local)
      >>> Local.__module__
      'treeguard.examples'
    """
    for cls in classes:
        cls.__module__ = face


class TreeguardError(Exception):
    """Base class of every error treeguard raises.

    Args:
      message: what is wrong, naming the key path and both values.
      context: where it happened (a file, a version); printed first.
      hint: the likely fix; printed as a last line ``hint: ...``.

    Attributes:
      message, context, hint: the fields the text is rendered from.
      exit_code: the command line's exit status for this error.
    """

    exit_code = 2

    def __init__(self, message: str = "", *, context: str | None = None, hint: str | None = None):
        self.message = message
        self.context = context
        self.hint = hint
        super().__init__(self._render())

    def _render(self) -> str:
        text = f"{self.context}: {self.message}" if self.context else self.message
        if self.hint:
            text += f"\nhint: {self.hint}"
        return text

    def __str__(self) -> str:
        return self._render()

    def __reduce__(self) -> tuple[Any, ...]:
        return by_fields(self)
