"""Durations and byte counts in readable units, for tables and evidence."""

from __future__ import annotations


def fmt_s(s: float) -> str:
    if s < 0:
        return "-" + fmt_s(-s)
    if s >= 1:
        return f"{s:.3g} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} µs"


def fmt_seconds(s: float | None) -> str:
    """Seconds in a readable unit.

    Example:
      >>> fmt_seconds(0.00123), fmt_seconds(None)
      ('1.23 ms', '-')
    """
    return "-" if s is None else fmt_s(s)


def fmt_bytes(n: float | None) -> str:
    """Bytes in a readable binary unit.

    Example:
      >>> fmt_bytes(1536), fmt_bytes(12)
      ('1.5 KiB', '12 B')
    """
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.3g} {unit}"
        value /= 1024
    return f"{value:.3g} TiB"  # pragma: no cover - the loop returns first


def _unit(s: float) -> tuple[float, str]:
    if s >= 1:
        return 1.0, "s"
    if s >= 1e-3:
        return 1e3, "ms"
    return 1e6, "µs"


def fmt_range(lo: float, hi: float) -> str:
    """An interval of seconds in the unit of its upper end.

    Example:
      >>> fmt_range(0.0000644, 0.0000734)
      '64.4-73.4 µs'
    """
    scale, unit = _unit(max(abs(lo), abs(hi)))
    return f"{lo * scale:.3g}-{hi * scale:.3g} {unit}"


def fmt_si(x: float | None, unit: str = "") -> str:
    """A quantity with an SI prefix.

    Example:
      >>> fmt_si(318_000_000, "FLOP/s"), fmt_si(None)
      ('318 MFLOP/s', '-')
    """
    if x is None:
        return "-"
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= factor:
            return f"{x / factor:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}".rstrip()
