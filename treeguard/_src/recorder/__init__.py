"""The NaN flight recorder: ``FlightRecorder`` wraps a training step
(``flight``) and writes a replayable bundle of the first step that produces
NaN or Inf (``bundle``); ``diagnose.replay`` replays one."""

from .bundle import Bundle as Bundle
from .bundle import read_bundle as read_bundle
from .flight import FlightRecorder as FlightRecorder
from .flight import RecordedStep as RecordedStep
