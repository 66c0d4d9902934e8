"""Package faces inside ``_src`` whose public names resolve on first use
(PEP 562): the package imports none of the modules behind them until a name
is asked for, so reading a spec from the command line loads neither JAX nor
the writers. (``treeguard``'s own face writes the same lookup inline: it
must not import ``_src``, whose first import checks the jax version, before
a name is used.)"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping


def lazy_face(
    package: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The module-level ``__getattr__`` and ``__dir__`` of a package face.

    Args:
      package: the package's ``__name__``.
      exports: each public name and the module that defines it, relative
        to the package (``".load"``).

    Returns:
      ``(__getattr__, __dir__)``: the first imports a name's module when the
      name is first looked up and keeps the value in the package (later
      lookups skip it); the second lists the names loaded and the exports.

    Raises:
      AttributeError: from ``__getattr__``, for a name not in ``exports``.

    Example:
      >>> getattr_, dir_ = lazy_face("json", {"dumps": ".encoder"})
      >>> getattr_("nothing")
      Traceback (most recent call last):
      ...
      AttributeError: module 'json' has no attribute 'nothing'
    """

    def __getattr__(name: str) -> object:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        setattr(sys.modules[package], name, value)  # later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *exports})

    return __getattr__, __dir__
