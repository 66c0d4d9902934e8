"""The artifact store (see README.md beside this file)."""

from .checks import Check as Check
from .layout import LOG_FILE as LOG_FILE
from .layout import MARKER_FILE as MARKER_FILE
from .layout import MODEL_FILE as MODEL_FILE
from .layout import POINTER_FILE as POINTER_FILE
from .layout import STATUS_FILE as STATUS_FILE
from .layout import STORE_FORMAT as STORE_FORMAT
from .log import Event as Event
from .records import STATUSES as STATUSES
from .records import UNREADABLE as UNREADABLE
from .records import CheckRecord as CheckRecord
from .records import VersionInfo as VersionInfo
from .retention import RetentionPolicy as RetentionPolicy
from .store import ArtifactStore as ArtifactStore
from .store import spec_of_version as spec_of_version
