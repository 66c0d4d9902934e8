"""``treeguard.verify``: the acceptance protocol as one call.

Describe a model with ``Model`` (pure ``init``/``apply``/``loss``, an
optional ``update`` or optax ``optimizer``, a batch spec with a symbolic
batch axis ``"B"`` and explicit tolerances), then ``run(model)`` returns a
``Report`` of nine named checks; ``treeguard verify MODULE:ATTR`` does the
same from the shell.
"""

from .._src.keys import KeyReuse as KeyReuse
from .._src.keys import KeyTrace as KeyTrace
from .._src.keys import trace_keys as trace_keys
from .._src.tolerance import Tolerance as Tolerance
from .._src.verify.checks import CHECKS as CHECKS
from .._src.verify.compare import LeafError as LeafError
from .._src.verify.compare import compare_trees as compare_trees
from .._src.verify.context import CheckResult as CheckResult
from .._src.verify.model import InvalidInput as InvalidInput
from .._src.verify.model import Model as Model
from .._src.verify.refs import References as References
from .._src.verify.report import Benchmark as Benchmark
from .._src.verify.report import Report as Report
from .._src.verify.run import record_references as record_references
from .._src.verify.run import run as run

__all__ = [
    "Benchmark",
    "CHECKS",
    "CheckResult",
    "InvalidInput",
    "KeyReuse",
    "KeyTrace",
    "LeafError",
    "Model",
    "References",
    "Report",
    "Tolerance",
    "compare_trees",
    "record_references",
    "run",
    "trace_keys",
]
