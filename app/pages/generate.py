"""The writing page, /generate: choose a model, a text, a temperature, top-k and top-p, press Generate and
watch the text grow token by token; click a token for the distribution it was drawn from and where
every head looked when it was chosen.

The route reads the page's state from its URL (model, text, max_new_tokens, temperature, top_k, top_p,
repetition_penalty, seed, stop; and the token, layer and head shown), checks the model and text with the
API's request model (app/api/requests.py) and everything else with the service's own check (which
loads nothing), and renders the form and a results block holding the request as data. The page's
script (static/js/generate.js) then posts that request to POST /api/v1/generate asking for
Server-Sent Events and draws each step as it arrives; Stop aborts the stream, which stops the
server's generation too. Bad settings are said in place of the results, with status 422.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from app.api import requests
from app.deps import ServiceDep
from app.http.language import _
from app.pages import figures, web
from app.pages import steer as steer_page
from app.service import InputError, Model, Service
from app.service.generation import GenerateSettings
from app.service.spec import Steering

router = APIRouter(tags=["pages"], include_in_schema=False)

DEFAULT = GenerateSettings()
NUMBERS = {
    "max_new_tokens": int,
    "temperature": float,
    "top_k": int,
    "top_p": float,
    "seed": int,
    "repetition_penalty": float,
}
PICKS = ("step", "layer", "head")  # what is shown: the token (its step), and the layer and head of its strip
TOP_K_SLIDER = 100  # the top-k slider's greatest value (a model with fewer tokens: its d_vocab)
PACE_MS = 30  # tokens appear at most this often, so a fast model's text can be read as it grows


def script_words() -> dict[str, str]:
    """What static/js/generate.js (and steer-rows.js) write, in the page's language, {name} placeholders filled in."""
    return {
        "cannot": _("This cannot be written"),
        "writing": _("Writing…"),
        "writing_n": _("Writing… {n} of {max} tokens"),
        "unreachable": _("The server could not be reached. Is it still running?"),
        "answered": _("The server answered {status}."),
        "cut_off": _("The stream was cut off before the generation ended."),
        "reason_stop": _("it reached a stop"),
        "done_one": _("Done: {n} new token ({reason})."),
        "done": _("Done: {n} new tokens ({reason})."),
        "stopped_one": _("Stopped after {n} new token."),
        "stopped": _("Stopped after {n} new tokens."),
        "token_label": _("new token {i}: {token}, probability {p}"),
        "detail_title": _("How new token {i}, “{token}”, was chosen"),
        "greedy_how": _("Greedy (temperature 0): the most likely token, nothing drawn."),
        "drawn_how": _("Drawn with u = {u}: its probability after the settings was {p}."),
        "gave": _("The model gave it probability {p}."),
        "kept_one": _("The settings kept {n} token, holding {share} of the model's probability."),
        "kept": _("The settings kept {n} tokens, holding {share} of the model's probability."),
        "cache": _("KV cache: {bytes} bytes."),
        "rank": _("rank"),
        "token": _("token"),
        "the_model": _("the model"),
        "after": _("after {stage}"),
        "stage_repetition_penalty": _("repetition penalty"),
        "stage_temperature": _("temperature"),
        "stage_greedy": _("greedy"),
        "stage_model": _("the model"),
        "cutoff_one": _("cut-off: {n} token kept; below, cut by {stage}"),
        "cutoff": _("cut-off: {n} tokens kept; below, cut by {stage}"),
        "drawn": _("(drawn)"),
        "key_title": _("key {i}: {token} · weight {w}"),
        "strip_title": _("Where {head} looked when it chose “{token}”"),
        "parks": _("It parks {w} on the first token: a sink."),
        "readout": _("{head}: most weight on key {i} “{token}” ({w})."),
        "head_label": _("{head}, weight on the first token {w}"),
        "head_sink": _("{head}, weight on the first token {w}, an attention sink"),
        "sink": _("sink"),
        "sinks": _("Attention sinks (over {t} of their weight on the first token): {heads}."),
        "no_sinks": _("No head puts over {t} of its weight on the first token here."),
        "off": _("off"),
        # the steer editor's rows (static/js/steer-rows.js)
        "steer_legend": _("Steer {n}"),
        "steer_remove": _("Remove steer {n}"),
        "steer_added": _("Steer {n} added"),
        "steer_removed": _("Steer {n} removed"),
    }


@dataclass
class GenerateState:
    """What the page's controls show: the URL's values, else the defaults (the API's)."""

    model: str
    text: str
    settings: GenerateSettings
    step: int | None = None
    layer: int = 0
    head: int = 0
    steer: steer_page.SteerState = field(default_factory=steer_page.SteerState)


# The model the page opens on: one trained here on natural text (Python's documentation, with the repeated
# passages that grow an induction head), so a first generation reads as words and a clicked token's
# attention shows a head copying; the explorer's model (settings.default_model, the induction model trained
# on random letters) would write random letters. Where this server cannot run it: the server's choice.
WRITING_MODEL = "python-docs-induction"


def opening_model(models: Mapping[str, Model], preferred: str) -> str:
    """WRITING_MODEL, else the server's default model, else the toy: the first this server can write with."""
    for name in (WRITING_MODEL, preferred):
        if name in models and not models[name].error and not models[name].is_encoder:
            return name
    return web.FALLBACK_MODEL


def parse(query, models: Mapping[str, Model], preferred: str, errors: list[str], limit: int = 8) -> GenerateState:
    """The page's state from its URL; `limit`: the server's steers in one request."""
    name = web.last(query, "model") or opening_model(models, preferred)
    if name not in models:
        errors.append(_("unknown model {name!r}: choose one of {choices}").format(name=name, choices=", ".join(models)))
        name = opening_model(models, preferred)
    texts = query.getlist("text")
    text = texts[-1] if texts else models[name].default_text
    given = {}
    for key, kind in NUMBERS.items():
        raw = web.last(query, key)
        if raw is not None:
            given[key] = web.parse_number(key, raw, kind, errors)
    given = {k: v for k, v in given.items() if v is not None}
    stop = query.getlist("stop")[-1] if query.getlist("stop") else None
    settings = GenerateSettings(**(asdict(DEFAULT) | given | {"stop": stop or None}))
    picks = {}
    for key in PICKS:
        raw = web.last(query, key)
        value = web.parse_number(key, raw, int, errors) if raw is not None else None
        picks[key] = max(value, 0) if value is not None else None
    return GenerateState(
        name,
        text,
        settings,
        picks["step"],
        picks["layer"] or 0,
        picks["head"] or 0,
        steer_page.parse(query, errors, limit),
    )


def canonical(state: GenerateState, default_model: str, default_text: str) -> str:
    """The shortest URL restoring this page: what differs from the defaults."""
    params: dict[str, object] = {}
    if state.model != default_model:
        params["model"] = state.model
    if state.text != default_text:
        params["text"] = state.text
    for key, value in asdict(state.settings).items():
        if value != getattr(DEFAULT, key):
            params[key] = value
    for key in PICKS:
        value = getattr(state, key)
        if value not in (None, 0):
            params[key] = value
    params |= state.steer.params()
    return "/generate?" + urlencode(params) if params else "/generate"


def api_body(state: GenerateState) -> dict:
    """The POST /api/v1/generate body this page's script sends."""
    return {"model": state.model, "text": state.text} | {
        k: v for k, v in asdict(state.settings).items() if v is not None
    }


def controls(svc: Service, model: Model, state: GenerateState, room: int | None) -> dict:
    """The sliders' and inputs' bounds for this model (and text: `room` tokens left in its context)."""
    s = state.settings
    cfg = model.cfg
    limit = max(1, min(svc.settings.generate_max_new_tokens, cfg.n_ctx if room is None else room))
    return {
        "max_new_tokens": limit,
        "top_k_max": max(min(cfg.d_vocab, TOP_K_SLIDER), s.top_k or 1),
        "temperature_max": max(2.0, s.temperature),
        "n_ctx": cfg.n_ctx,
    }


@router.get("/generate", response_class=HTMLResponse, summary="Write with a model")
def generate_page(request: Request, svc: ServiceDep) -> Response:
    query = request.query_params
    models = svc.views.models()
    errors: list[str] = []
    preferred = svc.settings.default_model
    state = parse(query, models, preferred, errors, svc.settings.max_steers)
    model = models[state.model]
    error, body = "; ".join(errors) or None, None
    room, steered = None, None
    if error is None:
        try:
            spec = requests.ModelRequest.model_validate({"model": state.model, "text": state.text}).spec()
            room = svc.generation.room(spec)
            if web.last(query, "max_new_tokens") is None:  # the default, as far as the context allows
                state.settings = replace(state.settings, max_new_tokens=max(1, min(DEFAULT.max_new_tokens, room)))
            svc.generation.check(spec, state.settings)  # everything the API would refuse, nothing loaded
            body = api_body(state)
            if state.steer.active:  # three continuations, one seed; the stream shows the steered one

                def check(steering: Steering) -> None:
                    svc.generation.check(spec.replace(steering=steering), state.settings)

                checked = steer_page.steer_specs(svc, spec, state.steer, check)
                if checked is None:  # a steer that cannot be used: said under its row, and in the panel
                    raise InputError("; ".join(state.steer.errors))
                steered = steer_page.side_by_side(svc, spec, state.settings, *checked)
                body |= {"steer": steered["steers"]}
                explorer = {"model": state.model, "text": state.text} | state.steer.params()
                steered["explorer_url"] = "/?" + urlencode(explorer)
        except web.PAGE_ERRORS as exc:  # nothing to stream: the panel says why
            error, body, steered = web.error_message(exc), None, None
    writers = [m for m in models.values() if not m.is_encoder]
    context = {
        "state": state,
        "settings": state.settings,
        "model": model,
        "models": writers,
        "encoders": [m.name for m in models.values() if m.is_encoder],
        "error": error,
        "request_json": json.dumps(body) if body else None,
        "limits": controls(svc, model, state, room),
        "picks": {"step": state.step, "layer": state.layer, "head": state.head},
        "pace_ms": PACE_MS,
        "nav": "generate",
        "form_id": "generate",
        "classroom": web.is_on(query, "classroom"),
        "max_text_chars": svc.settings.max_text_chars,
        "words": script_words(),
        "token_symbols": {"whitespace": figures.VISIBLE_WHITESPACE, "empty": figures.EMPTY_TOKEN},
        "steer_editor": steer_page.editor(svc, model, state.steer),
        "steered": steered,
        "steer_errors": {i: row.errors for i, row in enumerate(state.steer.rows) if row.errors},
    }
    url = canonical(state, opening_model(models, preferred), models[state.model].default_text)
    return web.render(request, "generate.html", context, url=url, error=error)
