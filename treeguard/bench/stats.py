"""``treeguard.bench.stats``: the rank tests behind ``treeguard.bench``'s verdicts.

``mann_whitney_u`` compares two independent samples, ``wilcoxon_signed_rank``
paired differences, and ``hodges_lehmann`` estimates the shift between two
samples; ``compare`` and ``compare_paired`` give verdicts built on them.
"""

from .._src.bench.compare import hodges_lehmann, mann_whitney_u, wilcoxon_signed_rank

__all__ = ["hodges_lehmann", "mann_whitney_u", "wilcoxon_signed_rank"]
