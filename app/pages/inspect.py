"""The "Inspect" pages: /inspect?view=decompose|lens|detectors|kvcache|compare plus the explorer's own state.

Each view is one /api/v1/analysis/* computation drawn as figures. The page reads the explorer's
state from its query string (app/pages/web.py, the explorer's own parser: same model, text, toggles and
ablated heads), adds the view's own parameters, validates them with the API's request model
(app/api/requests.py, same limits) and calls the service, exactly as the JSON API does. Errors and
views that do not apply to this model are said in place of the figures (app/pages/web.py `render`).
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from app.api import requests
from app.deps import ServiceDep
from app.http.language import N_, _
from app.pages import figures, inspect_figures, web
from app.service import RunSpec, Service, knobs
from app.service.results import ComparedSide

router = APIRouter(tags=["pages"], include_in_schema=False)

VIEWS = web.INSPECT_VIEWS
DEFAULT_VIEW = "decompose"
LENS_TOP_K = 5  # tokens listed in each logit-lens cell's hover
TOP_TARGETS = 10  # target tokens offered by the decomposition view
# Each view's own parameters and their defaults (the API's defaults, from its request models).
# The knobs side B of Compare may change: those that keep the model's shape (the API's CompareSide).
SIDE_B_KNOBS = [k for k in knobs.KNOBS if not k.reshapes]
VIEW_DEFAULTS = {
    "pos": requests.DecomposeRequest.model_fields["pos"].default,
    "target": None,
    "random_length": requests.DetectorsRequest.model_fields["random_length"].default,
    "threshold": requests.DetectorsRequest.model_fields["threshold"].default,
    "n_new": requests.KVStepsRequest.model_fields["n_new"].default,
}


# ------------------------------------------------------------------ the URL


def _number(query: web.QueryString, name: str, kind: type, errors: list[str]):
    raw = web.last(query, name)
    if raw is None:
        return VIEW_DEFAULTS.get(name)
    return web.parse_number(name, raw, kind, errors)


def view_params(query: web.QueryString, errors: list[str]) -> dict:
    """This view's own parameters (not the explorer's), as typed values; None where not given."""
    out = {
        "pos": _number(query, "pos", int, errors),
        "target": _number(query, "target", int, errors),
        "random_length": _number(query, "random_length", int, errors),
        "threshold": _number(query, "threshold", float, errors),
        "n_new": _number(query, "n_new", int, errors),
    }
    out["b_text"] = query.getlist("b_text")[-1] if query.getlist("b_text") and query.getlist("b_text")[-1] else None
    for knob in SIDE_B_KNOBS:  # b_causal, b_seed, ...: what side B changes
        raw = web.last(query, "b_" + knob.name)
        out["b_" + knob.name] = None if raw is None else web.parse_knob(knob, raw, errors, "b_" + knob.name)
    raw_ablate = web.last(query, "b_ablate")
    out["b_ablate"] = None if raw_ablate is None else web.parse_ablate(raw_ablate.replace(",", " ").split(), errors)
    return out


def canonical(view: str, parsed: web.Parsed, params: dict) -> str:
    """The shortest URL restoring this Inspect view: the explorer's state plus what differs from defaults."""
    own = [(k, v) for k, v in params.items() if v is not None and v != VIEW_DEFAULTS.get(k, None)]
    own = [
        (
            k,
            int(v)
            if isinstance(v, bool)
            else (" ".join(f"{layer}.{head}" for layer, head in v) if k == "b_ablate" else v),
        )
        for k, v in own
    ]
    return "/inspect?" + urlencode([("view", view)] + web.explorer_state(parsed) + own)


# ------------------------------------------------------------------ each view: the service's result, formatted


def _token_labels(tokens) -> list[str]:
    return [figures.visible(t) for t in tokens]


def decompose_view(svc: Service, parsed: web.Parsed, params: dict) -> dict:
    req = requests.DecomposeRequest(**parsed.request(pos=params["pos"], target=params["target"]))
    r = svc.inspect.decompose(req.spec(), req.pos, req.target, TOP_TARGETS)
    d = r.d
    return {
        "tokens": _token_labels(r.tokens),
        "pos": d.pos,
        "target": figures.visible(r.target.token),
        "target_id": d.token,
        "logit": d.logit,
        "logit_bias": d.logit_bias,
        "scale": d.scale,
        "sum": float(d.direct_logit.sum() + d.logit_bias),
        "targets": [{"id": t.id, "label": figures.visible(t.token), "prob": t.prob} for t in r.targets],
        "figure": inspect_figures.logit_waterfall(d.labels, d.direct_logit, d.logit_bias, d.logit),
        "largest": [{"label": label, "value": value} for label, value in r.largest],
    }


def lens_view(svc: Service, parsed: web.Parsed, params: dict) -> dict:
    req = requests.LogitLensRequest(**parsed.request(top_k=LENS_TOP_K))
    r = svc.inspect.logit_lens(req.spec(), req.top_k)
    strs, lens = r.token_strs, r.lens
    cell_tokens = [[strs[int(t)] for t in row[:, 0]] for row in lens.top_tokens]  # the top token of each cell
    hover = [
        [
            "<br>".join(f"{figures.token_label(strs[int(t)])} {p:.3f}" for t, p in zip(ids, probs))
            for ids, probs in zip(point_ids, point_probs)
        ]
        for point_ids, point_probs in zip(lens.top_tokens, lens.top_probs)
    ]
    points = [name.replace("blocks.", "L").replace(".hook_", " ") for name in lens.points]
    return {
        "figure": inspect_figures.lens_heatmap(lens.top_probs[..., 0], cell_tokens, hover, points, r.tokens),
        "final": [
            {"label": figures.visible(strs[int(t)]), "prob": float(p)}
            for t, p in zip(lens.top_tokens[-1, -1], lens.top_probs[-1, -1])
        ],
    }


DETECTOR_TITLES = {
    "previous_token": N_("Previous-token heads"),
    "duplicate_token": N_("Duplicate-token heads"),
    "induction": N_("Induction heads"),
}
DETECTOR_CAPTIONS = {
    "previous_token": N_("Attention on the token just before."),
    "duplicate_token": N_("Attention on earlier copies of the same token."),
    "induction": N_("Attention on the token that followed an earlier copy of the current one."),
}


def detectors_view(svc: Service, parsed: web.Parsed, params: dict) -> dict:
    random_length = params["random_length"]
    cfg = svc.views.models()[parsed.controls.model].cfg
    if random_length == VIEW_DEFAULTS["random_length"] and cfg.positional_embedding_type == "learned":
        random_length = max(2, min(random_length, cfg.n_ctx // 2))  # the default, fitted to a short context
    req = requests.DetectorsRequest(**parsed.request(random_length=random_length, threshold=params["threshold"]))
    r = svc.inspect.detectors(req.spec(), req.random_length, req.random_seed, req.threshold)
    grids = []
    for name, by in r.detectors.items():
        for on, title in (
            ("text", _("{detector}, on your text")),
            ("random", _("{detector}, on a repeated random sequence")),
        ):
            grids.append(
                {
                    "key": f"{name}-{on}",
                    "title": title.format(detector=_(DETECTOR_TITLES[name])),
                    "caption": _(DETECTOR_CAPTIONS[name]),
                    "figure": inspect_figures.head_heatmap(
                        by[on], value_name=_("score"), export_name=f"detector-{name}-{on}"
                    ),
                }
            )
    return {
        "grids": grids,
        "flagged": r.flagged,
        "threshold": r.threshold,
        "random_tokens": _token_labels(r.random_tokens),
    }


def kvcache_view(svc: Service, parsed: web.Parsed, params: dict) -> dict:
    fields = parsed.request(n_new=params["n_new"])
    del fields["ablate"]  # stepping runs the model as it is
    req = requests.KVStepsRequest(**fields)
    r = svc.inspect.kv_steps(req.spec(), req.n_new)
    rows = [
        {
            "pos": st.pos,
            "token": figures.visible(st.token),
            "generated": st.generated,
            "shape": web.shape(st.k_shape),
            "bytes": st.cache_bytes,
            "diff": st.max_abs_diff,
            "top": figures.visible(st.top.token),
        }
        for st in r.steps
    ]
    return {
        "rows": rows,
        "max_diff": r.max_abs_diff,
        "dtype": r.dtype,
        "generated": r.generated_text,
        "n_layers": r.config.n_layers,
        "figure": inspect_figures.cache_growth(
            [st.pos for st in r.steps], [st.cache_bytes for st in r.steps], [st.generated for st in r.steps]
        ),
    }


def compare_view(svc: Service, parsed: web.Parsed, params: dict) -> dict:
    c = parsed.controls
    other = {
        "text": params["b_text"],
        **{k.name: params["b_" + k.name] for k in SIDE_B_KNOBS},
        "ablate": None
        if params["b_ablate"] is None
        else [{"layer": layer, "head": head, "method": c.ablate_method} for layer, head in params["b_ablate"]],
    }
    if all(v is None for v in other.values()):  # nothing chosen yet: compare the mask on and off, or for a
        # model that has no mask toggle (an encoder; local attention layers) the scores scaled and not
        if "causal" in svc.views.models()[c.model].toggles:
            other["causal"] = not c.causal
        else:
            other["scale"] = not c.scale
    req = requests.CompareRequest(
        **parsed.request(layer=c.layer, head=c.head, other={k: v for k, v in other.items() if v is not None})
    )
    r = svc.inspect.compare(req.spec(), req.other.changes(), req.layer, req.head)
    sides = [
        {
            "key": key,
            "title": f"{key.upper()}: {_describe(side)}",
            "figure": figures.attention_heatmap(
                side.pattern, side.tokens, kind="weights", mask=side.mask, export_name=f"compare-{key}"
            ),
        }
        for key, side in (("a", r.a), ("b", r.b))
    ]
    difference = None
    if r.difference is not None:
        difference = figures.attention_heatmap(
            r.difference, r.a.tokens, kind="scores", value_name="B − A", export_name="compare-difference"
        )
    return {
        "sides": sides,
        "difference": difference,
        "note": r.note,
        "layer": r.layer,
        "head": r.head,
        "max_change": r.max_change,
        "n_layers": r.a.config.n_layers,
        "n_heads": r.a.config.n_heads,
    }


def _describe(side: ComparedSide) -> str:
    cfg, tokens = side.config, side.tokens
    parts = [
        repr("".join(tokens)) if len(tokens) <= 40 else _("{n} tokens").format(n=len(tokens)),
        _("causal") if cfg.causal else _("bidirectional"),
        _("{scheme} positions").format(scheme=cfg.positional_embedding_type),
        _("scaled") if cfg.use_attn_scale else _("unscaled"),
        _("seed {seed}").format(seed=side.seed),
    ]
    if side.ablate:
        parts.append(_("ablated {heads}").format(heads=", ".join(f"L{a.layer}H{a.head}" for a in side.ablate)))
    return " · ".join(parts)


BUILDERS: dict[str, Callable[[Service, web.Parsed, dict], dict]] = {
    "decompose": decompose_view,
    "lens": lens_view,
    "detectors": detectors_view,
    "kvcache": kvcache_view,
    "compare": compare_view,
}


# ------------------------------------------------------------------ the route


@router.get(
    "/inspect", response_class=HTMLResponse, summary="Look inside: decomposition, lens, detectors, KV cache, compare"
)
def inspect(request: Request, svc: ServiceDep) -> Response:
    query = request.query_params
    view = web.last(query, "view") or DEFAULT_VIEW
    errors: list[str] = []
    if view not in VIEWS:
        errors.append(_("view={view!r} is not one of {choices}").format(view=view, choices=", ".join(VIEWS)))
        view = DEFAULT_VIEW
    models = svc.views.models()
    parsed = web.parse_explorer(query, models, preferred=svc.settings.default_model)
    c = parsed.controls
    params = view_params(query, errors)
    error = "; ".join(parsed.errors + errors) or None
    reason = None if error else svc.inspect.reason(view, RunSpec(c.model, c.text, causal=c.causal))
    result = None
    if error is None and reason is None:
        try:
            result = BUILDERS[view](svc, parsed, params)
        except web.PAGE_ERRORS as exc:
            error = web.error_message(exc)
    context = {
        "controls": c,
        "view": view,
        "views": {key: _(label) for key, label in VIEWS.items()},
        "result": result,
        "error": error,
        "reason": reason,
        "params": params,
        "model": models[c.model],
        "classroom": c.classroom,
        "nav": "explorer",
        "form_id": "inspect",
        "state": web.explorer_state(parsed),
        "links": web.inspect_links(parsed),
        "limits": web.page_limits(svc.settings),
        "explorer_url": web.explorer_query(parsed),
        "position_schemes": requests.POSITION_SCHEMES,
        "max_random_length": requests.upper_bound(requests.DetectorsRequest, "random_length"),
        "max_new_tokens": requests.upper_bound(requests.KVStepsRequest, "n_new"),
    }
    return web.render(request, "inspect.html", context, url=canonical(view, parsed, params), error=error)
