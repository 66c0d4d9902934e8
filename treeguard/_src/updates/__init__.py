"""Checked updates: the policy (``policy``), the layout of a call's trees
(``layout``), dtype casts (``casts``), shardings on every mesh axis type
(``shardings``), the compiled step (``compiled``), and what users call:
``tree_map`` (``maps``), ``updater`` and ``apply_updates`` (``updater``).
``Updater`` and ``optimizer.OptaxStep`` each hold a ``CompiledStep``."""

from .maps import tree_map as tree_map
from .policy import Cast as Cast
from .updater import Updater as Updater
from .updater import apply_updates as apply_updates
from .updater import updater as updater
