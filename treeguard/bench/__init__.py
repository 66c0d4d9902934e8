"""``treeguard.bench``: compile-aware benchmarks of JAX functions.

``run(fn, *args)`` times the phases apart (trace, lower, compile, first
call), then calibrated samples that each await the whole output, and marks
the result invalid when anything compiles while the clock runs. ``Stats.of``
gives the distribution (never a best-of), ``conditions`` the machine's state,
``compare`` a verdict with significance and effect size (on two results,
two lists of runs, or two arrays of durations, paired or not), and ``ab``
an interleaved A/B in one process: the form to gate CI with. ``save_results``
and ``load_results`` keep results in a file, ``to_html`` renders them.
"""

from .._src.bench.ab import ABResult as ABResult
from .._src.bench.ab import ab as ab
from .._src.bench.budget import Budgets as Budgets
from .._src.bench.compare import Comparison as Comparison
from .._src.bench.compare import compare as compare
from .._src.bench.conditions import conditions as conditions
from .._src.bench.report import load_results as load_results
from .._src.bench.report import save_results as save_results
from .._src.bench.report import to_html as to_html
from .._src.bench.run import BenchResult as BenchResult
from .._src.bench.run import Target as Target
from .._src.bench.run import Timer as Timer
from .._src.bench.run import run as run
from .._src.bench.stats import Stats as Stats
from .._src.errors import BenchError as BenchError
from .._src.errors import MachineMismatchError as MachineMismatchError

__all__ = [
    "ABResult",
    "BenchError",
    "BenchResult",
    "Budgets",
    "Comparison",
    "MachineMismatchError",
    "Stats",
    "Target",
    "Timer",
    "ab",
    "compare",
    "conditions",
    "load_results",
    "run",
    "save_results",
    "to_html",
]
