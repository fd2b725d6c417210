"""Plotly figures as plain dicts, built from NumPy arrays.

The server never renders a figure: it embeds each dict as JSON in a `data-figure` attribute and
static/js/explorer.js draws it with Plotly.react. Every builder here is a pure function of arrays
and labels, so lessons and the calculator can reuse them.

Conventions every figure follows:
- attention matrices are [query_pos, key_pos]: rows are queries (y, top to bottom), columns keys (x);
- scores (centred on 0) use a diverging scale with its midpoint at 0; weights and norms (never
  negative) a sequential one; both colour-blind safe (ColorBrewer PuOr and YlGnBu);
- masked cells are not a colour on the scale: scores there are null (a gap) and a hatched grey
  overlay marks every masked cell, with its own legend entry;
- token positions are numbers on the axes (a sentence may repeat a token), labelled by ticktext;
- Plotly renders a little HTML in labels (<b>, <br>, <a>...), so every user string is escaped.

A figure dict may carry an "export" entry (not a Plotly key; explorer.js strips it before drawing):
the raw, unescaped labels of the data behind the figure, for its JSON/CSV download, and for a
heatmap a "cell_text" pattern ("query {i} {y} → key {j} {x}", filled from the escaped tick labels)
from which explorer.js builds each cell's hover text, so the server does not send n² strings.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

import numpy as np

# ColorBrewer PuOr, purple (negative) -> white (0) -> orange (positive); safe for colour-blind readers.
SCORES_COLORSCALE = [
    [0.0, "#2d004b"], [0.1, "#542788"], [0.2, "#8073ac"], [0.3, "#b2abd2"], [0.4, "#d8daeb"],
    [0.5, "#f7f7f7"],
    [0.6, "#fee0b6"], [0.7, "#fdb863"], [0.8, "#e08214"], [0.9, "#b35806"], [1.0, "#7f3b08"],
]
# ColorBrewer YlGnBu, light (0) -> dark blue (high): zero reads as "blank paper" on a projector.
WEIGHTS_COLORSCALE = [
    [0.0, "#ffffd9"], [0.125, "#edf8b1"], [0.25, "#c7e9b4"], [0.375, "#7fcdbb"], [0.5, "#41b6c4"],
    [0.625, "#1d91c0"], [0.75, "#225ea8"], [0.875, "#253494"], [1.0, "#081d58"],
]
MASK_FILL = {"shape": "/", "bgcolor": "#d9d9d9", "fgcolor": "#737373", "size": 8, "solidity": 0.25}
MASKED_NAME = "masked (score −∞, weight 0)"

KEY_AXIS = "key token (column)"
QUERY_AXIS = "query token (row)"
FONT = {"family": "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif", "size": 13, "color": "#1f2933"}

# Whitespace tokens would be invisible as tick labels; show them with the usual visible symbols.
_VISIBLE = str.maketrans({" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"})


def escape(text: str) -> str:
    """Escape <, > and & so Plotly shows user text as text, never as markup."""
    return html.escape(text, quote=False)


def visible(token: str) -> str:
    """A token with its whitespace made visible (for labels; HTML templates escape it themselves)."""
    return token.translate(_VISIBLE) or "∅"


def token_label(token: str) -> str:
    """A token as a Plotly tick label: whitespace made visible, markup escaped."""
    return escape(visible(token))


def _base_layout(**extra) -> dict:
    layout = {
        "font": FONT,
        "paper_bgcolor": "#ffffff",
        "plot_bgcolor": "#ffffff",
        "margin": {"l": 70, "r": 20, "t": 10, "b": 60},
        "hoverlabel": {"font": {"size": 14}},
    }
    layout.update(extra)
    return layout


def _finite_or_none(matrix: np.ndarray) -> list:
    """Nested lists with -inf/NaN as None (JSON null): a masked score is "no value", not a colour."""
    m = np.asarray(matrix, dtype=float)
    out = m.astype(object)
    out[~np.isfinite(m)] = None
    return out.tolist()


def _mask_overlay(mask: np.ndarray) -> dict | None:
    """One scatter trace whose filled rectangles cover the masked cells, hatched grey.

    Cells are merged into one rectangle per run of masked cells in a row, so a causal mask
    over T tokens is T - 1 rectangles, not T²/2.
    """
    xs: list[float | None] = []
    ys: list[float | None] = []
    for row, cells in enumerate(np.asarray(mask, dtype=bool)):
        col = 0
        while col < cells.size:
            if not cells[col]:
                col += 1
                continue
            start = col
            while col < cells.size and cells[col]:
                col += 1
            x0, x1, y0, y1 = start - 0.5, col - 0.5, row - 0.5, row + 0.5
            xs += [x0, x1, x1, x0, x0, None]
            ys += [y0, y0, y1, y1, y0, None]
    if not xs:
        return None
    return {
        "type": "scatter", "mode": "lines", "x": xs, "y": ys, "fill": "toself",
        "fillcolor": MASK_FILL["bgcolor"], "fillpattern": MASK_FILL, "line": {"width": 0.5, "color": "#737373"},
        "name": MASKED_NAME, "hoveron": "fills", "hoverinfo": "name", "showlegend": True,
    }


def _token_axis(title: str | None, labels: list[str], *, small: bool) -> dict:
    axis = {"tickmode": "array", "tickvals": list(range(len(labels))), "ticktext": labels,
            "showgrid": False, "zeroline": False, "ticks": "", "range": [-0.5, len(labels) - 0.5]}
    if small:
        axis.update(showticklabels=False)
    else:
        axis["title"] = {"text": title}
        axis["automargin"] = True
    return axis


def attention_heatmap(
    matrix: np.ndarray,  # [query_pos, key_pos]
    tokens: Sequence[str],
    *,
    kind: str,  # "scores" (diverging, centred on 0) or "weights" (sequential, 0..1)
    mask: np.ndarray | None = None,  # [query_pos, key_pos] bool, True = masked
    zmax: float | None = None,  # scores: the colour range is [-zmax, zmax]; None = from the data
    value_name: str | None = None,
    export_name: str = "attention",
    small: bool = False,  # a thumbnail: no labels, no colour bar, no hover
) -> dict:
    """One attention matrix as a heatmap with the tokens on both axes."""
    m = np.asarray(matrix, dtype=float)
    if m.ndim != 2 or m.shape[0] != len(tokens) or m.shape[1] != len(tokens):
        raise ValueError(f"expected a [{len(tokens)}, {len(tokens)}] matrix, got shape {m.shape}")
    labels = [token_label(t) for t in tokens]
    value_name = value_name or ("score" if kind == "scores" else "weight")
    trace: dict = {"type": "heatmap", "z": _finite_or_none(m), "hoverongaps": False,
                   "xgap": 1 if small else 0, "ygap": 1 if small else 0}
    if kind == "scores":
        finite = np.abs(m[np.isfinite(m)])
        top = zmax if zmax is not None else (float(finite.max()) if finite.size else 1.0)
        top = top or 1.0  # an all-zero matrix still needs a range
        trace.update(colorscale=SCORES_COLORSCALE, zmin=-top, zmax=top, zmid=0)
    elif kind == "weights":
        trace.update(colorscale=WEIGHTS_COLORSCALE, zmin=0.0, zmax=1.0)
    else:
        raise ValueError(f"kind must be 'scores' or 'weights', got {kind!r}")
    if small:
        trace.update(showscale=False, hoverinfo="skip")
    else:
        trace["hovertemplate"] = f"%{{text}}<br>{escape(value_name)} = %{{z:.4f}}<extra></extra>"
        trace["colorbar"] = {"title": {"text": escape(value_name), "side": "right"}, "thickness": 14, "len": 0.9}
    data = [trace]
    overlay = _mask_overlay(mask) if mask is not None else None
    if overlay is not None:
        if small:
            overlay.update(showlegend=False, hoverinfo="skip", hoveron="points")
        data.append(overlay)
    layout = _base_layout(
        xaxis=_token_axis(KEY_AXIS, labels, small=small),
        yaxis={**_token_axis(QUERY_AXIS, labels, small=small), "autorange": None,
               "range": [len(labels) - 0.5, -0.5], "scaleanchor": "x", "constrain": "domain"},
        showlegend=overlay is not None and not small,
        # above the plot, right-aligned: below it would collide with the key axis' title
        legend={"orientation": "h", "x": 1, "y": 1.0, "yanchor": "bottom", "xanchor": "right",
                "font": {"size": 12}},
    )
    if overlay is not None and not small:
        layout["margin"] = {**layout["margin"], "t": 34}
    if small:
        layout["margin"] = {"l": 2, "r": 2, "t": 2, "b": 2}
    return {"data": data, "layout": layout,
            "export": {"name": export_name, "kind": "matrix", "x": list(tokens), "y": list(tokens),
                       "x_title": KEY_AXIS, "y_title": QUERY_AXIS, "value": value_name,
                       "cell_text": "query {i} {y} → key {j} {x}"}}


def score_range(*matrices: np.ndarray) -> float:
    """One symmetric colour range for several score matrices, so their colours compare."""
    tops = [float(np.abs(m[np.isfinite(m)]).max()) for m in map(np.asarray, matrices) if np.isfinite(m).any()]
    return max(tops, default=1.0) or 1.0


def stage_heatmap(
    values: np.ndarray,  # [pos, n_stages]
    tokens: Sequence[str],
    stages: Sequence[str],
    *,
    value_name: str,
    export_name: str,
) -> dict:
    """Per-token values across named stages (e.g. the residual stream's norm layer by layer)."""
    v = np.asarray(values, dtype=float)
    if v.shape != (len(tokens), len(stages)):
        raise ValueError(f"expected a [{len(tokens)}, {len(stages)}] array, got shape {v.shape}")
    labels = [token_label(t) for t in tokens]
    stage_labels = [escape(s) for s in stages]
    trace = {
        "type": "heatmap", "z": _finite_or_none(v), "colorscale": WEIGHTS_COLORSCALE, "zmin": 0.0,
        "hovertemplate": f"%{{text}}<br>{escape(value_name)} = %{{z:.4f}}<extra></extra>",
        "colorbar": {"title": {"text": escape(value_name), "side": "right"}, "thickness": 14},
    }
    layout = _base_layout(
        xaxis={"tickmode": "array", "tickvals": list(range(len(stages))), "ticktext": stage_labels,
               "tickangle": -40, "showgrid": False, "automargin": True},
        yaxis={**_token_axis("token (row)", labels, small=False), "range": [len(labels) - 0.5, -0.5]},
    )
    return {"data": [trace], "layout": layout,
            "export": {"name": export_name, "kind": "matrix", "x": list(stages), "y": list(tokens),
                       "x_title": "stage", "y_title": "token", "value": value_name,
                       "cell_text": "token {i} {y} at {x}"}}


def probability_bars(tokens: Sequence[str], probs: Sequence[float], *, export_name: str = "next-token") -> dict:
    """Next-token probabilities, most likely on top."""
    labels = [token_label(t) for t in tokens]
    trace = {
        "type": "bar", "orientation": "h", "x": [float(p) for p in probs], "y": list(range(len(labels))),
        "marker": {"color": "#225ea8"}, "text": [f"{p:.3f}" for p in probs], "textposition": "outside",
        "cliponaxis": False, "customdata": labels,
        "hovertemplate": "next token %{customdata}<br>p = %{x:.4f}<extra></extra>",
    }
    top = max((float(p) for p in probs), default=1.0)
    layout = _base_layout(
        xaxis={"title": {"text": "probability"}, "range": [0, min(1.0, top * 1.25) or 1.0], "rangemode": "tozero"},
        yaxis={"tickmode": "array", "tickvals": list(range(len(labels))), "ticktext": labels,
               "range": [len(labels) - 0.5, -0.5], "automargin": True, "title": {"text": "next token"}},
        bargap=0.25,
    )
    return {"data": [trace], "layout": layout,
            "export": {"name": export_name, "kind": "bars", "x": list(tokens), "x_title": "token",
                       "value": "probability"}}
