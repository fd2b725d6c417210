"""Reading a page's figures as the browser does: the JSON in a `data-figure` attribute, with every
packed array (Plotly's typed-array spec that app/pages/web.py writes for heatmap matrices: base64 of
float64 bytes, float32 for long inputs, bytes for a painted matrix's colour levels) turned back into
nested lists, NaN as None, as JSON would have carried them."""

from __future__ import annotations

import base64
import html
import json
import re

import numpy as np


def unpack(value):
    """A figure (or any part of one) with packed arrays decoded; everything else as it is."""
    if isinstance(value, dict):
        if set(value) == {"dtype", "bdata", "shape"}:
            shape = tuple(int(n) for n in value["shape"].split(","))
            # full precision; float32 only for long inputs' matrices off the explorer (app/pages/figures.py
            # FLOAT32_MIN_TOKENS); a painted matrix's colour levels as bytes ("u1", whole numbers 0-255)
            assert value["dtype"] in ("f8", "f4", "u1"), value["dtype"]
            array = np.frombuffer(base64.b64decode(value["bdata"]), dtype="<" + value["dtype"]).reshape(shape)
            if value["dtype"] == "u1":
                return array.tolist()
            array = array.astype(np.float64)
            return np.where(np.isnan(array), None, array.astype(object)).tolist()
        return {k: unpack(v) for k, v in value.items()}
    if isinstance(value, list):
        return [unpack(v) for v in value]
    return value


def load_figure(attribute: str) -> dict:
    """A `data-figure` attribute's value (already HTML-unescaped) as a figure dict."""
    return unpack(json.loads(attribute))


def cards(page: str) -> dict[str, dict]:
    """{figure card id: figure dict} for every figure card of a rendered page."""
    return {
        card_id: load_figure(html.unescape(attr))
        for card_id, attr in re.findall(
            r'<figure class="figure[^"]*" id="([^"]+)">.*?data-figure="([^"]*)"', page, re.S
        )
    }
