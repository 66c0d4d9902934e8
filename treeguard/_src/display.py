"""How numbers and foreign text are shown: durations, byte counts and SI
quantities in readable units, and text from a file, a model or a client with
its control characters spelled out (the one home of each)."""

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
    """Bytes in a readable binary unit, one decimal past the unit.

    Example:
      >>> fmt_bytes(1536), fmt_bytes(12), fmt_bytes(3 * 1024**5), fmt_bytes(None)
      ('1.5 KiB', '12 B', '3072.0 TiB', '-')
    """
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns at TiB


def printable(text: object, /, *, newlines: bool = False) -> str:
    r"""``text`` with every control character (a terminal escape, a newline
    inside a name, a NUL) spelled out as Python writes it in a string, so
    that text from a file, a model or a client can neither restyle nor
    rewrite a terminal. Printable text, non-ASCII letters included, is kept.

    Args:
      text: the text (anything, through ``str``).
      newlines: keep line breaks (a message of several lines whose parts
        were spelled out when it was built); every other control character
        is still spelled out.

    Returns:
      The text, safe to print.

    Example:
      >>> print(printable("w\x1b[2J\nx"), printable("naïve"))
      w\x1b[2J\nx naïve
      >>> print(printable("a\x07\nb", newlines=True))
      a\x07
      b
    """
    s = str(text)
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() or (newlines and c == "\n") else repr(c)[1:-1] for c in s)


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
