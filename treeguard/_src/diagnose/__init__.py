"""Divergence localisation: the stage ladder, the jaxpr search, NaN origins, traces."""
