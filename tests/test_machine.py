"""How the tests read the machine's accounting of peak memory
(``machine.peak_rss_line``): a bound in bytes is skipped only where
``ru_maxrss`` counts a touched byte other than once, not where it grows by a
fixed offset besides."""

from __future__ import annotations

import pytest
from machine import PEAK_PROBE_SIZES, needs_peak_rss_counted_once, peak_rss_line


def test_a_fixed_offset_is_told_apart_from_the_bytes_touched() -> None:
    # the TPU machine's gVisor: 8 MiB touched read 2.1 bytes a byte, and the
    # probe before this one skipped the bounds there, but 64 MiB read 1.14:
    # one byte a byte plus about 9.7 MB
    seen = []

    def growth(n: int) -> int:
        seen.append(n)
        return n + 9_700_000

    line = peak_rss_line(growth)
    assert seen == list(PEAK_PROBE_SIZES)
    assert line.slope == pytest.approx(1.0) and line.offset == pytest.approx(9_700_000)
    needs_peak_rss_counted_once(line)  # not skipped
    assert str(line) == "ru_maxrss grows by 1.000 bytes per byte touched plus 9.70 MB"


@pytest.mark.parametrize("slope", [2.0, 0.5])
def test_a_byte_counted_other_than_once_skips_saying_so(slope: float) -> None:
    line = peak_rss_line(lambda n: int(slope * n) + 1_000_000)
    with pytest.raises(
        pytest.skip.Exception, match=f"grows by {slope:.3f} bytes per byte .* 1.00 MB"
    ):
        needs_peak_rss_counted_once(line)
