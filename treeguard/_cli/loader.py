"""The one loader of ``MODULE:ATTR`` for every command that takes a model.

- The current directory is on ``sys.path`` (as uvicorn and pytest put it), so
  ``treeguard verify mymodel:model`` beside ``mymodel.py`` finds it.
- A malformed target, a module that does not exist, a missing attribute or
  an object of the wrong kind (a plain or jitted function where a Model is
  expected) is a ``ConfigError`` (exit 2) naming what was expected and what
  was found.
- Model code is untrusted: a module whose import raises anything (a
  ``SyntaxError``, a ``RuntimeError``, an import of its own that is missing)
  or a factory that raises is a ``ModelCodeError`` (exit 4), and a
  ``SystemExit`` from either a ``ModelExitError``; never a traceback, never 0.
- Relative ``references=`` and ``params_spec=`` paths of the object resolve
  against the directory of the module's file, not the current directory.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from .._src.display import printable
from .._src.errors import ConfigError, ModelCodeError, ModelExitError, TreeguardError

#: Fields of a model that hold a file path, resolved against the model's module.
PATH_FIELDS = ("references", "params_spec")


def load_target(target: str, kinds: tuple[type, ...], *, what: str, command: str, fix: str) -> Any:
    """Imports ``MODULE:ATTR`` and returns the object, which must be one of
    ``kinds``, or a function of no arguments that returns one.

    Args:
      target: ``package.module:attribute``; the attribute may be dotted.
      kinds: the types the object may have.
      what: their public names, for messages (``"treeguard.verify.Model"``).
      command: the command, for the usage hint (``"verify"``).
      fix: the hint for an object of another kind.

    Returns:
      The object; a model's relative ``references`` and ``params_spec``
      resolved against its module's directory.

    Raises:
      ConfigError: for a malformed target, a module that does not exist, a
        missing attribute or an object of another kind.
      ModelCodeError: if importing the module or calling the factory raised.
      ModelExitError: if either raised ``SystemExit``.

    Example:
      >>> from treeguard.verify import Model
      >>> kw = dict(what="treeguard.verify.Model", command="verify", fix="...")
      >>> load_target("treeguard.examples.mlp:model", (Model,), **kw).name
      'treeguard.examples.mlp:model'
      >>> load_target("treeguard.examples.mlp:loss", (Model,), **kw)
      Traceback (most recent call last):
      ...
      treeguard.ConfigError: treeguard.examples.mlp:loss is a function of (params, batch), ...
    """
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(
            f"{printable(target)!r} is not MODULE:ATTR",
            hint=f"treeguard {command} treeguard.examples.mlp:model",
        )
    module = _import(module_name, target)
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            names = _names_of_kind(module, kinds)
            hint = f"the {what} objects in {module_name} are {names}" if names else fix
            raise ConfigError(
                f"module {module_name!r} has no attribute {printable(attr)!r}", hint=hint
            ) from None
    if not isinstance(obj, kinds):
        if not _is_factory(obj):
            raise ConfigError(
                f"{printable(target)} is {_kind_of(obj)}, not a {what}",
                hint=f"{fix}; a function of no arguments that returns one also works",
            )
        obj = _call_factory(obj, target)
        if not isinstance(obj, kinds):
            raise ConfigError(
                f"{printable(target)}() returned {_kind_of(obj)}, not a {what}", hint=fix
            )
    return _anchor_paths(obj, module)


def load_model(target: str, *, command: str) -> Any:
    """The ``treeguard.verify.Model`` at ``MODULE:ATTR`` (see ``load_target``).

    Example:
      >>> load_model("treeguard.examples.mlp:model", command="verify").batch_size
      8
    """
    from .._src.verify.model import Model  # imports JAX: only once a model is asked for

    return load_target(
        target,
        (Model,),
        what="treeguard.verify.Model",
        command=command,
        fix="describe the model with treeguard.verify.Model(init=..., apply=..., loss=..., ...)",
    )


def _import(module_name: str, target: str) -> Any:
    here = os.getcwd()
    if here not in sys.path:
        sys.path.insert(0, here)  # as uvicorn and pytest do: a module beside the cwd is found
    try:
        return importlib.import_module(module_name)
    except TreeguardError:
        raise  # the model's own contract refused at import (a bad Model(...)): its message
    except ModuleNotFoundError as e:
        if e.name is not None and (module_name == e.name or module_name.startswith(e.name + ".")):
            raise ConfigError(
                f"cannot import module {module_name!r}: no module named {e.name!r}",
                hint=f"treeguard looks in the current directory ({printable(here)}) and on "
                "sys.path; run it where the module's file or package lies, or install it",
            ) from None
        raise _model_code_error(e, target, "import", f"importing {module_name!r}") from e
    except SystemExit as e:
        raise _model_exit_error(e, target, "import", f"importing {module_name!r}") from None
    except Exception as e:
        raise _model_code_error(e, target, "import", f"importing {module_name!r}") from e


def _call_factory(factory: Any, target: str) -> Any:
    try:
        return factory()
    except TreeguardError:
        raise  # a model the factory built and treeguard refused: its own message
    except SystemExit as e:
        raise _model_exit_error(e, target, "factory", f"calling {target}()") from None
    except Exception as e:
        raise _model_code_error(e, target, "factory", f"calling {target}()") from e


def _where(error: BaseException) -> str:
    """`` at FILE:LINE`` of the innermost frame of ``error``, or ``""``."""
    if isinstance(error, SyntaxError) and error.filename:
        return ""  # its message names the file and line itself
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return ""
    last = frames[-1]
    return f" at {last.filename}:{last.lineno}"


def _model_code_error(error: BaseException, target: str, stage: str, doing: str) -> ModelCodeError:
    cause = type(error).__name__
    return ModelCodeError(
        f"{printable(doing)} raised {cause}: {_their_text(error, _where(error))}",
        target=target,
        stage=stage,
        cause=cause,
        hint="fix the model's code; treeguard runs nothing of the model before this",
    )


def _their_text(error: BaseException, where: str) -> str:
    r"""The model's own message, then ``where``: its control characters spelled
    out, and its lines, if several, kept as lines, each indented under ours, so
    that none reads as a line of treeguard's (a forged ``hint:``).

    Example:
      >>> print(_their_text(ValueError("Non-exhaustive filters:\nState(\x1b[2J)"), " at m.py:3"))
      Non-exhaustive filters:
        State(\x1b[2J) at m.py:3
    """
    text = printable(str(error).strip("\n"), newlines=True)
    return text.replace("\n", "\n  ") + printable(where)


def _model_exit_error(error: SystemExit, target: str, stage: str, doing: str) -> ModelExitError:
    return ModelExitError(
        f"{printable(doing)} raised SystemExit({printable(repr(error.code))})"
        f"{printable(_where(error))}: the model's code ended the run before it began",
        target=target,
        stage=stage,
        code=error.code,
        hint="a model's module must not call sys.exit() (an argparse parse at import, a "
        "helper's error path); guard a script's entry point with if __name__ == '__main__'",
    )


def _is_factory(obj: Any) -> bool:
    """Whether ``obj`` is a function (not a class, not jitted) callable with no arguments."""
    if isinstance(obj, type) or _is_jitted(obj) or not callable(obj):
        return False
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return False
    return all(
        p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        for p in sig.parameters.values()
    )


def _is_jitted(obj: Any) -> bool:
    return callable(obj) and hasattr(obj, "lower") and hasattr(obj, "trace")


def _kind_of(obj: Any) -> str:
    """What ``obj`` is, for a message: ``a function of (params, batch)``."""
    if isinstance(obj, type):
        return f"the class {obj.__module__}.{obj.__qualname__}"
    if callable(obj):
        try:
            params = "(" + ", ".join(inspect.signature(obj).parameters) + ")"
        except (TypeError, ValueError):
            params = ""
        kind = "a jitted function (jax.jit)" if _is_jitted(obj) else "a function"
        return f"{kind} of {params}" if params else kind
    return f"a {type(obj).__name__}"


def _names_of_kind(module: Any, kinds: tuple[type, ...]) -> list[str]:
    return sorted(n for n, v in vars(module).items() if isinstance(v, kinds))


def _anchor_paths(obj: Any, module: Any) -> Any:
    """``obj`` with its relative path fields resolved against ``module``'s directory."""
    file = getattr(module, "__file__", None)
    if file is None or not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        return obj
    base = Path(file).resolve().parent
    changes = {}
    for name in PATH_FIELDS:
        value = getattr(obj, name, None)
        if isinstance(value, str | os.PathLike) and not os.path.isabs(os.fspath(value)):
            changes[name] = base / os.fspath(value)
    return dataclasses.replace(obj, **changes) if changes else obj
