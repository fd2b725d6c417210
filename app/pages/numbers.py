"""Numbers as the lesson tables print them: the spec's rounding, full precision for hover, byte sizes."""

from __future__ import annotations

import math

import numpy as np

from app.http.language import _


def fixed(value: float, digits: int) -> str:
    """As the spec's np.round(..., digits) prints it, in a table cell: 0.89, −∞ for a masked score.
    (np.round rounds halves to even, 0.005 -> 0.0, where "%.2f" gives 0.01.)"""
    if math.isinf(value):
        return "−∞" if value < 0 else "∞"
    text = f"{np.round(value, digits):.{digits}f}"
    return "0." + "0" * digits if text == "-0." + "0" * digits else text


def full(value: float) -> str:
    """Full precision, for a cell's hover text."""
    return _("−∞ (masked)") if math.isinf(value) and value < 0 else repr(float(value))


def cells(row, digits: int = 2, masked=None) -> list[dict]:
    """Table cells of one row; a cell is masked where `masked` says so, or where its score is −∞."""
    flags = masked if masked is not None else [False] * len(row)
    return [
        {"text": fixed(float(v), digits), "full": full(float(v)), "masked": bool(m) or math.isinf(float(v))}
        for v, m in zip(row, flags)
    ]


def human_bytes(n: int) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return _("{n} bytes").format(n=n)
