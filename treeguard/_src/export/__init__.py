"""Models served without their Python code: ``jax.export`` artifacts kept in the store.

See ``README.md`` beside this file for the modules.
"""

from __future__ import annotations

from .api import ExportResult as ExportResult
from .api import Served as Served
from .api import export_version as export_version
from .api import served_from_store as served_from_store
from .description import Description as Description
