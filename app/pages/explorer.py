"""The explorer page at `/`.

The route reads the page's state from the URL (app/pages/web.py), validates it with the API's own
request model (app/api/requests.py: same names and limits), asks the service for the explorer's view
(one preparation of the model, app/service/) and formats the result as Plotly figure dicts
(app/pages/figures.py) in templates/explorer.html.

A plain GET answers the full page; an htmx request only the block that changed: "results" on
every change, "explorer" (controls too) when the model changes. Bad settings render their
message in place of the figures, with status 422. ARCHITECTURE.md follows one edit of the text box
through here to the redrawn heatmap.

A painted matrix (IMAGE_MIN_TOKENS tokens or more) travels as its colour levels (app/pages/figures.py);
its exact values are read when a reader reads them: the same URL with `values=<figure>&rows=<from>-<to>`
answers those rows as float64 bytes (`explorer_values`), from the matrices the page kept when it drew
them (`ReadCache`), or by running the view again when they are gone.
"""

from __future__ import annotations

import dataclasses
import gzip
import math
import threading
from collections import OrderedDict
from urllib.parse import urlencode

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, PlainTextResponse, Response

from app.api import requests
from app.deps import ServiceDep
from app.http import language
from app.http.language import _, ngettext
from app.pages import explorer_cell, figures, inspect_figures, web
from app.pages import steer as steer_page
from app.service import InputError, Service
from app.service.results import AttentionStages, ExplorerView

router = APIRouter(tags=["pages"], include_in_schema=False)

TOP_K = 10  # next-token bars shown
# From this many tokens the page sends the softmax weights and, only when asked (stages=1), the
# three scores stages: each is a T × T matrix (1,024 tokens: 5.6 MB of base64 float32), and three
# of them would be most of the page's bytes and of its first load.
STAGES_ON_REQUEST_TOKENS = 256
# The exact values of recent views' painted matrices, kept per server process for their readers (a
# 1,024-token view's weights are 8 MB): past this, the oldest go, and a read of theirs runs the view again.
READ_CACHE_BYTES = 128 * 2**20


def _config_line(v: ExplorerView) -> str:
    cfg = v.config
    divisor = (f"√{cfg.d_head}" if cfg.use_attn_scale else "1") + (
        f" × {cfg.attn_temperature:g}" if cfg.attn_temperature != 1 else ""
    )
    kv = cfg.n_key_value_heads
    heads = (
        _("{n} heads").format(n=cfg.n_heads)
        if kv == cfg.n_heads
        else ngettext("{n} query heads share {kv} K/V head", "{n} query heads share {kv} K/V heads", kv).format(
            n=cfg.n_heads, kv=kv
        )
    )
    return " · ".join(
        [
            _("{model}: {n} tokens").format(model=v.model, n=len(v.tokens)),
            f"d_model {cfg.d_model}",
            f"{heads} × d_head {cfg.d_head}",
            ngettext("{n} layer", "{n} layers", cfg.n_layers).format(n=cfg.n_layers),
            f"d_mlp {cfg.d_mlp}",
            _("{scheme} positions").format(scheme=cfg.positional_embedding_type),
            _("causal") if cfg.causal else _("bidirectional"),
            _("scores ÷ {divisor}").format(divisor=divisor),
            _("seed {seed}").format(seed=v.seed),
        ]
    )


def _stage_figures(st: AttentionStages, v: ExplorerView, where: str, only_weights: bool = False) -> list[dict]:
    cfg = v.config
    # one colour range, so scaling shows
    top = None if only_weights else figures.score_range(st.raw, st.scaled, st.masked)
    divisor = (
        ("√d_head = √" + f"{cfg.d_head} = {math.sqrt(cfg.d_head):.3g}")
        if cfg.use_attn_scale
        else _("1 (scaling is off)")
    )
    if cfg.attn_temperature != 1:
        divisor += _(", then ÷ the temperature {t:g}").format(t=cfg.attn_temperature)
    specs = [
        (
            "raw",
            _("1 · Raw scores  Q Kᵀ"),
            st.raw,
            "scores",
            None,
            _("How well each query matches each key: a dot product. Orange is positive, purple negative."),
        ),
        ("scaled", _("2 · Scaled"), st.scaled, "scores", None, _scaling_caption(cfg, divisor)),
        ("masked", _("3 · Masked"), st.masked, "scores", st.mask, _mask_caption(v)),
        (
            "weights",
            _("4 · Softmax weights"),
            st.weights,
            "weights",
            st.mask,
            _("Each row exponentiated and normalised: weights are ≥ 0 and each row sums to 1."),
        ),
    ]
    if only_weights:
        specs = specs[-1:]
    return [
        {
            "key": key,
            "title": title,
            "caption": caption,
            "figure": figures.attention_heatmap(
                matrix,
                v.tokens,
                kind=kind,
                mask=mask,
                zmax=top if kind == "scores" else None,
                export_name=f"{where}-{key}",
                read=f"stage-{key}",
            ),
        }
        for key, title, matrix, kind, mask, caption in specs
    ]


# ------------------------------------------------------------------ words that fit the model shown


def _scaling_caption(cfg, divisor: str) -> str:
    """Stage 2: what the scores are divided by, and why; when they are not (scaling switched off, or a model
    that never scales, GPT-Neo), what that means."""
    if cfg.use_attn_scale:
        return _(
            "Every score divided by {divisor}, so the softmax does not saturate as d_head grows. Same colour "
            "range as stage 1."
        ).format(divisor=divisor)
    if cfg.attn_temperature != 1:
        return _(
            "Scores are not divided by √d_head here, only by the temperature {t:g}. Same colour range as stage 1."
        ).format(t=cfg.attn_temperature)
    return _(
        "Scores are not divided by √d_head here: this stage equals stage 1, and the softmax saturates sooner as "
        "d_head grows."
    )


def _mask_caption(v: ExplorerView) -> str:
    """Stage 3: which keys the mask hides for the layer shown (the future; a local layer's window too), or
    why nothing is hidden (the mask switched off, or an encoder, which has none to switch on)."""
    cfg = v.config
    window = cfg.window(v.layer)
    if cfg.causal and window is not None:
        return _(
            "The mask sets to −∞ (hatched) every key after the query and, in this local layer, every key more "
            "than {back} tokens back: a token sees itself and the {back} before it."
        ).format(back=window - 1)
    if cfg.causal:
        return _("The causal mask sets every key after the query to −∞ (hatched): a token cannot see the future.")
    if "causal" not in v.prepared.model.toggles:
        return _(
            "No mask: this model reads the whole text at once, every token looking at every token, the later "
            "ones included."
        )
    return _("No mask: every token may look at every token. Turn on the causal mask to hide the future.")


def _next_caption(v: ExplorerView) -> str:
    """Under the next-token bars: what the weights behind them are (random, trained here, a checkpoint's)."""
    model = v.prepared.model
    if model.draws_weights:
        kind = _(
            "Random weights: these preferences are noise, not knowledge (a uniform guess would give each of the "
            "{n} tokens {p:.3f}); every language model starts from weights like these."
        ).format(n=v.config.d_vocab, p=1 / v.config.d_vocab)
    elif model.kind == "trained":
        kind = _("Weights trained by core.train: the bars are what this model learned to expect after such a text.")
    else:
        kind = _("Pretrained weights, loaded from a checkpoint: the bars are what this model expects after the text.")
    if v.ablation_effect is not None and v.ablation_effect.changes:
        return _("Hatched grey: the prediction without the ablation; blue: with it.") + " " + kind
    return kind


def _residual_captions(cfg) -> tuple[str, str]:
    """The residual stream's two figures: what each column of the stream is, and what each sub-layer writes,
    as this model's blocks compute them (pre-norm, parallel, post-norm, attention only)."""
    if cfg.attn_only:
        stream = _(
            "Every column is the stream at one point: the token embedding, then for each layer its input "
            "(pre = resid_pre) and after attention adds to it (post = resid_post); this model's blocks have no "
            "MLP."
        )
        writes = _(
            "Each attention sub-layer adds to the stream (these blocks have no MLP); this is the size of what "
            "it adds to each token."
        )
    elif cfg.block_type == "post_norm":
        stream = _(
            "Every column is the stream at one point: the token embedding, then for each layer its input "
            "(pre = resid_pre), attention's output added and normalised (mid = resid_mid), and the MLP's "
            "output added and normalised (post = resid_post)."
        )
        writes = _(
            "Each attention and MLP sub-layer adds to the stream, and a layer norm then rescales the sum; this "
            "is the size of what each adds to each token, before the norm."
        )
    elif cfg.parallel_attn_mlp:
        stream = _(
            "Every column is the stream at one point: the token embedding, then for each layer its input "
            "(pre = resid_pre), attention's output added to it (mid = resid_mid, a partial sum: the MLP reads "
            "the input too) and the MLP's output added as well (post = resid_post)."
        )
        writes = _(
            "Attention and the MLP both read a layer's input and add to the stream side by side; this is the "
            "size of what each adds to each token."
        )
    else:
        stream = _(
            "Every column is the stream at one point: the token embedding, then for each layer its input "
            "(pre = resid_pre), after attention adds to it (mid = resid_mid) and after the MLP adds to it "
            "(post = resid_post)."
        )
        writes = _(
            "Each attention and MLP sub-layer only adds to the stream; this is the size of what it adds to each token."
        )
    return stream, writes


def _compare_figures(v: ExplorerView, where: str) -> list[dict]:
    """The chosen head with and without the causal mask, the masked one first (a view asked to compare)."""
    if v.other_stages is None:
        return []
    pair = sorted([(v.config.causal, v.stages), (not v.config.causal, v.other_stages)], key=lambda p: not p[0])
    return [
        {
            "key": "causal" if is_causal else "bidirectional",
            "title": _("With the causal mask") if is_causal else _("Without the mask (bidirectional)"),
            "caption": (
                _("Each token mixes only itself and earlier tokens; rows are renormalised.")
                if is_causal
                else _("Each token mixes every token, later ones included.")
            ),
            "figure": figures.attention_heatmap(
                st.weights,
                v.tokens,
                kind="weights",
                mask=st.mask if is_causal else None,
                export_name=f"{where}-weights-{'causal' if is_causal else 'bidirectional'}",
                read="compare-causal" if is_causal else "compare-bidirectional",
            ),
        }
        for is_causal, st in pair
    ]


def _short(stage: str) -> str:
    """ "1 resid_mid" -> "1 mid": the stream's columns stay legible for deep models."""
    return stage.replace("resid_", "")


def view_context(v: ExplorerView, ablated: set[tuple[int, int]], all_stages: bool = False) -> dict:
    """The explorer's figures and texts from the service's view. A long text's scores stages only
    with all_stages (STAGES_ON_REQUEST_TOKENS)."""
    layer, head = v.layer, v.head
    where = f"layer{layer}-head{head}"
    names = [f"layer{layer}-head{h}-weights" for h in range(v.config.n_heads)]
    head_figures = figures.head_thumbnails(v.patterns, v.tokens, mask=v.stages.mask, export_names=names)
    next_figure = frozen_figure = None
    if v.ablation_effect is not None and v.ablation_effect.changes:
        changes = v.ablation_effect.changes
        next_figure = inspect_figures.probability_change_bars(
            [t.token for t in changes], [t.baseline_prob for t in changes], [t.prob for t in changes]
        )
        if v.frozen_ablation is not None:  # the same tokens with every later attention pattern frozen
            frozen_figure = inspect_figures.probability_change_bars(
                [t.token for t in v.frozen_ablation],
                [t.baseline_prob for t in v.frozen_ablation],
                [t.prob for t in v.frozen_ablation],
                export_name="next-token-ablation-frozen",
            )
    elif v.top_k:
        next_figure = figures.probability_bars([t.token for t in v.top_k], [t.prob for t in v.top_k])
    rollout = None
    if v.rollout is not None:
        rollout = figures.attention_heatmap(
            v.rollout,
            v.tokens,
            kind="weights",
            value_name=_("rollout"),
            export_name=f"rollout-through-layer{layer}",
            read="rollout",
        )
    norms = v.residual
    on_request = len(v.tokens) >= STAGES_ON_REQUEST_TOKENS
    stages = _stage_figures(v.stages, v, where, only_weights=on_request and not all_stages)
    residual_caption, writes_caption = _residual_captions(v.config)
    return {
        "ablated": ablated,
        "ablation": v.ablation_effect,
        "rollout_figure": rollout,
        "model_name": v.model,
        "tokens": v.tokens,
        "token_labels": [figures.visible(t) for t in v.tokens],
        "config_line": _config_line(v),
        "layer": layer,
        "head": head,
        "n_layers": v.config.n_layers,
        "head_figures": head_figures,
        "stages": stages,
        "stages_on_request": on_request,
        # under grouped-query attention, the K/V head each query head reads (its card says so)
        "kv_heads": v.kv_heads if v.config.n_key_value_heads != v.config.n_heads else None,
        "compare": _compare_figures(v, where) if v.other_stages is not None else None,
        "residual_figure": figures.stage_heatmap(
            norms.stream,
            v.tokens,
            [_short(n) for n in norms.stream_names],
            value_name="‖x‖",
            export_name="residual-stream-norms",
        ),
        "writes_figure": figures.stage_heatmap(
            norms.writes, v.tokens, norms.writes_names, value_name=_("‖added‖"), export_name="sublayer-output-norms"
        ),
        "next_figure": next_figure,
        "next_caption": _next_caption(v),
        "frozen_figure": frozen_figure,
        "frozen_ablation": v.frozen_ablation,
        # the chosen head on the circuits page (/circuits: why it attends, what it writes, what patching it does)
        "circuits_url": (
            language.localized("/circuits?" + urlencode({"model": v.model, "layer": layer, "head": head}))
            if v.config.block_type == "pre_norm" and not v.prepared.model.is_encoder
            else None
        ),
        "residual_caption": residual_caption,
        "writes_caption": writes_caption,
        "heads_hint": (
            _(
                "— softmax weights; pick one to see its weights (tick “All four stages” for its scores too), "
                "or ablate it to see what depends on it"
            )
            if on_request and not all_stages
            else _("— softmax weights; pick one to see its four stages, or ablate it to see what depends on it")
        ),
        "shapes": [
            {"name": r.name, "axes": r.axes, "shape": web.shape(r.dims), "layer_start": r.layer_start} for r in v.shapes
        ],
    }


def readable(v: ExplorerView, all_stages: bool) -> dict[str, np.ndarray]:
    """The matrices behind the view's painted figures, by the key their export says ("read"), as the
    figures hold them: [query_pos, key_pos], masked scores -inf. None below IMAGE_MIN_TOKENS, where the
    page holds every value."""
    if len(v.tokens) < figures.IMAGE_MIN_TOKENS:
        return {}
    st = v.stages
    stages = {"raw": st.raw, "scaled": st.scaled, "masked": st.masked, "weights": st.weights}
    if len(v.tokens) >= STAGES_ON_REQUEST_TOKENS and not all_stages:
        stages = {"weights": st.weights}
    out = {f"stage-{key}": m for key, m in stages.items()}
    if v.other_stages is not None:
        out["compare-causal" if v.config.causal else "compare-bidirectional"] = st.weights
        out["compare-bidirectional" if v.config.causal else "compare-causal"] = v.other_stages.weights
    if v.rollout is not None:
        out["rollout"] = v.rollout
    return out


def head_levels(v: ExplorerView) -> dict[str, np.ndarray]:
    """The colour levels of the layer's other heads, by "head-<h>", where their thumbnails are pooled
    (more than THUMB_MAX_CELLS tokens): a click on one repaints the weights from these at once."""
    if len(v.tokens) <= figures.THUMB_MAX_CELLS:
        return {}
    return {
        f"head-{h}": figures.weights_levels(v.patterns[h], v.stages.mask)
        for h in range(v.config.n_heads)
        if h != v.head
    }


class ReadCache:
    """The painted matrices of the latest views this process drew, by their canonical URL, so that
    reading a cell (hover, the selected cell, a download) does not run the model again. Oldest out first,
    within READ_CACHE_BYTES; thread-safe (routes run in FastAPI's threadpool)."""

    def __init__(self, budget: int = READ_CACHE_BYTES):
        self.budget = budget
        self._views: OrderedDict[str, dict[str, np.ndarray]] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, url: str, matrices: dict[str, np.ndarray]) -> None:
        size = sum(m.nbytes for m in matrices.values())
        if not matrices or size > self.budget:
            return
        with self._lock:
            self._views[url] = matrices
            self._views.move_to_end(url)
            while sum(m.nbytes for ms in self._views.values() for m in ms.values()) > self.budget:
                self._views.popitem(last=False)

    def get(self, url: str) -> dict[str, np.ndarray] | None:
        with self._lock:
            found = self._views.get(url)
            if found is not None:
                self._views.move_to_end(url)
            return found


def read_cache(request: Request) -> ReadCache:
    """This app's cache (one per app: a test's other app, with other models, has its own)."""
    state = request.app.state
    if getattr(state, "explorer_reads", None) is None:
        state.explorer_reads = ReadCache()
    return state.explorer_reads


def _run(request: Request, svc: Service, parsed: web.Parsed) -> tuple[ExplorerView | None, str | None]:
    """The explorer's view of a parsed state, or why it cannot run."""
    c = parsed.controls
    model = svc.views.models()[c.model]
    if parsed.errors:
        return None, "; ".join(parsed.errors)
    # heads that no longer exist (fewer layers or heads now) are dropped, as layer and head are clamped
    n_layers = parsed.given.get("n_layers", model.cfg.n_layers)
    n_heads = parsed.given.get("n_heads", model.cfg.n_heads)
    c = parsed.controls = dataclasses.replace(
        c, ablate=tuple((layer, head) for layer, head in c.ablate if layer < n_layers and head < n_heads)
    )
    try:
        spec = requests.AblatingRequest(**parsed.request()).spec()
        v = svc.views.explorer(
            spec, c.layer, c.head, compare=c.compare, rollout=c.rollout, top_k=0 if model.is_encoder else TOP_K
        )
    except web.PAGE_ERRORS as exc:
        return None, web.error_message(exc)
    c = parsed.controls = dataclasses.replace(c, layer=v.layer, head=v.head)  # what is shown is what the URL will say
    read_cache(request).put(web.explorer_query(parsed, cell=False), readable(v, c.all_stages) | head_levels(v))
    explorer_cell.keep(request, parsed, v)
    return v, None


@router.get("/", response_class=HTMLResponse, summary="The explorer")
def explorer(request: Request, svc: ServiceDep) -> Response:
    if "values" in request.query_params or "levels" in request.query_params:
        return explorer_values(request, svc)
    if "part" in request.query_params:  # the open cell's panel or its download
        return explorer_cell.answer(request, svc, _run)
    model_changed = web.is_fragment(request) and request.headers.get("hx-trigger-name") == "model"
    models = svc.views.models()
    parsed = web.parse_explorer(
        request.query_params, models, preferred=svc.settings.default_model, model_changed=model_changed
    )
    model = models[parsed.controls.model]
    v, error = _run(request, svc, parsed)
    c = parsed.controls  # as _run left it: the head shown, the ablated heads that exist
    view = None if v is None else view_context(v, set(c.ablate), c.all_stages)
    steer_errors: list[str] = []
    steering = steer_page.parse(request.query_params, steer_errors, svc.settings.max_steers)
    if view is not None and v is not None and v.top_k and (steering.active or steer_errors):
        try:  # the view carries a steer (app/pages/steer.py's URL state): the bars are the steered prediction
            if steer_errors:
                raise InputError("; ".join(steer_errors))
            spec = requests.AblatingRequest(**parsed.request()).spec()
            steered = steer_page.steered_prediction(svc, spec, steering, TOP_K)
            view |= {
                "next_figure": steered["figure"],
                "next_caption": steered["caption"],
                "frozen_figure": steered["frozen_figure"],
                "steered": True,
            }
        except web.PAGE_ERRORS as exc:
            view, error = None, web.error_message(exc)
    url = steer_page.with_steer(web.explorer_query(parsed), steering)
    context = {
        "controls": c,
        "view": view,
        "values_url": url,
        "cell": explorer_cell.page_context(parsed, v),
        "cell_base": language.localized(web.explorer_query(parsed, cell=False)),
        "cell_url": url,
        "error": error,
        "models": list(models.values()),
        "accepted": set(model.toggles),
        "text_hint": (
            _("the model reads it one character at a time")
            if model.kind == "toy"
            else _("split into tokens by the model's own tokeniser")
        ),
        "model_description": model.described(),
        "limits": web.page_limits(svc.settings),
        "classroom": c.classroom,
        "token_limit": svc.limits.explorer_token_limit(model),
        "knob_fieldsets": web.knob_fieldsets(svc.settings),
        "nav": "explorer",
        "form_id": "explorer",
        "inspect_links": web.inspect_links(parsed),
        "steer_params": steering.params(),
        # the toggles the URL sets, which the next-token bars' links to /attribution carry
        "given_toggles": {k: int(v) if isinstance(v, bool) else v for k, v in parsed.given.items()},
    }
    # gzip (app/http/compression.py, level 1): a painted matrix's levels are bytes of base64 that
    # mostly repeat (a long text's 1,024-token answer: 4 MB as written, under 1 MB as sent)
    return web.render(
        request, "explorer.html", context, block="explorer" if model_changed else "results", url=url, error=error
    )


def _rows(text: str | None, n: int) -> tuple[int, int] | None:
    """ "from-to" (to excluded) within [0, n], or None."""
    start, dash, stop = (text or "").partition("-")
    if not (dash and start.isdigit() and stop.isdigit()) or not 0 <= int(start) < int(stop) <= n:
        return None
    return int(start), int(stop)


def explorer_values(request: Request, svc: ServiceDep) -> Response:
    """What a reader reads of a painted figure, from the explorer's URL with
    - `values=<its export's read key>&rows=<from>-<to>`: those rows' exact values, float64, little-endian,
      row-major, [rows, key_pos], a masked score NaN (the figure's own values: the API's, every bit);
    - `levels=head-<h>`: the colour levels of another head of the layer, as its weights figure would
      carry them (export "levels").
    From the cache, else by running the view again."""
    query = request.query_params
    parsed = web.parse_explorer(query, svc.views.models(), preferred=svc.settings.default_model)
    kept = read_cache(request).get(web.explorer_query(parsed, cell=False))
    if kept is None:
        v, error = _run(request, svc, parsed)
        if v is None:  # why not: error
            return PlainTextResponse(error or "", status_code=422)
        kept = readable(v, parsed.controls.all_stages) | head_levels(v)
    if "levels" in query:
        key = query["levels"]
        levels = kept.get(key) if key.startswith("head-") else None
        if levels is None:
            return PlainTextResponse(
                f"levels={key!r}: no other head's levels in this view (a head of its layer "
                "other than the one shown, when the text is long)",
                status_code=422,
            )
        return _binary(request, levels.tobytes())
    key = query["values"]
    matrix = kept.get(key) if not key.startswith("head-") else None
    if matrix is None:
        return PlainTextResponse(
            f"values={key!r}: this view paints no such matrix; it paints "
            f"{', '.join(k for k in kept if not k.startswith('head-')) or 'none'}",
            status_code=422,
        )
    rows = _rows(query.get("rows"), matrix.shape[0])
    if rows is None:
        return PlainTextResponse(
            f"rows={query.get('rows')!r} is not from-to within 0-{matrix.shape[0]}, e.g. rows=0-8", status_code=422
        )
    part = np.array(matrix[rows[0] : rows[1]], dtype="<f8")
    part[~np.isfinite(part)] = np.nan  # a masked score: no value
    return _binary(request, part.tobytes(), {"X-Shape": f"{rows[1] - rows[0]},{matrix.shape[1]}"})


GZIP_MIN_BYTES = 256 * 1024  # a hover's rows go as they are; a head's levels or a download's rows shrink


def _binary(request: Request, body: bytes, headers: dict[str, str] | None = None) -> Response:
    """Bytes for explorer-values.js, gzip-compressed (level 1, as app/http/compression.py compresses pages,
    which leaves octet-streams alone) when big and the client takes it: a head's levels are mostly 0."""
    headers = {"Cache-Control": "no-store"} | (headers or {})
    if len(body) >= GZIP_MIN_BYTES and "gzip" in request.headers.get("accept-encoding", ""):
        body = gzip.compress(body, 1)
        headers |= {"Content-Encoding": "gzip", "Vary": "Accept-Encoding"}
    return Response(body, media_type="application/octet-stream", headers=headers)
