"""The circuits page, /circuits: why a head attends and what it causes.

Choose a clean and a corrupted text, the answer and wrong tokens and what to patch; the page shows the
patching sweep twice, with every later attention pattern recomputed and frozen, side by side (their difference
is what a patch does through later heads' queries and keys), then attribution patching's first-order estimate of
the recomputed sweep, with their rank correlation and the cells where the two differ most. Click a head (in a
heads grid, or pick it in the form) to see one of its scores split into query part × key part terms, its OV
circuit (does it copy?) and how it composes with earlier heads. On the induction model a short guided walk
follows the previous-token head into the induction head.

The route reads the state from its URL, validates the model and each text with the API's model request
(app/api/requests.py, the same limits; the choices are checked here, positions and heads by the service) and
calls the service (app/service/circuits.py) exactly as the JSON API does; each section says its own error
in place, and the page answers 422 when the sweep cannot run. Figures are drawn by static/js/explorer.js from
their data (templates/partials/figure.html: downloads included); static/js/circuits.js turns a click on a
heads grid into the form's layer and head.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlencode

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from app.api import requests
from app.deps import ServiceDep
from app.http.language import N_, _
from app.pages import figures, web
from app.service import Model, Service
from app.service.circuits import DIRECTIONS, INDUCTION_PREFILL, METRICS, TARGETS, Prefill

router = APIRouter(tags=["pages"], include_in_schema=False)

OV_SOURCES = 8  # source tokens the page lists (the text's first distinct ones)
OV_TOP = 5
TARGET_LABELS = {
    "resid_pre": N_("residual stream before each layer"),
    "resid_mid": N_("residual stream between attention and MLP"),
    "resid_post": N_("residual stream after each layer"),
    "mlp_out": N_("each MLP's output"),
    "attn_head": N_("each head's output (every position)"),
    "attn_head_pos": N_("each head's output, position by position"),
    "pattern": N_("each head's attention pattern"),
}
HEAD_GRIDS = ("attn_head", "pattern")  # grids whose cells are heads: a click picks the head


@dataclass
class CircuitsState:
    """What the page's controls show: the URL's values, else the model's prefill."""

    model: str
    clean: str
    corrupted: str
    answer: str | None
    wrong: str | None
    target: str
    direction: str
    metric: str
    layer: int
    head: int
    query: int = -1
    key: int | None = None


def _text(query, name: str) -> str | None:
    values = query.getlist(name)
    return values[-1] if values and values[-1].strip() else None


def parse(query, svc: Service, errors: list[str]) -> tuple[CircuitsState, Prefill, Model]:
    models = svc.views.models()
    name = web.last(query, "model") or web.default_model(models, svc.settings.default_model)
    if name not in models:
        errors.append(_("unknown model {name!r}: choose one of {choices}").format(name=name, choices=", ".join(models)))
        name = web.default_model(models, svc.settings.default_model)
    model = models[name]
    pre = svc.circuits.prefill(name) if not model.error else Prefill(model.default_text, model.default_text, None, None)
    clean = _text(query, "clean")
    given = clean is not None
    picks: dict[str, Any] = {}  # layer, head, query: ints; key: an int or None
    for key, start in (("layer", model.default_head[0]), ("head", model.default_head[1]), ("query", -1), ("key", None)):
        raw = web.last(query, key)
        picks[key] = start if raw is None else web.parse_number(key, raw, int, errors)
        if picks[key] is None and key != "key":
            picks[key] = start
    choices: dict[str, Any] = {}  # target, direction, metric: one of their names
    for key, allowed, default in (
        ("target", TARGETS, pre.target),
        ("direction", DIRECTIONS, pre.direction),
        ("metric", METRICS, "logit_diff"),
    ):
        value = web.last(query, key) or default
        if value not in allowed:
            errors.append(
                _("{key}={value!r} is not one of {choices}").format(key=key, value=value, choices=", ".join(allowed))
            )
            value = default
        choices[key] = value
    state = CircuitsState(
        model=name,
        clean=pre.clean if clean is None else clean,
        corrupted=_text(query, "corrupted") or (pre.corrupted if clean is None else clean),
        answer=web.last(query, "answer") if "answer" in query else (None if given else pre.answer),
        wrong=web.last(query, "wrong") if "wrong" in query else (None if given else pre.wrong),
        **choices,
        **picks,
    )
    return state, pre, model


def canonical(state: CircuitsState, pre: Prefill, model: Model, default_model: str) -> str:
    """The shortest URL restoring this view: what differs from the model's prefill and defaults."""
    defaults = asdict(
        CircuitsState(
            model=default_model,
            clean=pre.clean,
            corrupted=pre.corrupted,
            answer=pre.answer,
            wrong=pre.wrong,
            target=pre.target,
            direction=pre.direction,
            metric="logit_diff",
            layer=model.default_head[0],
            head=model.default_head[1],
        )
    )
    params = [(k, v) for k, v in asdict(state).items() if v != defaults[k]]
    prefilled = state.clean == pre.clean and state.corrupted == pre.corrupted
    params = [
        (k, "" if v is None else v) for k, v in params if not (k in ("answer", "wrong") and v is None and not prefilled)
    ]
    return "/circuits" + ("?" + urlencode(params) if params else "")


# ------------------------------------------------------------------ figures


def _labelled(fig: dict, rows: list[str], columns: list[str]) -> dict:
    """A value_heatmap with named rows and columns (hover, ticks and the downloads say them)."""
    trace = fig["data"][0]
    trace["x"], trace["y"] = columns, rows
    # the columns' labels turned as the explorer's token axes are ("pos_embed" under a narrow column
    # would run into "embed" beside it)
    angle, below = figures.column_labels(columns)
    fig["layout"]["xaxis"] |= {"type": "category", "tickangle": angle}
    fig["layout"]["yaxis"] |= {"type": "category"}
    fig["layout"]["margin"] |= {
        "t": 34,  # Plotly's mode bar above the top row
        "l": figures.AXIS_TITLE_PX + figures.label_px(rows),
        "b": figures.AXIS_TITLE_PX + below,
    }
    fig["export"] |= {"x": columns, "y": rows}
    return fig


def _sequential(fig: dict, top: float) -> dict:
    """The same heatmap on the sequential scale from 0 (scores that are never negative)."""
    trace = fig["data"][0]
    trace.pop("zmid", None)
    trace |= {"colorscale": figures.WEIGHTS_COLORSCALE, "zmin": 0.0, "zmax": top, "xgap": 1, "ygap": 1}
    fig["layout"]["margin"]["t"] = 80  # a third of the page wide: Plotly's mode bar wraps to three rows
    return fig


def _positions(tokens: list[str]) -> list[str]:
    return [f"{i} {figures.visible(t)}" for i, t in enumerate(tokens)]


def patching_figure(view, kind: str) -> dict:
    """A sweep's normalised grid; kind: "recomputed", "frozen" or "attribution" (the estimate)."""
    columns = _positions(view.tokens["clean"]) if view.columns[0] == "0" else view.columns
    fig = figures.value_heatmap(
        view.grid,
        x_title=_("position") if view.columns[0] == "0" else _("head"),
        y_title=_("head") if view.rows[0].count("H") else _("layer"),
        value_name=_("normalised metric (0 corrupted, 1 clean)"),
        export_name=f"patching-{view.target}-{view.direction}-{kind}",
    )
    return _labelled(fig, view.rows, columns)


def _cell_words(row: str, column: str) -> str:
    """A grid cell in words: "L1H2, position 5", "L0, H3"."""
    return _("{row}, position {column}").format(row=row, column=column) if column.isdigit() else f"{row}, {column}"


def attribution_section(svc: Service, state: CircuitsState, exact) -> dict:
    """Attribution patching's estimate of the recomputed sweep, its rank correlation with it and where they differ."""
    [estimate] = svc.circuits.patching(
        _spec(state),
        state.corrupted,
        state.answer,
        state.wrong,
        state.target,
        state.direction,
        state.metric,
        (False,),
        "attribution",
    )
    comparison = svc.circuits.compare(exact, estimate)
    return {
        "figure": patching_figure(estimate, "attribution"),
        "spearman": None if np.isnan(comparison.spearman) else comparison.spearman,
        "disagreements": [
            {"cell": _cell_words(d.row, d.column), "exact": d.exact, "estimate": d.estimate}
            for d in comparison.disagreements
        ],
    }


def part_words(label: str) -> str:
    """A part of the residual stream, in words."""
    if label == "embed":
        return _("the token's embedding")
    if label == "pos_embed":
        return _("the position embedding")
    if label == "bias":
        return _("the biases")
    if label.endswith(" mlp"):
        return _("{layer}'s MLP").format(layer=label.split()[0])
    if label.endswith(" bias"):
        layer, kind = label.split()[:2]  # "L0 attn bias", "L0 mlp bias" (core/circuits.py)
        return (_("{layer}'s attention bias") if kind == "attn" else _("{layer}'s MLP bias")).format(layer=layer)
    return _("{part}'s output").format(part=label)


def _spec(state: CircuitsState, text: str | None = None):
    """The model and a text (the clean one) checked by the API's model request (its limits), as a RunSpec."""
    return requests.ModelRequest(model=state.model, text=state.clean if text is None else text).spec()


def qk_section(svc: Service, state: CircuitsState) -> dict:
    v = svc.circuits.qk_circuit(_spec(state), state.layer, state.head, state.query, state.key)
    fig = figures.value_heatmap(
        v.contributions,
        x_title=_("key side: what wrote the stream at the key"),
        y_title=_("query side"),
        value_name=_("term of the score"),
        export_name=f"qk-L{v.layer}H{v.head}-q{v.query}-k{v.key}",
    )
    pairs = [
        {
            "query": part_words(p.query_part),
            "key": part_words(p.key_part),
            "value": p.contribution,
            "share": p.contribution / v.score if v.score else None,
        }
        for p in v.top_pairs[:3]
    ]
    return {
        "v": v,
        "figure": _labelled(fig, v.query_parts, v.key_parts),
        "pairs": pairs,
        "tokens": _positions(v.tokens),
        "query_token": figures.visible(v.query_token),
        "key_token": figures.visible(v.key_token),
    }


def ov_section(svc: Service, state: CircuitsState) -> dict:
    v = svc.circuits.ov_circuit(_spec(state), state.layer, state.head, OV_TOP, first=OV_SOURCES)
    rows = [
        {
            "token": figures.visible(s.token),
            "rank": s.self_rank,
            "top": [{"token": figures.visible(t.token), "logit": t.logit, "own": t.id == s.id} for t in s.top],
        }
        for s in v.sources
    ]
    # the circuit among the sources themselves: row = the token attended to, column = the logit it raises for each
    # source token; a copying head's diagonal stands out (a figure, so it has its downloads like every other)
    labels = [f"{figures.visible(s.token)}" for s in v.sources]
    fig = figures.value_heatmap(
        v.ov.logits[:, v.ov.sources],
        x_title=_("token"),
        y_title=_("attends to"),
        value_name="logit",
        export_name=f"ov-L{v.layer}H{v.head}",
    )
    return {
        "v": v,
        "rows": rows,
        "copies": sum(r["rank"] == 0 for r in rows),
        "figure": _labelled(fig, labels, labels) if len(set(labels)) == len(labels) else fig,
    }


def composition_section(svc: Service, state: CircuitsState) -> dict:
    v = svc.circuits.composition(_spec(state))
    cfg = v.config
    H, later = cfg.n_heads, slice(cfg.n_heads, None)
    earlier = slice(0, (cfg.n_layers - 1) * H)
    top = float(np.nanmax([np.nanmax(getattr(v, m)) for m in "qkv"]))
    grids = []
    for mode, words in (("q", _("queries")), ("k", _("keys")), ("v", _("values"))):
        m = getattr(v, mode)[later, earlier]
        fig = figures.value_heatmap(
            m,
            x_title=_("earlier head (writes)"),
            y_title=_("later head (reads)"),
            value_name=_("{mode}-composition").format(mode=mode.upper()),
            export_name=f"composition-{mode}",
        )
        grids.append(
            {"mode": mode, "words": words, "figure": _sequential(_labelled(fig, v.heads[later], v.heads[earlier]), top)}
        )
    selected = state.layer * H + state.head
    reads = []
    if state.layer >= 1:
        for mode, words in (("k", _("keys")), ("q", _("queries")), ("v", _("values"))):
            row = getattr(v, mode)[selected]
            best = int(np.nanargmax(row))
            reads.append({"mode": mode.upper(), "words": words, "head": v.heads[best], "score": float(row[best])})
    return {"v": v, "grids": grids, "reads": reads, "selected": v.heads[selected]}


def walk(model: Model, state: CircuitsState, pre: Prefill, sections: dict) -> dict | None:
    """The guided walk, on a model trained with the induction recipe and its own example: which head
    looks back, which reads it, and what patching it does (numbers from this page's own results)."""
    comp = sections.get("composition")
    if pre != INDUCTION_PREFILL or comp is None or "v" not in comp:  # its words are the induction recipe's story
        return None
    v = comp["v"]
    H = v.config.n_heads
    induction = model.default_head
    row = v.k[induction[0] * H + induction[1]]
    previous = divmod(int(np.nanargmax(row)), H)
    patch = sections.get("patching")
    cell = None
    if patch and "views" in patch and patch["views"][0].target == "attn_head" and state.direction == "noise":
        cell = [float(view.grid[previous]) for view in patch["views"]]
    label = lambda lh: f"L{lh[0]}H{lh[1]}"  # noqa: E731
    base = {"model": state.model}
    link = lambda **kw: "/circuits?" + urlencode(base | kw)  # noqa: E731
    return {
        "previous": label(previous),
        "induction": label(induction),
        "k": float(row[previous[0] * H + previous[1]]),
        "baseline": v.baseline,
        "cell": cell,
        # the first link asks about a query in the first half, whose key the previous-token head finds
        "steps": [
            link(layer=previous[0], head=previous[1], query=len(state.clean) // 4),
            link(layer=induction[0], head=induction[1]),
            link(layer=induction[0], head=induction[1], target="attn_head", direction="noise"),
        ],
    }


# ------------------------------------------------------------------ the route


def _section(build, *args) -> dict:
    try:
        return build(*args)
    except web.PAGE_ERRORS as exc:
        return {"error": web.error_message(exc)}


def patching_section(svc: Service, state: CircuitsState) -> dict:
    _spec(state, state.corrupted)  # the corrupted text within the same limits
    views = svc.circuits.patching(
        _spec(state),
        state.corrupted,
        state.answer,
        state.wrong,
        state.target,
        state.direction,
        state.metric,
        (False, True),
    )
    r = views[0]
    return {
        "views": views,
        "figures": [patching_figure(v, kind) for v, kind in zip(views, ("recomputed", "frozen"))],
        "attribution": _section(attribution_section, svc, state, r),
        "answer": figures.visible(r.answer.token),
        "wrong": figures.visible(r.wrong.token),
        "clean_metric": r.clean_metric,
        "corrupted_metric": r.corrupted_metric,
        "passes": 2 * r.passes,
        "heads": r.target in HEAD_GRIDS,
        "head_rows": r.target == "attn_head_pos",
        "tokens": _positions(r.tokens["corrupted"]),
    }


@router.get("/circuits", response_class=HTMLResponse, summary="Circuits: patching, QK and OV circuits, composition")
def circuits(request: Request, svc: ServiceDep) -> Response:
    errors: list[str] = []
    state, pre, model = parse(request.query_params, svc, errors)
    error = "; ".join(errors) or None
    sections: dict[str, dict] = {}
    if error is None:
        sections["patching"] = _section(patching_section, svc, state)
        sections["qk"] = _section(qk_section, svc, state)
        sections["ov"] = _section(ov_section, svc, state)
        sections["composition"] = _section(composition_section, svc, state)
        error = sections["patching"].get("error")
    models = svc.views.models()
    context = {
        "state": state,
        "sections": sections,
        "error": error,
        "walk": walk(model, state, pre, sections),
        "models": [m for m in models.values()],
        "model": model,
        "targets": TARGETS,
        "target_labels": {k: _(label) for k, label in TARGET_LABELS.items()},
        "directions": DIRECTIONS,
        "metrics": METRICS,
        "n_layers": model.cfg.n_layers,
        "n_heads": model.cfg.n_heads,
        "max_text_chars": svc.settings.max_text_chars,
        "max_passes": svc.settings.patching_max_passes,
        "nav": "circuits",
        "form_id": "circuits",
        "classroom": web.is_on(request.query_params, "classroom"),
    }
    url = canonical(state, pre, model, web.default_model(models, svc.settings.default_model))
    if context["classroom"]:
        url += ("&" if "?" in url else "?") + "classroom=1"
    # a new model re-renders the whole form (its texts, layers and heads); any other change its results
    block = "form" if request.headers.get("hx-target") == "circuits" else "results"
    return web.render(request, "circuits.html", context, block=block, url=url, error=error)
