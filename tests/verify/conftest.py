"""Makes ``tree_regression`` available here even before the plugin's entry
point is installed (a conftest below the root may not set ``pytest_plugins``)."""

from treeguard.pytest_plugin import tree_regression  # noqa: F401
