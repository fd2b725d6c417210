"""The features page, /features: choose a model's SAE (EXPLORER_SAES_DIR), type a text, and see which of the SAE's
features each token lights up (a token × feature heatmap of the text's most active features); click a token for
its top features, a feature for its dashboard (top examples shaded by activation, histogram, density, logit
effect, label); search the labelled features by label. Every number is the API's (app/service/features.py): the
page asks the same service methods POST /api/v1/analysis/features and GET /api/v1/saes/{name}/features/{i} do.
The whole state is in the URL (model, sae, text, token, feature, q); htmx swaps the results and pushes the URL.
Bad settings are said in place of the results, with status 422.
"""

from __future__ import annotations

from urllib.parse import urlencode

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from app.api import requests
from app.deps import ServiceDep
from app.http.language import _
from app.pages import figures, web

router = APIRouter(tags=["pages"], include_in_schema=False)

HEATMAP_FEATURES = 12  # rows of the heatmap: the text's most active features
TOKEN_FEATURES = 10  # a clicked token's top features
LABEL_MATCHES = 20  # labelled features a search lists


def _level(value: float, top: float) -> float:
    """A cell's shade, 0 … 1 of the largest value shown."""
    return round(float(value) / top, 3) if top > 0 else 0.0


def heatmap(view, rows: int = HEATMAP_FEATURES) -> dict:
    """The text's most active features (by their largest activation over its tokens) by its tokens."""
    acts = view.activations  # [pos, d_sae]
    assert acts is not None  # the page asks for them (dense=True)
    peak = acts.max(axis=0)
    order = [int(i) for i in np.argsort(-peak, kind="stable")[:rows] if peak[i] > 0]
    top = float(peak[order[0]]) if order else 0.0
    return {
        "features": order,
        "labels": [view.labels.get(i) for i in order],
        "cells": [[float(acts[t, i]) for t in range(acts.shape[0])] for i in order],
        "levels": [[_level(acts[t, i], top) for t in range(acts.shape[0])] for i in order],
        "max": top,
    }


def _example(ex, top: float) -> list[dict]:
    return [
        {"token": figures.visible(t), "value": v, "level": _level(v, top), "max": i == ex.max_position}
        for i, (t, v) in enumerate(zip(ex.tokens, ex.activations))
    ]


@router.get("/features", response_class=HTMLResponse, summary="What an SAE's features say about a text")
def features_page(request: Request, svc: ServiceDep) -> Response:
    query = request.query_params
    errors: list[str] = []
    saes = svc.features.list()
    usable = [s for s in saes if s.problem is None]
    sae_name = web.last(query, "sae") or (usable[0].name if usable else None)
    info = next((s for s in saes if s.name == sae_name), None)
    model_name = web.last(query, "model") or (info.model if info else None)
    texts = query.getlist("text")
    models = svc.views.models()
    default_text = models[model_name].default_text if model_name and model_name in models else ""
    text = texts[-1] if texts else default_text
    picks = {}
    for key in ("token", "feature"):
        raw = web.last(query, key)
        picks[key] = web.parse_number(key, raw, int, errors) if raw is not None else None
    q = (web.last(query, "q") or "").strip()[:200]
    view = dashboard = None
    error = "; ".join(errors) or None
    no_saes = error is None and not saes  # the server's setting, not the reader's input: said, with a 200
    if no_saes:
        error = _("This server has no SAEs: put SAELens folders in EXPLORER_SAES_DIR (see the deployment guide).")
    elif error is None and sae_name is not None:
        try:
            req = requests.ModelRequest.model_validate({"model": model_name or "", "text": text})
            view = svc.features.features(req.spec(), sae_name, TOKEN_FEATURES, dense=True)
            if picks["feature"] is not None:
                dashboard = svc.features.dashboard(sae_name, picks["feature"])
        except web.PAGE_ERRORS as exc:
            error = web.error_message(exc)
    token = picks["token"]
    if view is not None and token is not None and not 0 <= token < len(view.tokens):
        token = None
    labelled = info.labelled_features if info else []
    matches = [f for f in labelled if q.lower() in f.label.lower()][:LABEL_MATCHES] if q else labelled[:LABEL_MATCHES]
    state = {"model": model_name, "sae": sae_name, "text": text, "token": token, "feature": picks["feature"], "q": q}
    dash = None
    if dashboard is not None:
        top = dashboard.max_activation
        counts = dashboard.histogram.counts
        most = max(counts, default=0) or 1  # the tallest bar (1 when there is none)
        effect = [t.value for t in dashboard.logit_effect.positive + dashboard.logit_effect.negative]
        span = max((abs(v) for v in effect), default=1.0) or 1.0
        dash = {
            "d": dashboard,
            "examples": [_example(ex, top) for ex in dashboard.top_examples],
            "bins": [
                {"lo": lo, "hi": hi, "count": c, "width": round(100 * c / most, 1)}
                for lo, hi, c in zip(dashboard.histogram.edges, dashboard.histogram.edges[1:], counts)
            ],
            "positive": [
                {"t": t, "width": round(100 * abs(t.value) / span, 1)} for t in dashboard.logit_effect.positive
            ],
            "negative": [
                {"t": t, "width": round(100 * abs(t.value) / span, 1)} for t in dashboard.logit_effect.negative
            ],
        }
    context = {
        "nav": "features",
        "state": state,
        "saes": saes,
        "error": error,
        "view": view,
        "tokens": [figures.visible(t) for t in view.tokens] if view else [],
        "heat": heatmap(view) if view else None,
        "token_features": view.features[token] if view is not None and token is not None else None,
        "dash": dash,
        "matches": matches,
        "max_text_chars": svc.settings.max_text_chars,
        "link_to": lambda **changes: canonical({**state, **changes}),
        "api_dashboard": (f"/api/v1/saes/{sae_name}/features/{picks['feature']}" if dashboard is not None else None),
    }
    return web.render(
        request, "features.html", context, url=canonical(state), error=error, status=200 if no_saes else 422
    )


def canonical(state: dict) -> str:
    """The URL restoring this page: every value that is set (the text only when given)."""
    params = {k: v for k, v in state.items() if v not in (None, "")}
    return "/features?" + urlencode(params) if params else "/features"
