"""``treeguard.diagnose``: localise a divergence stage by stage, leaf by leaf,
and down to the first jaxpr equation; find where a NaN is born.

``locate(fn, *args, candidate="jit")`` finds the first equation whose value
differs between the eager reference and a candidate; ``nan_origin(fn,
*args)`` lists every equation that turns finite inputs into NaN or Inf;
``diagnose(model)`` runs the stage ladder on a ``treeguard.verify.Model``;
``record_trace`` and ``Trace.load`` carry a reference run to another machine
(``locate(fn, *args, candidate=trace)`` compares with it);
``replay_bundle(bundle, model)`` replays a flight-recorder bundle.
``treeguard diagnose MODULE:ATTR`` does it from the shell.
"""

from .._src.diagnose.divergence import Divergence as Divergence
from .._src.diagnose.divergence import Site as Site
from .._src.diagnose.ladder import STAGES as STAGES
from .._src.diagnose.ladder import diagnose as diagnose
from .._src.diagnose.locate import locate as locate
from .._src.diagnose.nan import NanSite as NanSite
from .._src.diagnose.nan import nan_origin as nan_origin
from .._src.diagnose.replay import Replay as Replay
from .._src.diagnose.replay import replay_bundle as replay_bundle
from .._src.diagnose.report import Diagnosis as Diagnosis
from .._src.diagnose.report import StageResult as StageResult
from .._src.diagnose.trace import Trace as Trace
from .._src.diagnose.trace import record_trace as record_trace
from .._src.errors import DiagnosisError as DiagnosisError
from .._src.tolerance import TolerancePolicy as TolerancePolicy

__all__ = [
    "Diagnosis",
    "DiagnosisError",
    "Divergence",
    "NanSite",
    "Replay",
    "STAGES",
    "Site",
    "StageResult",
    "TolerancePolicy",
    "Trace",
    "diagnose",
    "locate",
    "nan_origin",
    "record_trace",
    "replay_bundle",
]
