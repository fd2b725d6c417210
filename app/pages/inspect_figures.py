"""The Inspect views' and the training page's figures (and the explorer's ablation bars): direct logit
attribution as a waterfall, the logit lens, head scores by layer and head (and over training steps),
the KV cache's growth, and next-token probabilities with and without an ablation.

Plain dicts built from NumPy arrays, under the conventions app/pages/figures.py states; the shared
pieces (axes, colour bars, escaping) are that module's.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from app.http.language import _
from app.pages.figures import (
    WEIGHTS_COLORSCALE,
    base_layout,
    colorbar,
    escape,
    finite_or_none,
    token_axis,
    token_label,
)

POSITIVE_COLOR, NEGATIVE_COLOR, TOTAL_COLOR = "#b35806", "#542788", "#1f2933"  # PuOr's ends, and ink


def logit_waterfall(
    labels: Sequence[str],
    contributions: Sequence[float] | np.ndarray,
    logit_bias: float,
    logit: float,
    *,
    export_name: str = "direct-logit-attribution",
) -> dict:
    """Direct logit attribution as a waterfall: each part's bar starts where the previous one ended, so
    the last step lands on the logit, drawn as its own bar from 0. Bars are floating (`base`), since
    the cartesian Plotly bundle has no waterfall trace. Orange raises the logit, purple lowers it."""
    steps = [*map(float, contributions), float(logit_bias)]
    names = [escape(label) for label in labels] + [_("bias (ln_final.b, b_U)")]
    ends = np.cumsum(steps)
    starts = ends - np.asarray(steps)
    x = list(range(len(steps) + 1))
    trace = {
        "type": "bar",
        "x": x,
        "y": steps + [float(logit)],
        "base": [*map(float, starts), 0.0],
        "marker": {
            "color": [POSITIVE_COLOR if s >= 0 else NEGATIVE_COLOR for s in steps] + [TOTAL_COLOR],
            "pattern": {"shape": ["" if s >= 0 else "/" for s in steps] + [""], "fgcolor": "#ffffff"},
        },
        "customdata": [[n, float(e)] for n, e in zip(names, ends)] + [["logit", float(logit)]],
        "hovertemplate": "%{customdata[0]}<br>"
        + _("adds")
        + " %{y:+.4f}<br>"
        + _("running total")
        + " %{customdata[1]:.4f}<extra></extra>",
    }
    layout = base_layout(
        xaxis={
            "tickmode": "array",
            "tickvals": x,
            "ticktext": names + ["<b>logit</b>"],
            "tickangle": -50,
            "automargin": True,
            "title": {"text": _("part of the residual stream (in forward order)")},
        },
        yaxis={"title": {"text": _("contribution to the logit")}, "zeroline": True, "zerolinecolor": "#737373"},
        bargap=0.15,
        showlegend=False,
    )
    return {
        "data": [trace],
        "layout": layout,
        "export": {
            "name": export_name,
            "kind": "bars",
            "x": [*labels, "bias", "logit"],
            "x_title": "part",
            "value": "direct logit contribution",
        },
    }


def lens_heatmap(
    probs: np.ndarray,
    cell_tokens: Sequence[Sequence[str]],
    hover: Sequence[Sequence[str]],
    points: Sequence[str],
    tokens: Sequence[str],
    *,
    export_name: str = "logit-lens",
) -> dict:
    """The logit lens: rows are points of the residual stream (first layer on top), columns positions.
    Colour is the top token's probability; each cell is labelled with that token, and its hover lists
    the top-k (`hover`, already escaped: "a 0.31<br>b 0.12 ...")."""
    p = np.asarray(probs, dtype=float)  # [n_points, pos]
    if p.shape != (len(points), len(tokens)):
        raise ValueError(f"expected a [{len(points)}, {len(tokens)}] array, got shape {p.shape}")
    labels = [token_label(t) for t in tokens]
    trace = {
        "type": "heatmap",
        "z": finite_or_none(p),
        "colorscale": WEIGHTS_COLORSCALE,
        "zmin": 0.0,
        "zmax": 1.0,
        "text": [[token_label(t) for t in row] for row in cell_tokens],
        "texttemplate": "%{text}",
        "textfont": {"size": 11},
        "customdata": [list(row) for row in hover],
        "hovertemplate": "%{y} · " + _("position") + " %{x}<br>%{customdata}<extra></extra>",
        "colorbar": colorbar(_("top token's p")),
    }
    layout = base_layout(
        xaxis={**token_axis(_("position (token read so far)"), labels, small=False), "automargin": True},
        yaxis={
            "tickmode": "array",
            "tickvals": list(range(len(points))),
            "ticktext": [escape(s) for s in points],
            "range": [len(points) - 0.5, -0.5],
            "automargin": True,
            "showgrid": False,
        },
    )
    return {
        "data": [trace],
        "layout": layout,
        "export": {
            "name": export_name,
            "kind": "matrix",
            "x": list(tokens),
            "y": list(points),
            "x_title": "position",
            "y_title": "residual stream point",
            "value": "top token probability",
        },
    }


def head_heatmap(scores: np.ndarray, *, value_name: str, export_name: str) -> dict:
    """One score per head: rows are layers, columns heads, 0 … 1 on the sequential scale, each cell
    printed; a head with no score (nothing to detect) is a gap."""
    s = np.asarray(scores, dtype=float)  # [n_layers, n_heads]
    n_layers, n_heads = s.shape
    trace = {
        "type": "heatmap",
        "z": finite_or_none(s),
        "colorscale": WEIGHTS_COLORSCALE,
        "zmin": 0.0,
        "zmax": 1.0,
        "texttemplate": "%{z:.2f}",
        "textfont": {"size": 11},
        "hoverongaps": False,
        "xgap": 1,
        "ygap": 1,
        "hovertemplate": _("layer %{y} head %{x}") + f"<br>{escape(value_name)} = %{{z:.3f}}<extra></extra>",
        "colorbar": colorbar(value_name),
    }
    layout = base_layout(
        xaxis={"title": {"text": _("head")}, "tickmode": "array", "tickvals": list(range(n_heads)), "showgrid": False},
        yaxis={
            "title": {"text": _("layer")},
            "tickmode": "array",
            "tickvals": list(range(n_layers)),
            "range": [n_layers - 0.5, -0.5],
            "showgrid": False,
        },
    )
    return {
        "data": [trace],
        "layout": layout,
        "export": {
            "name": export_name,
            "kind": "matrix",
            "x": list(range(n_heads)),
            "y": list(range(n_layers)),
            "x_title": "head",
            "y_title": "layer",
            "value": value_name,
        },
    }


def head_step_heatmap(scores: Sequence, steps: Sequence[int], *, value_name: str, export_name: str) -> dict:
    """Every head's score over training: rows are heads (L{layer}H{head}), columns the record steps, 0 … 1
    on the sequential scale. A head that becomes an induction head shows as a row turning dark.
    scores: [step][layer][head]."""
    s = np.asarray(scores, dtype=float)  # [n_steps, n_layers, n_heads]
    if s.ndim != 3:
        raise ValueError(f"expected scores [step][layer][head], got shape {s.shape}")
    n_steps, n_layers, n_heads = s.shape
    rows = [f"L{layer}H{head}" for layer in range(n_layers) for head in range(n_heads)]
    z = s.reshape(n_steps, n_layers * n_heads).T  # [head, step]
    trace = {
        "type": "heatmap",
        "z": finite_or_none(z),
        "x": [int(x) for x in steps],
        "y": list(range(len(rows))),
        "colorscale": WEIGHTS_COLORSCALE,
        "zmin": 0.0,
        "zmax": 1.0,
        "hoverongaps": False,
        "ygap": 1,
        "customdata": [[r] * n_steps for r in rows],
        "hovertemplate": _("%{customdata} at step %{x}") + f"<br>{escape(value_name)} = %{{z:.3f}}<extra></extra>",
        "colorbar": colorbar(value_name),
    }
    layout = base_layout(
        xaxis={"title": {"text": _("step")}, "showgrid": False, "zeroline": False},
        yaxis={
            "title": {"text": _("head")},
            "tickmode": "array",
            "tickvals": list(range(len(rows))),
            "ticktext": rows,
            "range": [len(rows) - 0.5, -0.5],
            "showgrid": False,
        },
    )
    layout["margin"] = {"l": 80, "r": 20, "t": 10, "b": 50}
    return {
        "data": [trace],
        "layout": layout,
        "export": {
            "name": export_name,
            "kind": "matrix",
            "x": [int(x) for x in steps],
            "y": rows,
            "x_title": "step",
            "y_title": "head",
            "value": value_name,
        },
    }


def cache_growth(
    positions: Sequence[int],
    cache_bytes: Sequence[int],
    generated: Sequence[bool],
    *,
    export_name: str = "kv-cache-bytes",
) -> dict:
    """The KV cache's bytes after each step: a straight line, one row of K and V per layer per token.
    Steps reading the text and steps generating are two series (circles and diamonds)."""
    series = []
    for name, chosen, symbol, color in (
        (_("reading the text"), False, "circle", "#0072b2"),
        (_("generating"), True, "diamond", "#e69f00"),
    ):
        idx = [i for i, g in enumerate(generated) if g == chosen]
        if idx:
            series.append(
                {
                    "type": "scatter",
                    "mode": "lines+markers",
                    "name": name,
                    "x": [int(positions[i]) + 1 for i in idx],
                    "y": [int(cache_bytes[i]) for i in idx],
                    "marker": {"symbol": symbol, "size": 8, "color": color},
                    "line": {"color": color},
                    "hovertemplate": _("%{x} tokens cached<br>%{y:,} bytes") + "<extra></extra>",
                }
            )
    layout = base_layout(
        xaxis={"title": {"text": _("tokens in the cache")}, "rangemode": "tozero"},
        yaxis={"title": {"text": _("bytes of K and V (all layers)")}, "rangemode": "tozero", "tickformat": "~s"},
        showlegend=True,
        legend={"orientation": "h", "x": 0, "y": 1.02, "yanchor": "bottom"},
    )
    layout["margin"] = {**layout["margin"], "t": 30}
    return {
        "data": series,
        "layout": layout,
        "export": {
            "name": export_name,
            "kind": "bars",
            "x": [int(p) + 1 for p in positions],
            "x_title": "tokens cached",
            "value": "bytes",
        },
    }


def probability_change_bars(
    tokens: Sequence[str], before: Sequence[float], after: Sequence[float], *, export_name: str = "next-token-ablation"
) -> dict:
    """The most likely next tokens without the ablation (hatched grey) and with it (blue), side by side."""
    labels = [token_label(t) for t in tokens]
    y = list(range(len(labels)))
    bars = []
    for name, values, style in (
        (_("without ablation"), before, {"color": NOT_ABLATED_COLOR, "pattern": {"shape": "/", "fgcolor": "#737373"}}),
        (_("with ablation"), after, {"color": "#225ea8"}),
    ):
        bars.append(
            {
                "type": "bar",
                "orientation": "h",
                "name": name,
                "x": [float(v) for v in values],
                "y": y,
                "marker": style,
                "customdata": labels,
                "text": [f"{v:.3f}" for v in values],
                "textposition": "outside",
                "cliponaxis": False,
                "hovertemplate": _("next token") + f" %{{customdata}}<br>{name}: p = %{{x:.4f}}<extra></extra>",
            }
        )
    top = max([*map(float, before), *map(float, after)], default=1.0)
    layout = base_layout(
        xaxis={"title": {"text": _("probability")}, "range": [0, min(1.0, top * 1.3) or 1.0]},
        yaxis={
            "tickmode": "array",
            "tickvals": y,
            "ticktext": labels,
            "range": [len(labels) - 0.5, -0.5],
            "automargin": True,
            "title": {"text": _("next token")},
        },
        barmode="group",
        bargap=0.2,
        showlegend=True,
        legend={"orientation": "h", "x": 0, "y": 1.02, "yanchor": "bottom"},
    )
    layout["margin"] = {**layout["margin"], "t": 30}
    return {
        "data": bars,
        "layout": layout,
        "export": {
            "name": export_name,
            "kind": "bars",
            "x": list(tokens),
            "x_title": "token",
            "value": "probability with ablation",
        },
    }


NOT_ABLATED_COLOR = "#d9d9d9"
