"""The training page, /train: choose a recipe, press Start, watch attention form.

GET /train shows the form (a recipe's working defaults) and the recent runs; POST /train queues the
run (and, if asked, its 1-layer control beside it) through the service, exactly as POST /api/v1/train
does, and redirects to /train?run=<id>, the run's page: a link a teacher can share, which restores
the view (the run, its control, the head and the step shown). The page follows the run live: it
listens to /api/v1/runs/<id>/events (the htmx SSE extension) and redraws its figures from the server
on every new record, while static/js/train.js moves the progress bar and scrubs the step slider.
"""

from __future__ import annotations

import asyncio
import dataclasses
from urllib.parse import urlencode

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from app.api import requests
from app.deps import ServiceDep
from app.http.language import N_, _, localized
from app.http.security import client_address
from app.pages import figures, inspect_figures, web
from app.service import FINISHED, Service, TrainingRunInfo

router = APIRouter(tags=["pages"], include_in_schema=False)

RECIPES = {
    "induction": N_("Induction heads: random characters with a repeated segment"),
    "nasi-lemak": N_("Nasi lemak: the spec's one-block model on its Malay phrases"),
    "text": N_("Text: a character-level GPT on Python's documentation, or your own text"),
    "sae": N_("Sparse autoencoder: the features of a trained model's hook, with SAELens's objectives"),
}
# A run's status as the page says it (the API's `status` values are the keys).
STATUS_NAMES = {
    "queued": N_("queued"),
    "running": N_("running"),
    "done": N_("done"),
    "failed": N_("failed"),
    "cancelled": N_("cancelled"),
    "interrupted": N_("interrupted"),
}
DEFAULT_RECIPE = "induction"
FORM_FIELDS = tuple(c.name for c in requests.TRAIN_FORM)  # the form's settings (core/recipes.py labels them)
TARGETS = {"nasi-lemak": "P('l' | \"nasi \")", "induction": N_("P(the repeated token)"), "text": None}
SAE_FIELDS = requests.SAE_FIELDS
SAE_CHOICES = tuple(f for f in SAE_FIELDS if f not in FORM_FIELDS)  # the sae form's choices, not numbers
# What the sae recipe's curves show: (record key, title, axis, caption)
SAE_CURVES = (
    ("mse", N_("Reconstruction error"), N_("MSE"), N_("Σ over the hook's dimensions of (x̂ − x)², the batch's mean.")),
    (
        "explained_variance",
        N_("Explained variance"),
        N_("share"),
        N_("1 − the error's sum of squares over the batch's variance about its mean: 1 is a perfect copy."),
    ),
    (
        "l0",
        N_("L0"),
        N_("features"),
        N_("Features active per token: k for a topk SAE; the L1 (standard) and L0 (jumprelu) penalties lower it."),
    ),
    (
        "dead_fraction",
        N_("Dead features"),
        N_("share"),
        N_("The share of features that fired on no token of the last 200 steps' batches."),
    ),
)


def form_controls(recipe: str) -> list[requests.TrainControl]:
    """The settings the form offers for a recipe: the sae recipe's own and those it shares; a model's, the rest."""
    if recipe == "sae":
        return [c for c in requests.TRAIN_FORM if c.name in requests.SAE_SETTINGS]
    return [c for c in requests.TRAIN_FORM if c.name not in SAE_FIELDS]


def _form_values(query) -> tuple[str, dict[str, str]]:
    recipe = web.last(query, "recipe") or DEFAULT_RECIPE
    names = (*FORM_FIELDS, *SAE_CHOICES, "text") if recipe == "sae" else (*FORM_FIELDS, "text")
    given = {k: v for k in names if (v := web.last(query, k)) is not None}
    if recipe == "sae":  # the form shows every architecture's settings: only the chosen one's are sent
        chosen = given.get("architecture", requests.SAE_DEFAULT_ARCHITECTURE)
        for architecture, names in requests.SAE_ARCHITECTURE_SETTINGS.items():
            for name in names if architecture != chosen else ():
                given.pop(name, None)
    else:
        given = {k: v for k, v in given.items() if k not in SAE_FIELDS}
    return recipe, given


def _request_fields(recipe: str, given: dict[str, str]) -> requests.TrainRequest:
    """The form's fields as the API's request (same names and limits; "1"/"0" are booleans)."""
    return requests.TrainRequest.model_validate({"recipe": recipe, **given})


# ------------------------------------------------------------------ figures of a run


def _series(runs: list[tuple[str, TrainingRunInfo]], key: str) -> list[tuple[str, list, list]]:
    out = []
    for label, info in runs:
        m = info.metrics
        points = [(s, v) for s, v in zip(m["step"], m[key]) if v is not None]
        if points:
            out.append((label, [s for s, _ in points], [v for _, v in points]))
    return out


def sae_figures(info: TrainingRunInfo) -> list[dict]:
    """An SAE run's curves: reconstruction error, explained variance, L0 and dead features by step."""
    out = []
    for key, title, axis, caption in SAE_CURVES:
        series = _series([(_("SAE"), info)], key) or [(_("no records yet"), [0], [0])]
        figure = figures.line_chart(series, x_title=_("step"), y_title=_(axis), export_name=f"sae-{key}")
        out.append({"id": f"sae-{key}", "title": _(title), "caption": _(caption), "figure": figure})
    return out


def run_figures(runs: list[tuple[str, TrainingRunInfo]], recipe: str) -> list[dict]:
    """Loss curves (the control overlaid), every head's scores over the steps, the target's probability."""
    if recipe == "sae":
        return sae_figures(runs[0][1])
    loss = _series(runs, "loss")
    loss = [(_("{label}: training").format(label=label), x, y) for label, x, y in loss] + [
        (_("{label}: held-out").format(label=label), x, y) for label, x, y in _series(runs, "val_loss")
    ]
    out = [
        {
            "id": "loss",
            "title": _("Loss"),
            "caption": _(
                "Cross-entropy of the next token, nats: training (the mean since the previous record) and "
                "on fixed held-out sequences. The induction model sits on a plateau, then falls off a cliff "
                "as its induction head forms."
            ),
            "figure": figures.line_chart(
                loss or [(_("no records yet"), [0], [0])], x_title=_("step"), y_title=_("loss"), export_name="loss"
            ),
        }
    ]
    info = runs[0][1]
    if info.records:
        for key, title, caption in (
            (
                "induction",
                _("Induction score of every head"),
                _(
                    "Attention on the token that followed an earlier copy of the current one, on the probe. "
                    "An induction head is a row that turns dark."
                ),
            ),
            (
                "previous_token",
                _("Previous-token score of every head"),
                _("Attention on the token just before: the head an induction head reads from."),
            ),
        ):
            out.append(
                {
                    "id": f"heads-{key}",
                    "title": title,
                    "caption": caption,
                    "figure": inspect_figures.head_step_heatmap(
                        info.heads[key], info.heads["step"], value_name=_("score"), export_name=f"{key}-scores-by-step"
                    ),
                }
            )
    target = TARGETS.get(recipe)
    series = _series(runs, "target")
    if target and series:
        out.append(
            {
                "id": "target",
                "title": _(target),
                "caption": _("The recipe's target probability as it trains."),
                "figure": figures.line_chart(
                    series,
                    x_title=_("step"),
                    y_title=_("probability"),
                    y_range=[0, 1.02],
                    export_name="target-probability",
                ),
            }
        )
    return out


def pattern_figure(svc: Service, info: TrainingRunInfo, layer: int, head: int, step: int | None) -> dict | None:
    """The chosen head's pattern at the chosen snapshot step, and every snapshot's for the slider."""
    if not info.snapshots:
        return None
    history = svc.training.head_history(info.id, layer, head)
    shown = step if step in history.steps else history.steps[-1]
    index = history.steps.index(shown)
    n = len(history.tokens)
    mask = [[j > i for j in range(n)] for i in range(n)]
    fig = figures.attention_heatmap(
        history.patterns[index],
        history.tokens,
        kind="weights",
        mask=np.asarray(mask),
        export_name=f"L{layer}H{head}-step{shown}",
    )
    return {"figure": fig, "steps": history.steps, "step": shown, "patterns": history.patterns}


# ------------------------------------------------------------------ the routes


def _links(info: TrainingRunInfo, text: str, best_head: int | None) -> dict[str, str]:
    """Where to take the run's model: the explorer on its last layer's best induction head and a text that
    repeats (where an induction head shows), its heads on /inspect, an SAE on it, its weights, its JSON."""
    model = info.model or info.id
    head = {"layer": info.config["n_layers"] - 1, "head": best_head} if best_head is not None else {}
    return {
        "explorer": "/?" + urlencode({"model": model, "text": text} | head),
        "inspect": "/inspect?" + urlencode({"view": "detectors", "model": model, "text": text}),
        "sae_train": "/train?" + urlencode({"recipe": "sae", "model": model}),
        "checkpoint": f"/api/v1/runs/{info.id}/checkpoint",
        "api": f"/api/v1/runs/{info.id}",
        "events": f"/api/v1/runs/{info.id}/events",
    }


EXPLORE_TEXT = {"nasi-lemak": "nasi ", "text": "The for statement is used to iterate"}
REPEATABLE = ("ali makan nasi lemak.", "nasi lemak.", "lemak.")  # longest first


def explore_text(recipe: str, seq_len: int) -> str:
    """A text to open the run's model on: for induction a phrase said twice, as long as its context holds."""
    if recipe != "induction":
        return EXPLORE_TEXT[recipe][:seq_len]
    phrase = next((p for p in REPEATABLE if 2 * len(p) + 1 <= seq_len), REPEATABLE[-1][: max(1, seq_len // 2)])
    return f"{phrase} {phrase}"[:seq_len]


def run_view(svc: Service, query, errors: list[str]) -> dict | None:
    """The page of one run (and its control), from the URL: run, control, layer, head, step."""
    info = svc.training.get(web.last(query, "run") or "")
    if info.recipe == "sae":
        return sae_view(info, query)
    control_id = web.last(query, "control")
    runs = [(_("model"), info)]
    control = svc.training.get(control_id) if control_id else None
    if control is not None:
        runs.append((_("1-layer control"), control))
    best = None  # the last layer's head that scores highest on induction now: the page opens on it
    if info.records:
        induction = info.records[-1]["induction"][-1]
        best = max(range(len(induction)), key=lambda h: induction[h] if induction[h] is not None else -1)
    picks = {}
    for key, default in (("layer", info.config["n_layers"] - 1), ("head", best or 0), ("step", None)):
        raw = web.last(query, key)
        picks[key] = web.parse_number(key, raw, int, errors) if raw is not None else default
    if errors:
        return None
    layer = min(max(picks["layer"] or 0, 0), info.config["n_layers"] - 1)
    head = min(max(picks["head"] or 0, 0), info.config["n_heads"] - 1)
    pattern = pattern_figure(svc, info, layer, head, picks["step"])
    running = [r for _, r in runs if r.status not in FINISHED]
    follow = f"/api/v1/runs/{running[0].id}/events?" + urlencode({"since": running[0].event_id}) if running else None
    return {
        "run": info,
        "control": control,
        "runs": runs,
        "layer": layer,
        "head": head,
        "pattern": pattern,
        "figures": run_figures(runs, info.recipe),
        "samples": info.samples[-5:][::-1],
        "links": _links(info, explore_text(info.recipe, info.config["seq_len"]), best),
        "best_head": best,
        "follow": follow,
        "finished": not running,
        "url": _canonical(query),
    }


def sae_view(info: TrainingRunInfo, query) -> dict:
    """The page of an SAE's run: its curves, and once it has weights its features and its download."""
    follow = None
    if info.status not in FINISHED:
        follow = f"/api/v1/runs/{info.id}/events?" + urlencode({"since": info.event_id})
    features = "/features?" + urlencode({"sae": info.id, "model": info.config["model"]})
    return {
        "run": info,
        "control": None,
        "runs": [(_("SAE"), info)],
        "pattern": None,
        "figures": sae_figures(info),
        "samples": [],
        "links": {"api": f"/api/v1/runs/{info.id}", "sae": f"/api/v1/saes/{info.id}/download", "features": features},
        "best_head": None,
        "follow": follow,
        "finished": follow is None,
        "url": _canonical(query),
    }


def _canonical(query) -> str:
    keep = [(k, web.last(query, k)) for k in ("run", "control", "layer", "head", "step", "classroom")]
    return "/train?" + urlencode([(k, v) for k, v in keep if v is not None])


@router.get("/train", response_class=HTMLResponse, summary="Train a model and watch it learn")
def train_page(request: Request, svc: ServiceDep) -> Response:
    query = request.query_params
    recipe, given = _form_values(query)
    errors: list[str] = []
    view, status = None, 422
    if recipe not in RECIPES:
        errors.append(_("recipe={recipe!r} is not one of {choices}").format(recipe=recipe, choices=", ".join(RECIPES)))
        recipe = DEFAULT_RECIPE
    if web.last(query, "run") and not errors:
        try:
            view = run_view(svc, query, errors)
        except web.PAGE_ERRORS as exc:
            errors.append(web.error_message(exc))
            status = web.error_status(exc)
    return _render(request, svc, recipe, given, view, "; ".join(errors) or None, status)


@router.post("/train", response_class=HTMLResponse, summary="Start a training run from the form")
async def start(request: Request, svc: ServiceDep):
    form = await request.form()
    recipe, given = _form_values(form)
    try:
        req = _request_fields(recipe, given)
        client = client_address(request)
        # Building a recipe reads its corpus: off the event loop.
        info, _ = await asyncio.to_thread(svc.training.start, req.recipe, req.changes(), client)
        target = {"run": info.id}
        if web.is_on(form, "control") and req.recipe == "induction":
            control, _ = await asyncio.to_thread(
                svc.training.start, req.recipe, req.changes() | {"n_layers": 1}, client
            )
            target["control"] = control.id
        if web.is_on(form, "classroom"):
            target["classroom"] = "1"
        return RedirectResponse(localized("/train?" + urlencode(target)), status_code=303)
    except web.PAGE_ERRORS as exc:
        return _render(request, svc, recipe, given, None, web.error_message(exc), web.error_status(exc))


@router.post("/train/stop", response_class=HTMLResponse, summary="Stop a run from its page")
async def stop(request: Request, svc: ServiceDep):
    """The page's Stop button (a form, so it works without JavaScript): cancels the run and its control."""
    form = await request.form()
    target = {k: v for k in ("run", "control") if (v := web.last(form, k))}
    try:
        for id in target.values():
            await asyncio.to_thread(svc.training.cancel, id)
    except web.PAGE_ERRORS as exc:
        return _render(request, svc, DEFAULT_RECIPE, {}, None, web.error_message(exc), web.error_status(exc))
    return RedirectResponse(localized("/train?" + urlencode(target)), status_code=303)


def _render(
    request: Request,
    svc: Service,
    recipe: str,
    given: dict[str, str],
    view: dict | None,
    error: str | None,
    status: int = 422,
) -> Response:
    defaults = svc.training.recipe_defaults(recipe if recipe in RECIPES else DEFAULT_RECIPE)
    values = {k: given.get(k, defaults.get(k)) for k in (*FORM_FIELDS, *SAE_CHOICES)} | {"text": given.get("text", "")}
    sae = svc.training.sae_form(values.get("model"))
    if recipe == "sae":  # the architectures not chosen keep their defaults in view
        for own in sae.defaults.values():
            values |= {name: values[name] if values[name] is not None else default for name, default in own.items()}
    try:
        recent = svc.training.all()[:10]
    except web.PAGE_ERRORS:  # training is off here: the form says why when used
        recent = []
    context = {
        "recipes": {key: _(label) for key, label in RECIPES.items()},
        "recipe": recipe,
        "status_names": {key: _(name) for key, name in STATUS_NAMES.items()},
        "values": values,
        "view": view,
        "error": error,
        "recent": recent,
        "classroom": web.is_on(request.query_params, "classroom"),
        "nav": "train",
        "form_id": "train",
        "form": [dataclasses.replace(c, label=_(c.label), hint=c.hint and _(c.hint)) for c in form_controls(recipe)],
        "sae": sae,
        "architecture_of": {name: a for a, names in requests.SAE_ARCHITECTURE_SETTINGS.items() for name in names},
        "limits": requests.TrainRequest.model_json_schema()["properties"],
        "all_defaults": {r: svc.training.recipe_defaults(r) for r in RECIPES},
    }
    return web.render(
        request,
        "train.html",
        context,
        url=_canonical(request.query_params) if view else None,
        error=error,
        status=status,
    )
