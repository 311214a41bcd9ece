"""Byte counts as messages print them: a binary unit (GiB, MiB, KiB, B) chosen so the number shows.

``fmt_size(1_288_490)`` is ``"1.23 MiB"``, never ``"0.00 GiB"``. :func:`gib_flag` writes a byte
count as the value of a flag taken in GiB (``--memory``, ``$KVBRIDGE_FIT_MEMORY``), rounded **up**
to three significant digits, so that passing the printed value is enough. No imports: a value
module at the bottom of the layering, for every stage's messages.
"""

from __future__ import annotations

import math

KIB, MIB, GIB = 2**10, 2**20, 2**30
_UNITS = (("GiB", GIB), ("MiB", MIB), ("KiB", KIB))


def fmt_size(nbytes: float) -> str:
    """``nbytes`` in the largest binary unit it reaches, two decimals (``"512 B"`` below 1 KiB)."""
    n = float(nbytes)
    for unit, scale in _UNITS:
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def gib_flag(nbytes: float, digits: int = 3, *, down: bool = False) -> str:
    """``nbytes`` as a number of GiB rounded up to ``digits`` significant digits (``"0.00121"``);
    ``down``: rounded down instead (a ``--memory`` that stays within ``nbytes``)."""
    gib = float(nbytes) / GIB
    if gib <= 0:
        return "0"
    exp = math.floor(math.log10(gib)) - (digits - 1)
    step = 10.0**exp
    units = math.floor(gib / step + 1e-9) if down else math.ceil(gib / step - 1e-9)
    while not down and int(units * step * GIB) < nbytes:  # the flag's own conversion (int(GiB * 2**30)) reaches it
        units += 1
    text = f"{units * step:.{max(0, -exp)}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text
