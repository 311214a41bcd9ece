"""Byte counts in messages: a unit that shows the number, and a GiB flag value that is enough."""

from __future__ import annotations

import random

import pytest

from kvbridge.sizes import GIB, fmt_size, gib_flag


@pytest.mark.parametrize(
    "nbytes, text",
    [(0, "0 B"), (1023, "1023 B"), (1024, "1.00 KiB"), (1_288_490, "1.23 MiB"), (3 * GIB // 2, "1.50 GiB")],
)
def test_sizes_print_in_the_unit_that_shows_them(nbytes, text):
    assert fmt_size(nbytes) == text
    assert "0.00" not in fmt_size(max(1, nbytes))


def test_the_gib_flag_value_is_rounded_up_so_passing_it_is_enough():
    assert gib_flag(int(0.0012 * GIB)) == "0.0012"
    assert gib_flag(8 * GIB) == "8"
    assert gib_flag(3_953_000) == "0.00369"
    rng = random.Random(0)
    for n in [1, 1023, *(rng.randint(1, 10**13) for _ in range(2000))]:
        value = gib_flag(n)
        assert int(float(value) * GIB) >= n  # what fit does with --memory VALUE
        assert float(value) <= n / GIB * 1.01 + 1e-12  # and not much more (three significant digits)
