"""``treeguard.bench``: compile-aware benchmarks, their distribution, the
machine's conditions and an honest comparison (see ``treeguard/bench``)."""
