"""The "Inspect" pages: /inspect?view=decompose|lens|detectors|kvcache|compare plus the explorer's own state.

Each view is one /api/v1/analysis/* computation drawn as figures. The page reads the explorer's
query string with the explorer's parser (app/routers/pages.py: same model, text, toggles and
ablated heads), adds the view's own parameters, builds the API's request model (app/schemas.py,
same limits) and calls the service layer, exactly as the JSON API does. A plain GET answers the
full page, an htmx request only the "results" block; errors and views that do not apply to this
model are said in place of the figures.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from urllib.parse import parse_qsl, urlencode

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from pydantic import ValidationError

from .. import figures, registry, schemas, service
from . import pages

router = APIRouter(tags=["pages"], include_in_schema=False)

VIEWS = {  # key in the URL -> tab label, in the order of the tabs
    "decompose": "Residual decomposition",
    "lens": "Logit lens",
    "detectors": "Head detectors",
    "kvcache": "KV cache, stepped",
    "compare": "Compare",
}
DEFAULT_VIEW = "decompose"
LENS_TOP_K = 5  # tokens listed in each logit-lens cell's hover
TOP_TARGETS = 10  # target tokens offered by the decomposition view
# Each view's own parameters and their defaults (the API's defaults, from its request models).
VIEW_DEFAULTS = {
    "pos": schemas.DecomposeRequest.model_fields["pos"].default,
    "target": None,
    "random_length": schemas.DetectorsRequest.model_fields["random_length"].default,
    "threshold": schemas.DetectorsRequest.model_fields["threshold"].default,
    "n_new": schemas.KVStepsRequest.model_fields["n_new"].default,
}
SIDE_B = ("b_text", "b_causal", "b_scale", "b_positional_embedding_type", "b_seed", "b_ablate")


# ------------------------------------------------------------------ the URL

def explorer_state(parsed: pages.Parsed) -> list[tuple[str, str]]:
    """The explorer's canonical parameters (model, text, toggles, layer, head, ablations), minus its view."""
    query = pages.canonical_query(parsed).partition("?")[2]
    return [(k, v) for k, v in parse_qsl(query) if k != "view"]


def links(parsed: pages.Parsed) -> list[dict]:
    """One link per Inspect view, carrying the explorer's current state."""
    state = explorer_state(parsed)
    return [{"key": key, "label": label, "url": "/inspect?" + urlencode([("view", key)] + state)}
            for key, label in VIEWS.items()]


def _number(query: Mapping, name: str, kind: type, errors: list[str]):
    raw = pages._last(query, name)
    if raw is None:
        return VIEW_DEFAULTS.get(name)
    return pages._parse_number(name, raw, kind, errors)


def view_params(query: Mapping, errors: list[str]) -> dict:
    """This view's own parameters (not the explorer's), as typed values; None where not given."""
    out = {"pos": _number(query, "pos", int, errors), "target": _number(query, "target", int, errors),
           "random_length": _number(query, "random_length", int, errors),
           "threshold": _number(query, "threshold", float, errors), "n_new": _number(query, "n_new", int, errors)}
    out["b_text"] = query.getlist("b_text")[-1] if query.getlist("b_text") and query.getlist("b_text")[-1] else None
    for name in ("b_causal", "b_scale"):
        raw = pages._last(query, name)
        out[name] = None if raw is None else pages._parse_bool(name, raw, errors)
    out["b_positional_embedding_type"] = pages._last(query, "b_positional_embedding_type")
    out["b_seed"] = _number(query, "b_seed", int, errors)
    raw_ablate = pages._last(query, "b_ablate")
    out["b_ablate"] = (None if raw_ablate is None
                       else pages._parse_ablate(raw_ablate.replace(",", " ").split(), errors))
    return out


def canonical(view: str, parsed: pages.Parsed, params: dict) -> str:
    """The shortest URL restoring this Inspect view: the explorer's state plus what differs from defaults."""
    own = [(k, v) for k, v in params.items() if v is not None and v != VIEW_DEFAULTS.get(k, None)]
    own = [(k, int(v) if isinstance(v, bool) else (" ".join(f"{l}.{h}" for l, h in v) if k == "b_ablate" else v))
           for k, v in own]
    return "/inspect?" + urlencode([("view", view)] + explorer_state(parsed) + own)


# ------------------------------------------------------------------ computing each view (service layer)

def _fields(c: pages.Controls, given: dict) -> dict:
    return {"model": c.model, "text": c.text, **given}


def _ablating(c: pages.Controls, given: dict) -> dict:
    return _fields(c, given) | {"ablate": c.ablate_request()}


def _token_labels(tokens) -> list[str]:
    return [figures.visible(t) for t in tokens]


def decompose_view(c: pages.Controls, given: dict, params: dict) -> dict:
    request = dict(_ablating(c, given), pos=params["pos"], target=params["target"])
    r = service.decompose(schemas.DecomposeRequest(**request))
    d = r.d
    targets = service.top_tokens(r.setup.model, r.probs_at_pos, TOP_TARGETS)
    return {
        "tokens": _token_labels(r.setup.encoding.tokens), "pos": d.pos, "target": figures.visible(r.target_str),
        "target_id": d.token, "logit": d.logit, "logit_bias": d.logit_bias, "scale": d.scale,
        "sum": float(d.direct_logit.sum() + d.logit_bias),
        "targets": [{"id": t.id, "label": figures.visible(t.token), "prob": t.prob} for t in targets],
        "figure": figures.logit_waterfall(d.labels, d.direct_logit, d.logit_bias, d.logit),
        "largest": [{"label": d.labels[i], "value": float(d.direct_logit[i])}
                    for i in np.argsort(-np.abs(d.direct_logit), kind="stable")[:5]],
    }


def lens_view(c: pages.Controls, given: dict, params: dict) -> dict:
    r = service.logit_lens(schemas.LogitLensRequest(**_ablating(c, given), top_k=LENS_TOP_K))
    strs = r.token_strs
    cell_tokens = [[strs[int(t)] for t in row[:, 0]] for row in r.top_ids]  # the top token of each cell
    hover = [["<br>".join(f"{figures.token_label(strs[int(t)])} {p:.3f}" for t, p in zip(ids, probs))
              for ids, probs in zip(point_ids, point_probs)]
             for point_ids, point_probs in zip(r.top_ids, r.top_probs)]
    points = [name.replace("blocks.", "L").replace(".hook_", " ") for name in r.points]
    return {"figure": figures.lens_heatmap(r.top_probs[..., 0], cell_tokens, hover, points, r.setup.encoding.tokens),
            "final": [{"label": figures.visible(strs[int(t)]), "prob": float(p)}
                      for t, p in zip(r.top_ids[-1, -1], r.top_probs[-1, -1])]}


DETECTOR_TITLES = {"previous_token": "Previous-token heads", "duplicate_token": "Duplicate-token heads",
                   "induction": "Induction heads"}
DETECTOR_CAPTIONS = {
    "previous_token": "Attention on the token just before.",
    "duplicate_token": "Attention on earlier copies of the same token.",
    "induction": "Attention on the token that followed an earlier copy of the current one.",
}


def detectors_view(c: pages.Controls, given: dict, params: dict) -> dict:
    request = dict(_ablating(c, given), random_length=params["random_length"], threshold=params["threshold"])
    r = service.detectors(schemas.DetectorsRequest(**request))
    grids = []
    for name, by in r.scores.items():
        for on, label in (("text", "your text"), ("random", "a repeated random sequence")):
            grids.append({"key": f"{name}-{on}", "title": f"{DETECTOR_TITLES[name]}, on {label}",
                          "caption": DETECTOR_CAPTIONS[name],
                          "figure": figures.head_heatmap(by[on], value_name="score",
                                                         export_name=f"detector-{name}-{on}")})
    return {"grids": grids, "flagged": r.flagged, "threshold": r.threshold,
            "random_tokens": _token_labels(r.random_tokens)}


def kvcache_view(c: pages.Controls, given: dict, params: dict) -> dict:
    r = service.kv_steps(schemas.KVStepsRequest(**_fields(c, given), n_new=params["n_new"]))
    steps = r.run.steps
    rows = [{"pos": st.pos, "token": figures.visible(r.token_strs[st.pos]), "generated": st.generated,
             "shape": f"({', '.join(map(str, st.k_shape))})", "bytes": st.cache_bytes, "diff": float(diff),
             "top": figures.visible(r.setup.model.tokenizer.token_str(top))}
            for st, diff, top in zip(steps, r.max_abs_diff, r.top_ids)]
    n_text = len(r.setup.encoding.ids)
    return {"rows": rows, "max_diff": float(r.max_abs_diff.max()), "dtype": str(r.run.kv.keys[0].dtype),
            "generated": "".join(r.token_strs[n_text:]), "n_layers": r.setup.cfg.n_layers,
            "figure": figures.cache_growth([st.pos for st in steps], [st.cache_bytes for st in steps],
                                           [st.generated for st in steps])}


def compare_view(c: pages.Controls, given: dict, params: dict) -> dict:
    other = {"text": params["b_text"], "causal": params["b_causal"], "scale": params["b_scale"],
             "positional_embedding_type": params["b_positional_embedding_type"], "seed": params["b_seed"],
             "ablate": None if params["b_ablate"] is None else
             [{"layer": l, "head": h, "method": c.ablate_method} for l, h in params["b_ablate"]]}
    if all(v is None for v in other.values()):
        other["causal"] = not c.causal  # nothing chosen yet: compare the mask on and off
    request = schemas.CompareRequest(**_ablating(c, given), layer=c.layer, head=c.head,
                                     other={k: v for k, v in other.items() if v is not None})
    r = service.compare(request)
    sides = []
    for key, side in (("a", r.a), ("b", r.b)):
        cfg = side.setup.cfg
        pattern = side.pattern
        mask = np.triu(np.ones(pattern.shape, bool), 1) if cfg.causal else None
        sides.append({"key": key, "title": f"{key.upper()}: {_describe(side.setup)}",
                      "figure": figures.attention_heatmap(pattern, side.setup.encoding.tokens, kind="weights",
                                                          mask=mask, export_name=f"compare-{key}")})
    difference = None
    if r.difference is not None:
        difference = figures.attention_heatmap(r.difference, r.a.setup.encoding.tokens, kind="scores",
                                               value_name="B − A", export_name="compare-difference")
    return {"sides": sides, "difference": difference, "note": r.note, "layer": r.layer, "head": r.head,
            "max_change": None if r.difference is None else float(np.abs(r.difference).max())}


def _describe(p: service.Prepared) -> str:
    cfg = p.cfg
    parts = [repr("".join(p.encoding.tokens)) if len(p.encoding.tokens) <= 40 else f"{len(p.encoding.tokens)} tokens",
             "causal" if cfg.causal else "bidirectional", f"{cfg.positional_embedding_type} positions",
             "scaled" if cfg.use_attn_scale else "unscaled", f"seed {p.seed}"]
    if p.ablate:
        parts.append("ablated " + ", ".join(f"L{l}H{h}" for l, h in p.ablate))
    return " · ".join(parts)


BUILDERS: dict[str, Callable[[pages.Controls, dict, dict], dict]] = {
    "decompose": decompose_view, "lens": lens_view, "detectors": detectors_view, "kvcache": kvcache_view,
    "compare": compare_view,
}


def not_applicable(view: str, c: pages.Controls) -> str | None:
    """Why this view does not apply to this model and setting (the service's own reasons), or None."""
    model = registry.get(c.model)
    cfg = model.cfg.replace(attention_dir="causal" if c.causal else "bidirectional")
    if view == "decompose":
        return service.next_token_reason(model, cfg, "the residual-stream decomposition")
    if view == "lens":
        return service.next_token_reason(model, cfg, "the logit lens")
    if view == "kvcache":
        return service.kv_cache_reason(model, cfg)
    return None


# ------------------------------------------------------------------ the route

def _upper(model: type, field: str) -> int | float | None:
    """A request field's upper bound (`le`), as the schema states it."""
    return next((m.le for m in model.model_fields[field].metadata if hasattr(m, "le")), None)


@router.get("/inspect", response_class=HTMLResponse, summary="Look inside: decomposition, lens, detectors, KV cache, compare")
def inspect(request: Request) -> HTMLResponse:
    headers = request.headers
    history_restore = headers.get("hx-history-restore-request") == "true"
    fragment = headers.get("hx-request") == "true" and not history_restore
    query = request.query_params
    view = pages._last(query, "view") or DEFAULT_VIEW
    errors: list[str] = []
    if view not in VIEWS:
        errors.append(f"view={view!r} is not one of {', '.join(VIEWS)}")
        view = DEFAULT_VIEW
    parsed = pages.parse(query)
    c = parsed.controls
    params = view_params(query, errors)
    errors = parsed.errors + errors
    error = "; ".join(errors) or None
    reason = None if error else not_applicable(view, c)
    result = None
    if error is None and reason is None:
        try:
            result = BUILDERS[view](c, parsed.given, params)
        except ValidationError as exc:
            error = "; ".join(pages._validation_messages(exc))
        except (ValueError, TypeError) as exc:
            error = str(exc)
    model = registry.get(c.model)
    context = {
        "controls": c, "view": view, "views": VIEWS, "result": result, "error": error, "reason": reason,
        "params": params, "model": model, "classroom": c.classroom, "nav": "explorer", "form_id": "inspect",
        "state": explorer_state(parsed), "links": links(parsed), "limits": pages._limits(),
        "explorer_url": pages.canonical_query(parsed), "position_schemes": pages.POSITION_SCHEMES,
        "max_random_length": _upper(schemas.DetectorsRequest, "random_length"),
        "max_new_tokens": _upper(schemas.KVStepsRequest, "n_new"),
    }
    status = 422 if error and not history_restore else 200
    response_headers = {"Vary": "HX-Request"}
    if fragment:
        response_headers["HX-Push-Url"] = canonical(view, parsed, params)
        return pages.templates.TemplateResponse(request, "inspect.html", context, block_name="results",
                                                status_code=status, headers=response_headers)
    return pages.templates.TemplateResponse(request, "inspect.html", context, status_code=status,
                                            headers=response_headers)
