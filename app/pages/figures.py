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
from which explorer.js builds each cell's hover text, so the server does not send n² strings, and
"label_px" {axis: pixels}: the band the margins keep for that axis' token labels, which explorer.js
then writes itself (Plotly would measure each of them, most of a heatmap's drawing time).

Long inputs (up to the API's 1,024 tokens): an attention matrix of IMAGE_MIN_TOKENS tokens or more
carries export "draw": "image", and explorer.js paints it as an image (one pixel per cell) instead
of Plotly's per-cell heatmap. Its masked cells travel as data, export "mask" (`_mask_data`). On the
explorer, where the page answers a matrix's exact values when they are read (`read=`: a hover, the
selected cell, a download; app/pages/explorer.py), and for a thumbnail, which is never read, a
painted matrix travels as its colour levels only (`_levels`: a byte for each cell the mask leaves,
the nearest of the 256 colours explorer-image.js paints). A thumbnail of more than THUMB_MAX_CELLS
tokens is max-pooled to at most that many cells a side (`head_thumbnails`), so a sink or a diagonal
of one token still shows at 120 pixels. Elsewhere a painted matrix's values travel (float32 from
FLOAT32_MIN_TOKENS: half the bytes; 7 significant digits, where hover shows 4 decimals).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from app.http.language import DEFAULT, N_, _, current

# ColorBrewer PuOr, purple (negative) -> white (0) -> orange (positive); safe for colour-blind readers.
SCORES_COLORSCALE = [
    [0.0, "#2d004b"],
    [0.1, "#542788"],
    [0.2, "#8073ac"],
    [0.3, "#b2abd2"],
    [0.4, "#d8daeb"],
    [0.5, "#f7f7f7"],
    [0.6, "#fee0b6"],
    [0.7, "#fdb863"],
    [0.8, "#e08214"],
    [0.9, "#b35806"],
    [1.0, "#7f3b08"],
]
# ColorBrewer YlGnBu, light (0) -> dark blue (high): zero reads as "blank paper" on a projector.
WEIGHTS_COLORSCALE = [
    [0.0, "#ffffd9"],
    [0.125, "#edf8b1"],
    [0.25, "#c7e9b4"],
    [0.375, "#7fcdbb"],
    [0.5, "#41b6c4"],
    [0.625, "#1d91c0"],
    [0.75, "#225ea8"],
    [0.875, "#253494"],
    [1.0, "#081d58"],
]
MASK_FILL = {"shape": "/", "bgcolor": "#d9d9d9", "fgcolor": "#737373", "size": 8, "solidity": 0.25}
MASKED_NAME = N_("masked (score −∞, weight 0)")

# Long inputs (see the module's docstring). 64 tokens: cells narrower than ~8 px in a stage figure,
# where a per-cell heatmap costs Plotly most and shows least.
IMAGE_MIN_TOKENS = 64
FLOAT32_MIN_TOKENS = 256  # 1,024² float64 values are 11 MB of base64; float32 5.6 MB
THUMB_MAX_CELLS = 128  # a thumbnail is ~120 px wide: a longer text's is max-pooled to at most this a side
LEVELS = 256  # the colours a painted matrix is drawn in: explorer-image.js's colour table

KEY_AXIS = N_("key token (column)")
QUERY_AXIS = N_("query token (row)")
FONT = {"family": "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif", "size": 13, "color": "#1f2933"}

# Whitespace tokens would be invisible as tick labels; show them with the usual visible symbols, and the
# empty token as ∅. The writing page's script, which gets its tokens from the API, makes the same
# substitution from these (app/pages/generate.py hands them to static/js/generate.js).
VISIBLE_WHITESPACE = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"}
EMPTY_TOKEN = "∅"
_VISIBLE = str.maketrans(VISIBLE_WHITESPACE)


def escape(text: str) -> str:
    """Escape <, > and & so Plotly shows user text as text, never as markup."""
    return html.escape(text, quote=False)


def visible(token: str) -> str:
    """A token with its whitespace made visible (for labels; HTML templates escape it themselves)."""
    return token.translate(_VISIBLE) or EMPTY_TOKEN


@lru_cache(maxsize=8192)  # a long text's labels are made for every figure of the page
def token_label(token: str) -> str:
    """A token as a Plotly tick label: whitespace made visible, markup escaped."""
    return escape(visible(token))


def colorbar(title: str, **extra) -> dict:
    """A heatmap's colour bar: its title (escaped: it may name user text) along the right side, and one
    thickness on every figure."""
    return {"title": {"text": escape(title), "side": "right"}, "thickness": 14, **extra}


def base_layout(**extra) -> dict:
    layout = {
        "font": FONT,
        "paper_bgcolor": "#ffffff",
        "plot_bgcolor": "#ffffff",
        "margin": {"l": 70, "r": 20, "t": 10, "b": 60},
        "hoverlabel": {"font": {"size": 14}},
    }
    layout.update(extra)
    return layout


def finite_or_none(matrix: np.ndarray) -> np.ndarray:
    """A float64 copy with -inf/NaN as NaN: a masked score is "no value", not a colour. It stays an
    array: app/pages/web.py `figure_json` sends it packed (base64 float64, every bit kept), and NaN is
    what JSON writes as null and Plotly draws as a gap."""
    m = np.array(matrix, dtype=np.float64)
    m[~np.isfinite(m)] = np.nan
    return m


def _block_reduce(a: np.ndarray, f: int, op, chunk: int = 64) -> np.ndarray:
    """op (a NumPy ufunc of two arrays) over every f × f block: [rows·f, cols·f] -> [rows, cols], folding
    strided slices into one (a reduction over reshaped block axes is several times slower), `chunk` rows
    at a time: f passes over a slice that stays in the cache, not over the whole matrix from memory."""
    cols = np.empty((a.shape[0], -(-a.shape[1] // f)), dtype=a.dtype)
    for r in range(0, a.shape[0], chunk):
        part, into = a[r : r + chunk], cols[r : r + chunk]
        np.copyto(into, part[:, 0::f])
        for j in range(1, f):
            op(into, part[:, j::f], out=into)
    out = cols[0::f].copy()
    for i in range(1, f):
        op(out, cols[i::f], out=out)
    return out


def _max_pool(matrix: np.ndarray, mask: np.ndarray | None, size: int) -> tuple[np.ndarray, np.ndarray | None]:
    """[..., T, T] -> [..., ceil(T/f), ceil(T/f)] with f = ceil(T/size): each cell the largest value of its
    f × f block (NaN only where the whole block is); the mask [T, T] pooled alike, each block masked only
    where all its cells are. The largest, not the mean: one strong key (a sink, a previous-token
    diagonal) stays as dark as it is."""
    n0, n1 = matrix.shape[-2:]
    f = -(-n0 // size)
    rows, cols = -(-n0 // f), -(-n1 // f)
    if (rows * f, cols * f) != (n0, n1):  # the last blocks are partly outside: no value, masked
        padded = np.full(matrix.shape[:-2] + (rows * f, cols * f), np.nan)
        padded[..., :n0, :n1] = matrix
        matrix = padded
        if mask is not None:
            full = np.ones((rows * f, cols * f), dtype=bool)
            full[:n0, :n1] = mask
            mask = full
    # fmax: NaN only where both are. A matrix at a time: all of a layer's heads at once leave the cache
    # at each pass over them, several times slower.
    pooled = (
        _block_reduce(matrix, f, np.fmax)
        if matrix.ndim == 2
        else np.stack([_block_reduce(m, f, np.fmax) for m in matrix.reshape(-1, rows * f, cols * f)]).reshape(
            matrix.shape[:-2] + (rows, cols)
        )
    )
    return pooled, None if mask is None else _block_reduce(mask, f, np.logical_and)


def _levels(matrix: np.ndarray, keep: np.ndarray, zmin: float, zmax: float) -> np.ndarray:
    """The colour level of every kept cell, row-major (uint8 [n_kept]): the nearest of LEVELS steps from
    zmin to zmax (half up), clamped to the ends. explorer-image.js paints level k in its colour table's
    k-th colour, the table Plotly's heatmap would interpolate (its code says how): the same picture as
    painting the values, in a byte a cell."""
    scale = (LEVELS - 1) / ((zmax - zmin) or 1)
    k = (matrix[keep] - zmin) * scale
    np.floor(k + 0.5, out=k)
    return np.clip(k, 0, LEVELS - 1, out=k).astype(np.uint8)


def weights_levels(weights: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """The levels a painted weights heatmap of these weights carries (export "levels", zmin 0, zmax 1):
    a head the explorer may show next, sent when it is picked."""
    keep = np.isfinite(weights) if mask is None else np.isfinite(weights) & ~np.asarray(mask, dtype=bool)
    return _levels(weights, keep, 0.0, 1.0)


def _mask_runs(mask: np.ndarray) -> np.ndarray:
    """[runs, 3]: (query row, first masked key, the key after the last) for each run of masked keys
    in a row, row-major. A causal mask over T tokens is T - 1 runs, a sliding window at most 2 a row."""
    m = np.asarray(mask, dtype=bool)
    rows, cols = m.shape
    padded = np.zeros((rows, cols + 2), dtype=np.int8)  # a 0 either side of each row: runs end in their row
    padded[:, 1:-1] = m
    flat = padded.ravel()
    edges = np.flatnonzero(flat[1:] != flat[:-1])  # a run starts after an even edge and stops after the next
    row, start = np.divmod(edges[0::2], cols + 2)
    return np.stack([row, start, edges[1::2] - row * (cols + 2)], axis=1)


def _mask_data(mask: np.ndarray) -> dict:
    """export["mask"] of a painted matrix: which cells are masked, as `_mask_runs` (a list of
    [row, from, to] in JSON), and the colours of their hatching, MASK_FILL's (explorer.js paints an
    fgcolor cell every 4th diagonal on bgcolor)."""
    return {"runs": _mask_runs(mask), "bgcolor": MASK_FILL["bgcolor"], "fgcolor": MASK_FILL["fgcolor"]}


def _mask_overlay(mask: np.ndarray, shapes: bool = True) -> dict:
    """One scatter trace whose filled rectangles cover the masked cells, hatched grey.

    Cells are merged into one rectangle per run of masked cells in a row (`_mask_runs`), so a
    causal mask over T tokens is T - 1 rectangles, not T²/2. Each rectangle is 5 corners and a NaN
    break (null in JSON). shapes=False: no rectangles, only the legend entry (a painted matrix's
    masked cells are painted from export "mask").
    """
    if shapes:
        rows, starts, stops = _mask_runs(np.asarray(mask, dtype=bool)).T
        x0, x1, y0, y1 = starts - 0.5, stops - 0.5, rows - 0.5, rows + 0.5
        nan = np.full_like(x0, np.nan)
        xs = np.stack([x0, x1, x1, x0, x0, nan], axis=1).ravel()
        ys = np.stack([y0, y0, y1, y1, y0, nan], axis=1).ravel()
    else:
        xs = ys = np.empty(0)
    return {
        "type": "scatter",
        "mode": "lines",
        "x": xs,
        "y": ys,
        "fill": "toself",
        "fillcolor": MASK_FILL["bgcolor"],
        "fillpattern": MASK_FILL,
        "line": {"width": 0.5, "color": "#737373"},
        "name": _(MASKED_NAME),
        "hoveron": "fills",
        "hoverinfo": "name",
        "showlegend": True,
    }


# Margins are computed from the labels rather than left to Plotly's automargin, which lays each
# figure out a second time once its labels are measured. Pixels at the 13 px font;
# explorer.js scales them with the font in classroom mode.
CHAR_PX = 8  # one character of a tick label, generously
AXIS_TITLE_PX = 30
MAX_LABEL_PX = 200


def label_px(labels: Sequence[str]) -> int:
    """The pixels the longest of these tick labels takes (whitespace made visible), at most MAX_LABEL_PX."""
    longest = max((len(visible(t)) for t in set(labels)), default=1)  # a long text repeats its tokens
    return min(MAX_LABEL_PX, CHAR_PX * longest + 10)


def column_labels(labels: Sequence[str]) -> tuple[int, int]:
    """(x tick angle, pixels below the axis) for labels under a heatmap's columns. One or two characters
    fit upright under a column; longer ones are turned to run down the page, so neighbours never overlap
    however narrow the columns (Plotly then thins a category axis to a label every ~15 px)."""
    label = label_px(labels)
    return (0, 22) if label <= CHAR_PX * 2 + 10 else (-90, label)


def _token_margins(tokens: Sequence[str]) -> tuple[dict, int]:
    """(margin, x tick angle) for a heatmap with the tokens on both axes."""
    angle, below = column_labels(tokens)
    return {"l": AXIS_TITLE_PX + label_px(tokens), "r": 10, "t": 10, "b": AXIS_TITLE_PX + below}, angle


def token_axis(title: str | None, labels: list[str], *, small: bool) -> dict:
    axis = {
        "tickmode": "array",
        "tickvals": list(range(len(labels))),
        "ticktext": labels,
        "showgrid": False,
        "zeroline": False,
        "ticks": "",
        "range": [-0.5, len(labels) - 0.5],
    }
    if small:
        axis.update(showticklabels=False)
    else:
        axis["title"] = {"text": title}
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
    read: str | None = None,  # where the page answers its exact values (export "read"): levels when painted
) -> dict:
    """One attention matrix as a heatmap with the tokens on both axes."""
    m = np.asarray(matrix, dtype=float)
    n = len(tokens)
    if m.ndim != 2 or m.shape[0] != n or m.shape[1] != n:
        raise ValueError(f"expected a [{n}, {n}] matrix, got shape {m.shape}")
    value_name = value_name or (_("score") if kind == "scores" else _("weight"))
    image = n >= IMAGE_MIN_TOKENS
    levels = image and (small or read is not None)  # the values are read elsewhere, or never
    trace: dict = {"type": "heatmap", "hoverongaps": False}
    if kind == "scores":
        top = zmax if zmax is not None else score_range(m)
        trace.update(colorscale=SCORES_COLORSCALE, zmin=-top, zmax=top, zmid=0)
    elif kind == "weights":
        trace.update(colorscale=WEIGHTS_COLORSCALE, zmin=0.0, zmax=1.0)
    else:
        raise ValueError(f"kind must be 'scores' or 'weights', got {kind!r}")
    masked = None if mask is None else np.asarray(mask, dtype=bool)
    if masked is not None and not masked.any():
        masked = None
    export: dict = {"name": export_name, "kind": "matrix"}
    if levels:
        finite = np.isfinite(m)
        keep = finite if masked is None else finite & ~masked
        export["levels"] = _levels(m, keep, trace["zmin"], trace["zmax"])  # app/pages/web.py packs it as "u1"
        export["shape"] = [n, n]
        if not (keep if masked is None else keep | masked).all():  # a cell without a value, not masked
            export["gaps"] = _mask_runs(~keep if masked is None else ~keep & ~masked)
    else:
        z = finite_or_none(m)  # [query_pos, key_pos]
        trace["z"] = z.astype(np.float32) if n >= FLOAT32_MIN_TOKENS else z  # web.py packs it as "f4"
    gap = 1 if small and not image else 0  # gaps between a thumbnail's cells, while cells are pixels wide
    trace.update(xgap=gap, ygap=gap)
    if small:
        trace.update(showscale=False, hoverinfo="skip")
    else:
        trace["hovertemplate"] = f"%{{text}}<br>{escape(value_name)} = %{{z:.4f}}<extra></extra>"
        trace["colorbar"] = colorbar(value_name, len=0.9)
    data = [trace]
    # The mask's hatched overlay: Plotly draws it over a per-cell heatmap; a painted matrix's masked cells
    # are painted from export "mask", and Plotly draws only the overlay's legend entry (no shapes sent).
    if masked is not None and not (image and small):
        overlay = _mask_overlay(masked, shapes=not image)
        if small:
            overlay.update(showlegend=False, hoverinfo="skip", hoveron="points")
        data.append(overlay)
    if image and masked is not None:
        export["mask"] = _mask_data(masked)
    if small:  # a thumbnail: no labels (nor the tokens for a download: it has none)
        axis = {"showticklabels": False, "showgrid": False, "zeroline": False, "ticks": ""}
        xaxis, yaxis = dict(axis), dict(axis)
    else:
        labels = [token_label(t) for t in tokens]
        xaxis, yaxis = token_axis(_(KEY_AXIS), labels, small=False), token_axis(_(QUERY_AXIS), labels, small=False)
        export.update(
            x=list(tokens),
            y=list(tokens),
            x_title=KEY_AXIS,
            y_title=QUERY_AXIS,
            value=value_name,
            cell_text=_("query {i} {y} → key {j} {x}"),
        )
        if current() != DEFAULT:  # the readout's other words (static/js/explorer-cells.js has them in English)
            export["words"] = {
                "masked": _("masked (no value)"),
                "largest": _("this row's largest {value}: key {j} {x}"),
            }
    layout = base_layout(
        xaxis={**xaxis, "range": [-0.5, n - 0.5]},
        yaxis={**yaxis, "autorange": None, "range": [n - 0.5, -0.5], "scaleanchor": "x", "constrain": "domain"},
        showlegend=masked is not None and not small,
        # above the plot, right-aligned: below it would collide with the key axis' title
        legend={"orientation": "h", "x": 1, "y": 1.0, "yanchor": "bottom", "xanchor": "right", "font": {"size": 12}},
    )
    if image:
        export["draw"] = "image"
    if levels and read is not None and not small:
        export["read"] = read
    if small:
        layout["margin"] = {"l": 2, "r": 2, "t": 2, "b": 2}
    else:
        layout["margin"], layout["xaxis"]["tickangle"] = _token_margins(tokens)
        export["label_px"] = {"x": layout["margin"]["b"] - AXIS_TITLE_PX, "y": layout["margin"]["l"] - AXIS_TITLE_PX}
        if masked is not None:
            layout["margin"]["t"] = 34  # room for the "masked" legend above the plot
    return {"data": data, "layout": layout, "export": export}


def head_thumbnails(
    patterns: np.ndarray, tokens: Sequence[str], *, mask: np.ndarray | None, export_names: Sequence[str]
) -> list[dict]:
    """A layer's heads as thumbnails ([head_index, query_pos, key_pos] weights): attention_heatmap(small=True)
    each, a long text's pooled for every head at once (and its mask once)."""
    n = len(tokens)
    if n <= THUMB_MAX_CELLS:
        return [
            attention_heatmap(p, tokens, kind="weights", mask=mask, small=True, export_name=name)
            for p, name in zip(patterns, export_names)
        ]
    pooled, pooled_mask = _max_pool(np.asarray(patterns, dtype=float), mask, THUMB_MAX_CELLS)
    cells = pooled.shape[-1]  # at least IMAGE_MIN_TOKENS: more than THUMB_MAX_CELLS / 2
    out = []
    for p, name in zip(pooled, export_names):
        fig = attention_heatmap(p, [""] * cells, kind="weights", mask=pooled_mask, small=True, export_name=name)
        fig["export"]["pooled"] = -(-n // THUMB_MAX_CELLS)  # tokens a side of each cell
        out.append(fig)
    return out


def score_range(*matrices: np.ndarray) -> float:
    """One symmetric colour range [-top, top] for one or several matrices (so their colours compare):
    the largest finite |value|; 1 when there is none, or all are 0 (a range still needs a width)."""
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
        "type": "heatmap",
        "z": finite_or_none(v),
        "colorscale": WEIGHTS_COLORSCALE,
        "zmin": 0.0,
        "hovertemplate": f"%{{text}}<br>{escape(value_name)} = %{{z:.4f}}<extra></extra>",
        "colorbar": colorbar(value_name),
    }
    layout = base_layout(
        xaxis={
            "tickmode": "array",
            "tickvals": list(range(len(stages))),
            "ticktext": stage_labels,
            "tickangle": -45,
            "showgrid": False,
        },
        yaxis={**token_axis(_("token (row)"), labels, small=False), "range": [len(labels) - 0.5, -0.5]},
        margin={"l": AXIS_TITLE_PX + label_px(tokens), "r": 10, "t": 10, "b": 10 + int(0.75 * label_px(stages))},
    )
    return {
        "data": [trace],
        "layout": layout,
        "export": {
            "name": export_name,
            "kind": "matrix",
            "x": list(stages),
            "y": list(tokens),
            "x_title": "stage",
            "y_title": "token",
            "value": value_name,
            "cell_text": "token {i} {y} at {x}",
            "label_px": {"y": label_px(tokens)},
        },
    }


def probability_bars(tokens: Sequence[str], probs: Sequence[float], *, export_name: str = "next-token") -> dict:
    """Next-token probabilities, most likely on top."""
    labels = [token_label(t) for t in tokens]
    trace = {
        "type": "bar",
        "orientation": "h",
        "x": [float(p) for p in probs],
        "y": list(range(len(labels))),
        "marker": {"color": "#225ea8"},
        "text": [f"{p:.3f}" for p in probs],
        "textposition": "outside",
        "cliponaxis": False,
        "customdata": labels,
        "hovertemplate": _("next token") + " %{customdata}<br>p = %{x:.4f}<extra></extra>",
    }
    top = max((float(p) for p in probs), default=1.0)
    layout = base_layout(
        xaxis={"title": {"text": _("probability")}, "range": [0, min(1.0, top * 1.25) or 1.0], "rangemode": "tozero"},
        yaxis={
            "tickmode": "array",
            "tickvals": list(range(len(labels))),
            "ticktext": labels,
            "range": [len(labels) - 0.5, -0.5],
            "title": {"text": _("next token")},
        },
        bargap=0.25,
        margin={"l": AXIS_TITLE_PX + label_px(tokens), "r": 40, "t": 10, "b": 50},
    )
    return {
        "data": [trace],
        "layout": layout,
        "export": {"name": export_name, "kind": "bars", "x": list(tokens), "x_title": "token", "value": "probability"},
    }


# ------------------------------------------------------------------ lessons and the calculator

# Okabe & Ito's palette, distinguishable with every common colour-vision deficiency; each series
# also gets its own dash and marker, so lines never differ by colour alone.
SERIES_COLORS = ["#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#000000"]
SERIES_DASHES = ["solid", "dash", "dot", "dashdot", "longdash", "longdashdot", "solid"]
SERIES_SYMBOLS = ["circle", "square", "diamond", "triangle-up", "x", "cross", "star"]
NOT_COUNTED_COLOR = "#bdbdbd"


def line_chart(
    series: Sequence[tuple[str, Sequence[float], Sequence[float]]],  # (name, x, y) per line
    *,
    x_title: str,
    y_title: str,
    export_name: str,
    x_log: bool = False,
    y_log: bool = False,
    y_range: Sequence[float] | None = None,
    y_hover: str = ".4f",
    y_tickformat: str | None = None,
    x_tickvals: Sequence[float] | None = None,
) -> dict:
    """Several y-versus-x lines on one chart (top weight vs d, dot product vs gap, cache size vs length)."""
    data = []
    for k, (name, x, y) in enumerate(series):
        style = k % len(SERIES_COLORS)
        data.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": escape(name),
                "x": [float(v) for v in x],
                "y": [float(v) for v in y],
                "line": {"color": SERIES_COLORS[style], "dash": SERIES_DASHES[style], "width": 2.5},
                "marker": {"symbol": SERIES_SYMBOLS[style], "size": 7},
                "hovertemplate": f"{escape(name)}<br>{escape(x_title)} = %{{x}}<br>{escape(y_title)} = "
                f"%{{y:{y_hover}}}<extra></extra>",
            }
        )
    xaxis: dict = {"title": {"text": escape(x_title)}, "type": "log" if x_log else "linear", "zeroline": False}
    if x_tickvals is not None:
        xaxis.update(
            tickmode="array",
            tickvals=[float(v) for v in x_tickvals],
            ticktext=[f"{v:,.0f}" if float(v).is_integer() else f"{v:g}" for v in x_tickvals],
        )
    yaxis: dict = {"title": {"text": escape(y_title)}, "type": "log" if y_log else "linear", "zeroline": False}
    if y_range is not None:
        yaxis["range"] = list(y_range)
    if y_tickformat:
        yaxis["tickformat"] = y_tickformat
    layout = base_layout(
        xaxis=xaxis, yaxis=yaxis, showlegend=True, legend={"orientation": "h", "x": 0, "y": 1.02, "yanchor": "bottom"}
    )
    layout["margin"] = {"l": 70, "r": 20, "t": 30, "b": 60}
    return {
        "data": data,
        "layout": layout,
        "export": {
            "name": export_name,
            "kind": "series",
            "x_title": x_title,
            "y_title": y_title,
            "series": [{"name": n, "x": list(map(float, x)), "y": list(map(float, y))} for n, x, y in series],
        },
    }


def value_heatmap(
    matrix: np.ndarray,  # [rows, columns], e.g. [pos, d_model]
    *,
    x_title: str,
    y_title: str,
    value_name: str,
    export_name: str,
) -> dict:
    """A numeric matrix with numbered rows and columns, on the diverging scale centred on 0
    (a positional encoding: rows are positions, columns dimensions)."""
    m = np.asarray(matrix, dtype=float)
    if m.ndim != 2:
        raise ValueError(f"expected a 2-d matrix, got shape {m.shape}")
    top = score_range(m)
    trace = {
        "type": "heatmap",
        "z": finite_or_none(m),
        "colorscale": SCORES_COLORSCALE,
        "zmin": -top,
        "zmax": top,
        "zmid": 0,
        "hoverongaps": False,
        "hovertemplate": f"{escape(y_title)} %{{y}}, {escape(x_title)} %{{x}}<br>{escape(value_name)} = "
        f"%{{z:.4f}}<extra></extra>",
        "colorbar": colorbar(value_name, len=0.9),
    }
    layout = base_layout(
        xaxis={"title": {"text": escape(x_title)}, "showgrid": False, "zeroline": False},
        yaxis={"title": {"text": escape(y_title)}, "showgrid": False, "zeroline": False, "autorange": "reversed"},
    )
    rows, cols = m.shape
    return {
        "data": [trace],
        "layout": layout,
        "export": {
            "name": export_name,
            "kind": "matrix",
            "x": list(range(cols)),
            "y": list(range(rows)),
            "x_title": x_title,
            "y_title": y_title,
            "value": value_name,
        },
    }


def component_bars(
    names: Sequence[str],
    sizes: Sequence[int],  # parameters each component adds, or would add if it were counted
    counted: Sequence[bool],
    notes: Sequence[str],
    *,
    value_name: str | None = None,
    export_name: str = "parameters",
) -> dict:
    """Where a model's parameters are: one bar per component; components that exist but add no
    parameters (a tied unembedding, the mask buffer) are grey and hatched, and say so."""
    labels = [escape(n) for n in names]
    value_name = value_name or _("parameters")
    text = [f"{s:,}" if c else _("{n:,} (not counted)").format(n=s) for s, c in zip(sizes, counted)]
    trace = {
        "type": "bar",
        "orientation": "h",
        "x": [int(s) for s in sizes],
        "y": list(range(len(labels))),
        "marker": {
            "color": ["#225ea8" if c else NOT_COUNTED_COLOR for c in counted],
            "pattern": {"shape": ["" if c else "/" for c in counted], "fgcolor": "#737373"},
            "line": {"width": 0},
        },
        "text": text,
        "textposition": "outside",
        "cliponaxis": False,
        "customdata": [[lab, escape(note)] for lab, note in zip(labels, notes)],
        "hovertemplate": "%{customdata[0]}<br>%{x:,} " + escape(value_name) + "<br>%{customdata[1]}<extra></extra>",
    }
    top = max((int(s) for s in sizes), default=1) or 1
    layout = base_layout(
        xaxis={
            "title": {"text": escape(value_name)},
            "range": [0, top * 1.35],
            "tickformat": "~s",
            "rangemode": "tozero",
        },
        yaxis={
            "tickmode": "array",
            "tickvals": list(range(len(labels))),
            "ticktext": labels,
            "range": [len(labels) - 0.5, -0.5],
            "automargin": True,
        },
        bargap=0.3,
    )
    return {
        "data": [trace],
        "layout": layout,
        "export": {"name": export_name, "kind": "bars", "x": list(names), "x_title": "component", "value": value_name},
    }
