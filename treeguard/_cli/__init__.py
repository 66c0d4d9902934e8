"""The ``treeguard`` command line (private: the console script and ``python -m treeguard``)."""
