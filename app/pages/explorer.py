"""The explorer page at `/`.

The route reads the page's state from the URL (app/pages/web.py), validates it with the API's own
request model (app/api/requests.py: same names and limits), asks the service for the explorer's view
(one preparation of the model, app/service/) and formats the result as Plotly figure dicts
(app/pages/figures.py) in templates/explorer.html.

A plain GET answers the full page; an htmx request only the block that changed: "results" on
every change, "explorer" (controls too) when the model changes. Bad settings render their
message in place of the figures, with status 422. ARCHITECTURE.md follows one edit of the text box
through here to the redrawn heatmap.
"""

from __future__ import annotations

import math

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from app.pages import figures, web
from app.api import requests
from app.deps import ServiceDep
from app.http.language import _, ngettext
from app.service.results import AttentionStages, ExplorerView

router = APIRouter(tags=["pages"], include_in_schema=False)

TOP_K = 10  # next-token bars shown
# From this many tokens the page sends the softmax weights and, only when asked (stages=1), the
# three scores stages: each is a T × T matrix (1,024 tokens: 5.6 MB of base64 float32), and three
# of them would be most of the page's bytes and of its first load.
STAGES_ON_REQUEST_TOKENS = 256


def _config_line(v: ExplorerView) -> str:
    cfg = v.config
    divisor = (f"√{cfg.d_head}" if cfg.use_attn_scale else "1") + (
        f" × {cfg.attn_temperature:g}" if cfg.attn_temperature != 1 else "")
    kv = cfg.n_key_value_heads
    heads = (_("{n} heads").format(n=cfg.n_heads) if kv == cfg.n_heads else
             ngettext("{n} query heads share {kv} K/V head", "{n} query heads share {kv} K/V heads", kv).format(
                 n=cfg.n_heads, kv=kv))
    return " · ".join([
        _("{model}: {n} tokens").format(model=v.model, n=len(v.tokens)), f"d_model {cfg.d_model}",
        f"{heads} × d_head {cfg.d_head}",
        ngettext("{n} layer", "{n} layers", cfg.n_layers).format(n=cfg.n_layers), f"d_mlp {cfg.d_mlp}",
        _("{scheme} positions").format(scheme=cfg.positional_embedding_type),
        _("causal") if cfg.causal else _("bidirectional"), _("scores ÷ {divisor}").format(divisor=divisor),
        _("seed {seed}").format(seed=v.seed)])


def _stage_figures(st: AttentionStages, v: ExplorerView, where: str, only_weights: bool = False) -> list[dict]:
    cfg = v.config
    top = figures.score_range(st.raw, st.scaled, st.masked)  # one colour range, so scaling shows
    divisor = ("√d_head = √" + f"{cfg.d_head} = {math.sqrt(cfg.d_head):.3g}") if cfg.use_attn_scale \
        else _("1 (scaling is off)")
    if cfg.attn_temperature != 1:
        divisor += _(", then ÷ the temperature {t:g}").format(t=cfg.attn_temperature)
    mask_caption = (_("The causal mask sets every key after the query to −∞ (hatched): a token cannot see the "
                      "future.") if cfg.causal else
                    _("No mask: every token may look at every token. Turn on the causal mask to hide the future."))
    specs = [
        ("raw", _("1 · Raw scores  Q Kᵀ"), st.raw, "scores", None,
         _("How well each query matches each key: a dot product. Orange is positive, purple negative.")),
        ("scaled", _("2 · Scaled"), st.scaled, "scores", None,
         _("Every score divided by {divisor}, so the softmax does not saturate as d_head grows. Same colour range "
           "as stage 1.").format(divisor=divisor)),
        ("masked", _("3 · Masked"), st.masked, "scores", st.mask, mask_caption),
        ("weights", _("4 · Softmax weights"), st.weights, "weights", st.mask,
         _("Each row exponentiated and normalised: weights are ≥ 0 and each row sums to 1.")),
    ]
    if only_weights:
        specs = specs[-1:]
    return [{"key": key, "title": title, "caption": caption,
             "figure": figures.attention_heatmap(matrix, v.tokens, kind=kind, mask=mask,
                                                 zmax=top if kind == "scores" else None,
                                                 export_name=f"{where}-{key}")}
            for key, title, matrix, kind, mask, caption in specs]


def _compare_figures(v: ExplorerView, where: str) -> list[dict]:
    """The chosen head with and without the causal mask, the masked one first."""
    pair = sorted([(v.config.causal, v.stages), (not v.config.causal, v.other_stages)], key=lambda p: not p[0])
    return [{"key": "causal" if is_causal else "bidirectional",
             "title": _("With the causal mask") if is_causal else _("Without the mask (bidirectional)"),
             "caption": (_("Each token mixes only itself and earlier tokens; rows are renormalised.")
                         if is_causal else _("Each token mixes every token, later ones included.")),
             "figure": figures.attention_heatmap(st.weights, v.tokens, kind="weights",
                                                 mask=st.mask if is_causal else None,
                                                 export_name=f"{where}-weights-"
                                                             f"{'causal' if is_causal else 'bidirectional'}")}
            for is_causal, st in pair]


def _short(stage: str) -> str:
    """"1 resid_mid" -> "1 mid": the stream's columns stay legible for deep models."""
    return stage.replace("resid_", "")


def view_context(v: ExplorerView, ablated: set[tuple[int, int]], all_stages: bool = False) -> dict:
    """The explorer's figures and texts from the service's view. A long text's scores stages only
    with all_stages (STAGES_ON_REQUEST_TOKENS)."""
    layer, head = v.layer, v.head
    where = f"layer{layer}-head{head}"
    head_figures = [figures.attention_heatmap(v.patterns[h], v.tokens, kind="weights", mask=v.stages.mask,
                                              small=True, export_name=f"layer{layer}-head{h}-weights")
                    for h in range(v.config.n_heads)]
    next_figure = None
    if v.ablation_effect is not None and v.ablation_effect.changes:
        changes = v.ablation_effect.changes
        next_figure = figures.probability_change_bars([t.token for t in changes], [t.baseline_prob for t in changes],
                                                      [t.prob for t in changes])
    elif v.top_k:
        next_figure = figures.probability_bars([t.token for t in v.top_k], [t.prob for t in v.top_k])
    rollout = None
    if v.rollout is not None:
        rollout = figures.attention_heatmap(v.rollout, v.tokens, kind="weights", value_name=_("rollout"),
                                            export_name=f"rollout-through-layer{layer}")
    norms = v.residual
    on_request = len(v.tokens) >= STAGES_ON_REQUEST_TOKENS
    stages = _stage_figures(v.stages, v, where, only_weights=on_request and not all_stages)
    return {
        "ablated": ablated, "ablation": v.ablation_effect, "rollout_figure": rollout,
        "model_name": v.model, "tokens": v.tokens, "token_labels": [figures.visible(t) for t in v.tokens],
        "config_line": _config_line(v), "layer": layer, "head": head, "n_layers": v.config.n_layers,
        "head_figures": head_figures, "stages": stages, "stages_on_request": on_request,
        # under grouped-query attention, the K/V head each query head reads (its card says so)
        "kv_heads": v.kv_heads if v.config.n_key_value_heads != v.config.n_heads else None,
        "compare": _compare_figures(v, where) if v.other_stages is not None else None,
        "residual_figure": figures.stage_heatmap(norms.stream, v.tokens, [_short(n) for n in norms.stream_names],
                                                 value_name="‖x‖", export_name="residual-stream-norms"),
        "writes_figure": figures.stage_heatmap(norms.writes, v.tokens, norms.writes_names,
                                               value_name=_("‖added‖"), export_name="sublayer-output-norms"),
        "next_figure": next_figure,
        "shapes": [{"name": r.name, "axes": r.axes, "shape": web.shape(r.dims), "layer_start": r.layer_start}
                   for r in v.shapes],
    }


@router.get("/", response_class=HTMLResponse, summary="The explorer")
def explorer(request: Request, svc: ServiceDep) -> HTMLResponse:
    model_changed = web.is_fragment(request) and request.headers.get("hx-trigger-name") == "model"
    models = svc.views.models()
    parsed = web.parse_explorer(request.query_params, models, preferred=svc.settings.default_model,
                               model_changed=model_changed)
    c = parsed.controls
    model = models[c.model]
    error = "; ".join(parsed.errors) or None
    view = None
    if error is None:
        # heads that no longer exist (fewer layers or heads now) are dropped, as layer and head are clamped
        n_layers = parsed.given.get("n_layers", model.cfg.n_layers)
        n_heads = parsed.given.get("n_heads", model.cfg.n_heads)
        c.ablate = tuple((layer, head) for layer, head in c.ablate if layer < n_layers and head < n_heads)
        try:
            spec = requests.AblatingRequest(**parsed.request()).spec()
            v = svc.views.explorer(spec, c.layer, c.head, compare=c.compare, rollout=c.rollout,
                             top_k=0 if model.is_encoder else TOP_K)
            c.layer, c.head = v.layer, v.head  # what is shown is what the URL will say
            view = view_context(v, set(c.ablate), c.all_stages)
        except web.PAGE_ERRORS as exc:
            error = web.error_message(exc)
    context = {
        "controls": c, "view": view, "error": error, "models": list(models.values()),
        "accepted": set(model.toggles),
        "text_hint": (_("the model reads it one character at a time") if model.kind == "toy"
                      else _("split into tokens by the model's own tokeniser")),
        "model_description": _(model.description) if model.description else model.description,
        "limits": web.page_limits(svc.settings), "classroom": c.classroom,
        "token_limit": svc.limits.explorer_token_limit(model), "knob_fieldsets": web.knob_fieldsets(svc.settings),
        "nav": "explorer", "form_id": "explorer", "inspect_links": web.inspect_links(parsed),
    }
    return web.render(request, "explorer.html", context, block="explorer" if model_changed else "results",
                      url=web.explorer_query(parsed), error=error,
                      compress=False)  # packed figure data: gzip would cost more time than it saves
