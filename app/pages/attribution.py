"""The attribution page, /attribution: which tokens of the text made the model predict a token, and which heads
moved them there.

Choose a model, a text, the position whose prediction to explain (default: the last), the target token (default:
the model's top prediction there), an optional contrast token (then the metric is logit(target) − logit(contrast))
and a method: saliency, input × gradient, integrated gradients, occlusion, or direct logit attribution by head
and source token. The text is shown shaded by the method's score for each token on a diverging scale (ColorBrewer
PuOr, the figures' own, safe for colour-blind readers), with its legend and a table of the numbers; the scores are
also a bar chart, and direct_logit's heads × source tokens a heatmap (both with their CSV and JSON downloads).

Every number is the service's (app/service/attribution.py), asked as POST /api/v1/analysis/attribution asks it;
the request is validated by the API's own request model (the same limits). The whole state is in the URL (model,
text, position, target, contrast, method, steps, and the run's toggles the explorer passes on); htmx swaps the
results and pushes it. Bad input is said in place of the results, with status 422. The explorer's next-token bars
link here (`explain_link`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any
from urllib.parse import urlencode

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from app.api import requests
from app.deps import ServiceDep
from app.http import language
from app.http.language import N_, _
from app.pages import figures, web
from app.service import Service, knobs
from app.service import attribution as service_attribution

router = APIRouter(tags=["pages"], include_in_schema=False)

METHODS = service_attribution.METHODS  # saliency, input_x_gradient, integrated_gradients, occlusion, direct_logit
DEFAULT_METHOD = "integrated_gradients"
METHOD_NAMES = {
    "saliency": N_("saliency (gradient size)"),
    "input_x_gradient": N_("input × gradient"),
    "integrated_gradients": N_("integrated gradients"),
    "occlusion": N_("occlusion (token removed)"),
    "direct_logit": N_("direct logit attribution (by head)"),
}
METHOD_HELP = {
    "saliency": N_(
        "How much the metric would change if the token's embedding moved a little: the length of the gradient. "
        "Never negative, so it says how much a token matters, not which way."
    ),
    "input_x_gradient": N_(
        "The gradient times the embedding itself, summed over its dimensions: a first-order guess at what "
        "removing the token would do, with a sign."
    ),
    "integrated_gradients": N_(
        "The gradient averaged along the straight path from a zero embedding to the real one, times the "
        "embedding. Its scores add up to the metric minus the metric with every embedding at zero (completeness)."
    ),
    "occlusion": N_(
        "The metric minus the metric with this token's embedding set to zero: one extra run for each token."
    ),
    "direct_logit": N_(
        "What each head moved from each earlier token straight into the metric, through its OV circuit (the "
        "final norm's scale frozen): the token's score is the sum over heads."
    ),
}


@dataclass(frozen=True)
class AttributionState:
    """What the page's controls show: the URL's values (the text defaults to the model's own)."""

    model: str
    text: str
    position: int | None = None  # None: the last position
    target: str | None = None  # None: the model's top prediction at the position
    contrast: str | None = None
    method: str = DEFAULT_METHOD
    steps: int | None = None  # None: the API's default
    # the run's toggles the URL sets (app/models/knobs.py: the explorer's, which its next-token bars pass on)
    toggles: tuple[tuple[str, Any], ...] = ()


def parse(query: web.QueryString, svc: Service, errors: list[str]) -> AttributionState:
    models = svc.views.models()
    name = web.last(query, "model") or web.default_model(models, svc.settings.default_model)
    texts = query.getlist("text")
    text = texts[-1] if texts else (models[name].default_text if name in models else "")
    numbers: dict[str, Any] = {}
    for key in ("position", "steps"):
        raw = web.last(query, key)
        numbers[key] = web.parse_number(key, raw, int, errors) if raw is not None else None
    method = web.last(query, "method") or DEFAULT_METHOD
    if method not in METHODS:
        errors.append(
            _("{key}={value!r} is not one of {choices}").format(key="method", value=method, choices=", ".join(METHODS))
        )
        method = DEFAULT_METHOD
    # a token may be a space: only an absent or empty parameter means "the default"
    tokens = {
        k: (query.getlist(k)[-1] if query.getlist(k) and query.getlist(k)[-1] != "" else None)
        for k in ("target", "contrast")
    }
    toggles = []
    for knob in knobs.on_form():
        raw = web.last(query, knob.name)
        value = None if raw is None else web.parse_knob(knob, raw, errors)
        if value is not None and name in models and knob.name in models[name].toggles:  # as the explorer's
            toggles.append((knob.name, value))
    return AttributionState(model=name, text=text, method=method, **numbers, **tokens, toggles=tuple(toggles))


def canonical(state: AttributionState) -> str:
    """The URL restoring this view: every value that is set (the method when it is not the default)."""
    fields = asdict(state)
    toggles = [(k, int(v) if isinstance(v, bool) else v) for k, v in fields.pop("toggles")]
    params = [(k, v) for k, v in fields.items() if v is not None and not (k == "method" and v == DEFAULT_METHOD)]
    params += toggles
    return "/attribution" + ("?" + urlencode(params) if params else "")


def explain_link(model: str, text: str, position: int, target: str) -> str:
    """The page explaining why `model` predicts the token `target` after position `position` of `text`
    (the explorer's next-token bars link here), in the reader's language."""
    return language.localized(canonical(AttributionState(model=model, text=text, position=position, target=target)))


# ------------------------------------------------------------------ the shaded text


def _rgb(hex_colour: str) -> tuple[int, int, int]:
    return int(hex_colour[1:3], 16), int(hex_colour[3:5], 16), int(hex_colour[5:7], 16)


def _luminance(rgb: tuple[float, ...]) -> float:
    """WCAG's relative luminance."""
    lin = [c / 255 / 12.92 if c / 255 <= 0.03928 else ((c / 255 + 0.055) / 1.055) ** 2.4 for c in rgb]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def shade(value: float, top: float) -> dict[str, str]:
    """A score's background on the figures' diverging scale (PuOr: purple below 0, white at 0, orange above),
    −top … top, and the text colour (black or white) that reads best on it."""
    at = 0.5 if top <= 0 else min(1.0, max(0.0, 0.5 + 0.5 * float(value) / top))
    stops = [(float(str(stop)), str(colour)) for stop, colour in figures.SCORES_COLORSCALE]
    rgb = tuple(float(c) for c in _rgb(stops[-1][1]))
    for (a, lo), (b, hi) in zip(stops, stops[1:]):
        if at <= b:
            f = 0.0 if b == a else (at - a) / (b - a)
            rgb = tuple(x + f * (y - x) for x, y in zip(_rgb(lo), _rgb(hi)))
            break
    background = "#{:02x}{:02x}{:02x}".format(*(round(c) for c in rgb))
    # contrast with black is (L + 0.05) / 0.05, with white 1.05 / (L + 0.05): the larger wins
    ink = "#000000" if (_luminance(rgb) + 0.05) ** 2 >= 0.05 * 1.05 else "#ffffff"
    return {"background": background, "ink": ink}


def shaded(tokens: list[str], scores, position: int | None = None) -> list[dict]:
    """Each token as the shaded text shows it: its text (whitespace visible), score and colours; `explained`
    marks the position whose prediction is explained, `after` the tokens after it."""
    values = [float(s) for s in scores]
    top = max((abs(v) for v in values), default=0.0)
    return [
        {
            "i": i,
            "text": figures.visible(t),
            "score": s,
            "explained": i == position,
            "after": position is not None and i > position,
            **shade(s, top),
        }
        for i, (t, s) in enumerate(zip(tokens, values))
    ]


LEGEND_STEPS = 9  # the legend's swatches, −top … top


def legend(top: float) -> list[dict]:
    return [{"value": v, **shade(v, top)} for v in np.linspace(-top, top, LEGEND_STEPS)]


# ------------------------------------------------------------------ figures (the notebook face draws them too)


def _positions(tokens: list[str]) -> list[str]:
    return [f"{i} {figures.visible(t)}" for i, t in enumerate(tokens)]


def scores_figure(tokens: list[str], scores, method: str) -> dict:
    """Each token's score as a bar (the text's tokens along x, in order), shaded as the text is."""
    values = [float(v) for v in scores]
    top = max((abs(v) for v in values), default=0.0)
    columns = _positions(tokens)
    trace = {
        "type": "bar",
        "x": columns,
        "y": values,
        "marker": {"color": [shade(v, top)["background"] for v in values], "line": {"color": "#4d4d4d", "width": 1}},
        "hovertemplate": "%{x}<br>" + figures.escape(_("score")) + " = %{y:.4f}<extra></extra>",
    }
    angle, below = figures.column_labels(columns)
    layout = figures.base_layout(
        xaxis={"type": "category", "tickangle": angle, "title": {"text": _("token")}},
        yaxis={
            "title": {"text": figures.escape(_(METHOD_NAMES[method]))},
            "zeroline": True,
            "zerolinecolor": "#4d4d4d",
        },
        bargap=0.15,
        margin={"l": 70, "r": 20, "t": 34, "b": figures.AXIS_TITLE_PX + below},
    )
    return {
        "data": [trace],
        "layout": layout,
        "export": {
            "name": f"attribution-{method}",
            "kind": "bars",
            "x": list(tokens),
            "x_title": "token",
            "value": method,
        },
    }


def heads_figure(heads, tokens: list[str], position: int) -> dict:
    """direct_logit's [layer][head][source pos] as a heatmap: rows L{layer}H{head}, columns the source tokens
    up to the explained position (a causal head reads no later one)."""
    h = np.asarray(heads, dtype=float)
    n_layers, n_heads = h.shape[:2]
    m = h.reshape(n_layers * n_heads, -1)[:, : position + 1]
    rows = [f"L{layer}H{head}" for layer in range(n_layers) for head in range(n_heads)]
    columns = _positions(tokens[: position + 1])
    fig = figures.value_heatmap(
        m, x_title=_("source token"), y_title=_("head"), value_name=_("logit moved"), export_name="attribution-heads"
    )
    trace = fig["data"][0]
    trace["x"], trace["y"] = columns, rows
    trace |= {"xgap": 1, "ygap": 1}
    angle, below = figures.column_labels(columns)
    fig["layout"]["xaxis"] |= {"type": "category", "tickangle": angle}
    fig["layout"]["yaxis"] |= {"type": "category"}
    fig["layout"]["margin"] = {
        "l": figures.AXIS_TITLE_PX + figures.label_px(rows),
        "r": 20,
        "t": 34,
        "b": figures.AXIS_TITLE_PX + below,
    }
    fig["export"] |= {"x": columns, "y": rows}
    return fig


# ------------------------------------------------------------------ the view


def attribute(svc: Service, state: AttributionState):
    """The service's attribution for this state, asked as POST /api/v1/analysis/attribution asks it: the model and
    text validated by the API's model request (its limits); the position, tokens and steps checked by the service."""
    spec = requests.ModelRequest.model_validate(
        {"model": state.model, "text": state.text, **dict(state.toggles)}
    ).spec()
    steps = service_attribution.DEFAULT_STEPS if state.steps is None else state.steps
    position = -1 if state.position is None else state.position
    return svc.attribution.attribute(spec, state.method, position, state.target, state.contrast, steps)


def view(r, state: AttributionState) -> dict:
    """The page's texts, shades and figures from the service's result `r` (app/service/attribution.py)."""
    tokens = list(r.tokens)
    scores = [float(v) for v in r.scores]
    top = max((abs(v) for v in scores), default=0.0)
    position = r.position
    completeness = None
    if r.convergence_delta is not None:  # integrated gradients
        completeness = {"sum": sum(scores), "difference": r.metric - r.baseline_metric}
    contrast = r.contrast.token if r.contrast is not None else None
    return {
        "r": r,
        "tokens": [
            t | {"href": language.localized(canonical(replace(state, position=t["i"], target=None, contrast=None)))}
            for t in shaded(tokens, scores, position)
        ],
        "top": top,
        "legend": legend(top),
        "target": figures.visible(r.target.token),
        "contrast": figures.visible(contrast) if contrast is not None else None,
        "at": figures.visible(tokens[position]),
        "completeness": completeness,
        # the model's most likely tokens there: each a target, or a contrast to the target
        "predictions": [
            {
                "token": figures.visible(t.token),
                "prob": t.prob,
                "target": language.localized(
                    canonical(replace(state, position=position, target=t.token, contrast=None))
                ),
                "contrast": (
                    language.localized(
                        canonical(replace(state, position=position, target=r.target.token, contrast=t.token))
                    )
                    if t.id != r.target.id
                    else None
                ),
            }
            for t in r.predictions
        ],
        "scores_figure": scores_figure(tokens, scores, r.method),
        "heads_figure": heads_figure(r.heads, tokens, position) if r.heads is not None else None,
        "parts": [{"name": p.label, "value": float(p.value)} for p in r.parts or ()],
        "download": {
            "model": state.model,
            "method": r.method,
            "position": position,
            "target": r.target.token,
            "contrast": contrast,
            "steps": r.steps,
            "tokens": tokens,
            "token_ids": [int(t) for t in r.token_ids],
            "metric": r.metric,
            "baseline_metric": r.baseline_metric,
            "convergence_delta": r.convergence_delta,
            "scores": scores,
        },
    }


@router.get("/attribution", response_class=HTMLResponse, summary="Which tokens made the model predict a token")
def attribution(request: Request, svc: ServiceDep) -> Response:
    errors: list[str] = []
    state = parse(request.query_params, svc, errors)
    error = "; ".join(errors) or None
    result = None
    if error is None:
        try:
            result = view(attribute(svc, state), state)
        except web.PAGE_ERRORS as exc:
            error = web.error_message(exc)
    models = svc.views.models()
    classroom = web.is_on(request.query_params, "classroom")
    context = {
        "nav": "attribution",
        "state": state,
        "error": error,
        "v": result,
        "models": list(models.values()),
        "methods": [(m, _(METHOD_NAMES[m])) for m in METHODS],
        "method_name": _(METHOD_NAMES[state.method]),
        "method_help": _(METHOD_HELP[state.method]),
        "max_steps": service_attribution.MAX_STEPS,
        "default_steps": service_attribution.DEFAULT_STEPS,
        "max_text_chars": svc.settings.max_text_chars,
        "link_to": lambda **changes: language.localized(canonical(replace(state, **changes))),
        "form_id": "attribution",
        "classroom": classroom,
    }
    url = canonical(state) + (("&" if "?" in canonical(state) else "?") + "classroom=1" if classroom else "")
    return web.render(request, "attribution.html", context, url=url, error=error)
