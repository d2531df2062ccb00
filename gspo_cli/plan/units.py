"""Sizes and counts as `gspo plan` prints them."""

from __future__ import annotations


def gb(n: int | float | None) -> str:
    """Bytes for people: GB (1e9) with one decimal, MB (1e6) below 1 GB; "-" for None."""
    if n is None:
        return "-"
    return f"{n / 1e9:,.1f} GB" if n >= 1e9 else f"{n / 1e6:,.0f} MB"


def count(n: int) -> str:
    """A parameter count: "30.53 B", "11.2 M"."""
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.1f} M"
