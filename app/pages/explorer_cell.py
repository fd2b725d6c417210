"""The explorer's "This cell" panel: one cell of the chosen head's four stages, opened into the vectors that
make it (core/cell.py computes; this module formats).

The open cell is part of the explorer's state (`cell=QUERY,KEY`, app/pages/web.py), so a link opens it and a
plain GET renders the panel with the page. Moving it (a click, the arrow keys: static/js/explorer-cell.js)
asks the view's own URL for one small answer, from the head's vectors and stages the page kept when it
drew the view (`CellCache`, per app), without running the model again:
- `part=cell`: the panel alone (templates/partials/cell.html), HTML;
- `part=cell.json`: the download, `{layer, head, query, key, q, k, products, score, scaled, masked, weight,
  row_weights, v, output}`, full-precision floats, a masked score null.
When the kept head is gone (evicted, or another server process drew the view), the view runs again.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Callable

import numpy as np
from fastapi import Request
from fastapi.responses import PlainTextResponse, Response

from app.http import jsonio, language
from app.http.language import _
from app.pages import figures, web
from app.service import Service
from app.service.results import ExplorerView, HeadCells

# What the panel draws of the weighted values: the keys with the largest weights, one strip each (in key
# order), and the rest summed in one strip, so that a 1,024-token row is a few lines, and still adds up.
TOP_VALUES = 6
# The heads kept for their cells, per server process: the stages are four T × T matrices (128 tokens: 0.5 MB;
# 1,024 tokens: 34 MB), so a budget in bytes, the oldest out first.
CELL_CACHE_BYTES = 96 * 2**20
DIGITS = 3  # decimals the panel prints (the download has every bit)


class CellCache:
    """The latest views' chosen heads (`HeadCells`), by the view's canonical URL without its cell; thread-safe."""

    def __init__(self, budget: int = CELL_CACHE_BYTES):
        self.budget = budget
        self._heads: OrderedDict[str, HeadCells] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, url: str, head: HeadCells) -> None:
        if head.nbytes > self.budget:
            return
        with self._lock:
            self._heads[url] = head
            self._heads.move_to_end(url)
            while sum(h.nbytes for h in self._heads.values()) > self.budget:
                self._heads.popitem(last=False)

    def get(self, url: str) -> HeadCells | None:
        with self._lock:
            found = self._heads.get(url)
            if found is not None:
                self._heads.move_to_end(url)
            return found


def cell_cache(request: Request) -> CellCache:
    state = request.app.state
    if getattr(state, "explorer_cells", None) is None:
        state.explorer_cells = CellCache()
    return state.explorer_cells


def keep(request: Request, parsed: web.Parsed, v: ExplorerView) -> None:
    """Keep the view's head for its cells; an open cell the text no longer reaches is closed (as layer and
    head are clamped)."""
    c = parsed.controls
    if c.cell is not None and max(c.cell) >= len(v.tokens):
        parsed.controls = dataclasses.replace(c, cell=None)
    cell_cache(request).put(web.explorer_query(parsed, cell=False), v.cells)


# ------------------------------------------------------------------ formatting


def _number(x: float) -> str:
    return "−∞" if x == -np.inf else f"{x:.{DIGITS}f}".replace("-", "−")


def _strip(values: np.ndarray, top: float | None = None) -> list[dict]:
    """A vector as cells: its printed value and a background, orange for positive and purple for negative
    (the heatmaps' colours), as strong as |x| against the strip's largest `top`."""
    top = float(np.max(np.abs(values))) if top is None else top
    out = []
    for x in values.tolist():
        a = 0.0 if top == 0 else min(abs(x) / top, 1.0) * 0.5  # ≤ 0.5: dark text stays readable on it
        rgb = "230, 97, 1" if x >= 0 else "94, 60, 153"
        out.append({"text": _number(x), "title": repr(x), "style": f"background: rgba({rgb}, {a:.2f})"})
    return out


def _mask_verdict(head: HeadCells, query: int, key: int, masked: bool) -> str:
    cfg = head.config
    if masked and cfg.causal and key > query:
        return _("Masked: key {key} comes after query {query}, so its score becomes −∞ and its weight 0.").format(
            key=key, query=query
        )
    if masked:
        return _(
            "Masked: key {key} lies further back than this local layer's window of {window} tokens, so its "
            "score becomes −∞ and its weight 0."
        ).format(key=key, window=cfg.window(head.layer))
    if cfg.causal:
        return _("Kept: key {key} is not after query {query}, so the mask leaves its score as it is.").format(
            key=key, query=query
        )
    return _("Kept: no mask in this view, every query sees every key.")


def _divisor_words(head: HeadCells, divisor: float) -> str:
    cfg = head.config
    if cfg.use_attn_scale and cfg.attn_temperature == 1:
        return _("÷ √d_head = √{d_head} = {divisor}").format(d_head=cfg.d_head, divisor=f"{divisor:g}")
    if cfg.use_attn_scale:
        return _("÷ √d_head × temperature = √{d_head} × {t:g} = {divisor}").format(
            d_head=cfg.d_head, t=cfg.attn_temperature, divisor=f"{divisor:g}"
        )
    if cfg.attn_temperature != 1:
        return _("÷ the temperature {t:g} only: this model does not divide its scores by √d_head").format(
            t=cfg.attn_temperature
        )
    return _("÷ 1: this model does not divide its scores by √d_head (use_attn_scale is off)")


def context(head: HeadCells, query: int, key: int) -> dict:
    """The panel's words and numbers for cell (query, key) of `head`."""
    cell = head.cell(query, key)
    cfg = head.config
    labels = [figures.visible(t) for t in head.tokens]
    qk_top = float(max(np.max(np.abs(cell.q)), np.max(np.abs(cell.k)), 1e-300))
    weights = cell.row_weights
    visible_keys = np.flatnonzero(~head.stages.mask[query])
    top = sorted(visible_keys[np.argsort(-weights[visible_keys], kind="stable")[:TOP_VALUES]].tolist())
    if cell.key not in top and not cell.masked:
        top = sorted([*top[: TOP_VALUES - 1], cell.key])
    weighted = weights[:, None] * cell.v  # [key_pos, d_head]
    rest = np.setdiff1d(np.arange(len(weights)), top)
    out_top = float(max(np.max(np.abs(weighted[top])) if top else 0.0, np.max(np.abs(cell.output)), 1e-300))
    rows = [
        {
            "key": j,
            "token": labels[j],
            "weight": _number(weights[j]),
            "strip": _strip(weighted[j], out_top),
            "this": j == key,
        }
        for j in top
    ]
    largest = float(weights.max())
    bars = [
        {"height": f"{100 * w / largest:.1f}" if largest > 0 else "0", "this": j == key, "masked": bool(m)}
        for j, (w, m) in enumerate(zip(weights.tolist(), head.stages.mask[query].tolist()))
    ]
    group = cfg.group_size
    said = _(
        "Query {query} {qt} → key {key} {kt}: q·k = {score} (the sum of {d} products); {divisor} gives {scaled}. "
        "{verdict} Weight {weight} of the row."
    ).format(
        query=query,
        qt=labels[query],
        key=key,
        kt=labels[key],
        score=_number(cell.score),
        d=cfg.d_head,
        divisor=_divisor_words(head, cell.divisor),
        scaled=_number(cell.scaled),
        verdict=_mask_verdict(head, query, key, cell.masked),
        weight=_number(cell.weight),
    )
    return {
        "layer": head.layer,
        "head": head.head,
        "query": query,
        "key": key,
        "query_token": labels[query],
        "key_token": labels[key],
        "d_head": cfg.d_head,
        "dims": list(range(cfg.d_head)),
        "q": _strip(cell.q, qk_top),
        "k": _strip(cell.k, qk_top),
        "products": _strip(cell.products),
        "q_unrotated": None if cell.q_unrotated is None else _strip(cell.q_unrotated, qk_top),
        "k_unrotated": None if cell.k_unrotated is None else _strip(cell.k_unrotated, qk_top),
        "kv_head": cell.kv_head if cfg.n_key_value_heads != cfg.n_heads else None,
        "kv_first": cell.kv_head * group,
        "kv_last": cell.kv_head * group + group - 1,
        "score": _number(cell.score),
        "product_sum": _number(float(cell.products.sum())),
        "divisor": _divisor_words(head, cell.divisor),
        "scaled": _number(cell.scaled),
        "masked": cell.masked,
        "verdict": _mask_verdict(head, query, key, cell.masked),
        "weight": _number(cell.weight),
        "n_keys": len(weights),
        "n_visible": int(visible_keys.size),
        "bars": bars,
        "values": rows,
        "rest_count": int(np.count_nonzero(~head.stages.mask[query][rest])) if rest.size else 0,
        "rest_weight": _number(float(weights[rest].sum())) if rest.size else None,
        "rest_strip": _strip(weighted[rest].sum(axis=0), out_top) if rest.size else None,
        "output": _strip(cell.output, out_top),
        "said": said,
    }


def lesson_context(cell, tokens: list[str], digits: int = 2) -> dict:
    """The attention lesson's opened cell (app/service/lessons.py AttentionLessonResult.cell): q, k, their
    products and sum, the division, the weight, and the weighted values adding up to the output row; the score
    and weight also at the spec's printed precision (`digits`), so the printed 4.15 is seen as its products."""
    qk_top = float(max(np.max(np.abs(cell.q)), np.max(np.abs(cell.k)), 1e-300))
    weighted = cell.row_weights[:, None] * cell.v  # [key_pos, d_k]
    out_top = float(max(np.max(np.abs(weighted)), np.max(np.abs(cell.output)), 1e-300))
    return {
        "query": cell.query,
        "key": cell.key,
        "query_token": tokens[cell.query],
        "key_token": tokens[cell.key],
        "dims": list(range(cell.q.size)),
        "q": _strip(cell.q, qk_top),
        "k": _strip(cell.k, qk_top),
        "products": _strip(cell.products),
        "score": _number(cell.score),
        "divisor": f"{cell.divisor:g}",
        "scaled": _number(cell.scaled),
        "printed": f"{np.round(cell.scaled, digits):.{digits}f}",
        "masked": cell.masked,
        "weight": _number(cell.weight),
        "printed_weight": f"{np.round(cell.weight, digits):.{digits}f}",
        "values": [
            {"key": j, "token": t, "weight": _number(w), "strip": _strip(weighted[j], out_top), "this": j == cell.key}
            for j, (t, w) in enumerate(zip(tokens, cell.row_weights.tolist()))
        ],
        "output": _strip(cell.output, out_top),
    }


# ------------------------------------------------------------------ the page's answers


def page_context(parsed: web.Parsed, v: ExplorerView | None) -> dict | None:
    """The panel as the page renders it: the open cell's context, or None (the panel's hint)."""
    c = parsed.controls
    if v is None or c.cell is None:
        return None
    return context(v.cells, *c.cell)


Run = Callable[[Request, Service, web.Parsed], tuple[ExplorerView | None, str | None]]


def answer(request: Request, svc: Service, run: Run) -> Response:
    """`part=cell` (the panel, HTML) or `part=cell.json` (the download) for the URL's view and `cell`."""
    query = request.query_params
    part = query["part"]
    parsed = web.parse_explorer(query, svc.views.models(), preferred=svc.settings.default_model)
    if part not in ("cell", "cell.json"):
        return PlainTextResponse(f"part={part!r} is not cell or cell.json", status_code=422)
    if parsed.errors:
        return PlainTextResponse("; ".join(parsed.errors), status_code=422)
    if parsed.controls.cell is None:
        return PlainTextResponse(_("cell=QUERY,KEY is missing: which cell to open"), status_code=422)
    cell = parsed.controls.cell
    head = cell_cache(request).get(web.explorer_query(parsed, cell=False))
    if head is None:  # gone from the cache: the view again (it keeps its head for the next move)
        v, error = run(request, svc, parsed)
        if v is None:  # why not: error
            return PlainTextResponse(error or "", status_code=422)
        head = v.cells
    n = len(head.tokens)
    if max(cell) >= n:
        return PlainTextResponse(
            _("cell={query},{key} is outside the text's {n} tokens (use 0..{last})").format(
                query=cell[0], key=cell[1], n=n, last=n - 1
            ),
            status_code=422,
        )
    headers = {"Cache-Control": "no-store"}
    if part == "cell.json":
        name = f"cell-layer{head.layer}-head{head.head}-query{cell[0]}-key{cell[1]}.json"
        body = jsonio.dumps(head.cell(*cell).as_json())  # each float as the shortest text that reads back exactly
        headers["Content-Disposition"] = f'attachment; filename="{name}"'
        return Response(body, media_type="application/json", headers=headers)
    return web.templates.TemplateResponse(
        request,
        "partials/cell.html",
        {
            "cell": context(head, *cell),
            "cell_url": web.explorer_query(parsed),
            "cell_base": language.localized(web.explorer_query(parsed, cell=False)),
        },
        headers=headers,
    )
