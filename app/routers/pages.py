"""HTML pages: the explorer at `/`.

The page computes nothing itself: it parses the query string into the API's own RunRequest
(app/schemas.py, same limits), calls the service layer (app/service.py) exactly as the JSON API
does, and turns the arrays into Plotly figure dicts (app/figures.py).

A plain GET answers the full page; an htmx request (HX-Request) answers only the block that
changed (jinja2-fragments): "results" on every change, "explorer" (controls too) when the model
changes. Bad settings render their message in place of the figures, with status 422.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlencode

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from jinja2_fragments.fastapi import Jinja2Blocks
from pydantic import ValidationError

from core import POSITION_SCHEMES, hook_names, hook_shape

from .. import figures, registry, schemas, service
from ..paths import TEMPLATES_DIR
from ..settings import get_settings

router = APIRouter(tags=["pages"], include_in_schema=False)

templates = Jinja2Blocks(directory=str(TEMPLATES_DIR))


def figure_json(fig: dict) -> str:
    """A figure dict as JSON for a data- attribute (autoescape then escapes the quotes).

    orjson writes NaN and ±inf as null, which is what a masked cell must be in JSON."""
    return orjson.dumps(fig, option=orjson.OPT_SERIALIZE_NUMPY).decode()


templates.env.filters["figure_json"] = figure_json

DEFAULT_MODEL = "toy"
TOP_K = 10  # next-token bars shown
SIZE_FIELDS = ("n_heads", "d_model", "n_layers", "seed")
TOGGLE_FIELDS = ("causal", "scale", "temperature", "positional_embedding_type") + SIZE_FIELDS
_TRUE, _FALSE = {"1", "true", "on", "yes"}, {"0", "false", "off", "no"}


# ------------------------------------------------------------------ the page's state, from the URL

@dataclass
class Controls:
    """What the controls show: the URL's values, else the model's defaults."""

    model: str
    text: str
    causal: bool
    scale: bool
    temperature: float
    positional_embedding_type: str
    n_heads: int
    d_model: int
    n_layers: int
    seed: int
    layer: int = 0
    head: int = 0
    compare: bool = False
    classroom: bool = False
    ablate: tuple[tuple[int, int], ...] = ()  # (layer, head) of every ablated head, sorted
    ablate_method: str = "zero"  # "zero" | "mean", for every ablated head
    rollout: bool = False  # show attention rollout beside the pattern

    def ablate_request(self) -> list[dict]:
        """The ablated heads as the run request's `ablate` list."""
        return [{"layer": layer, "head": head, "method": self.ablate_method} for layer, head in self.ablate]

    def __getitem__(self, name: str):  # templates read controls[name]
        return getattr(self, name)


@dataclass
class Parsed:
    controls: Controls
    given: dict[str, object]  # toggles the URL sets (not left to the model's default)
    errors: list[str] = field(default_factory=list)


def _last(query: Mapping, name: str) -> str | None:
    """The last value of a repeated parameter (a checkbox sends a hidden "0" then its "1"); "" is None."""
    values = query.getlist(name)
    value = values[-1] if values else None
    return None if value is None or value.strip() == "" else value.strip()


def _parse_bool(name: str, value: str, errors: list[str]) -> bool | None:
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    errors.append(f"{name}={value!r} is not on or off: use 1 or 0")
    return None


def _parse_number(name: str, value: str, kind: type, errors: list[str]):
    try:
        number = kind(value)
    except ValueError:
        errors.append(f"{name}={value!r} is not {'a whole number' if kind is int else 'a number'}")
        return None
    if kind is float and not math.isfinite(number):
        errors.append(f"{name} must be a finite number, got {value!r}")
        return None
    return number


def _model_defaults(model: registry.Model) -> dict[str, object]:
    cfg = model.cfg
    return {"causal": cfg.causal, "scale": cfg.use_attn_scale, "temperature": cfg.attn_temperature,
            "positional_embedding_type": cfg.positional_embedding_type, "n_heads": cfg.n_heads,
            "d_model": cfg.d_model, "n_layers": cfg.n_layers, "seed": model.default_seed}


def parse(query: Mapping, *, model_changed: bool = False) -> Parsed:
    """The explorer's state from its query string. With model_changed, the new model's defaults
    replace the toggles (they belong to the previous model)."""
    errors: list[str] = []
    name = _last(query, "model") or DEFAULT_MODEL
    known = registry.models()
    if name not in known:
        errors.append(f"unknown model {name!r}: choose one of {', '.join(known)}")
        name = DEFAULT_MODEL
    model = known[name]
    text = query.getlist("text")[-1] if query.getlist("text") else None
    if text is None or (model_changed and text in {m.default_text for m in known.values()}):
        text = model.default_text  # a default text follows the model; the learner's own text stays
    given: dict[str, object] = {}
    if not model_changed:
        for key in TOGGLE_FIELDS:
            raw = _last(query, key)
            if raw is None:
                continue
            if key in ("causal", "scale"):
                value = _parse_bool(key, raw, errors)
            elif key == "temperature":
                value = _parse_number(key, raw, float, errors)
            elif key == "positional_embedding_type":
                value = raw
            else:
                value = _parse_number(key, raw, int, errors)
            if value is not None and key in model.toggles:
                given[key] = value
    picks = {}
    for key in ("layer", "head"):
        raw = None if model_changed else _last(query, key)
        picks[key] = _parse_number(key, raw, int, errors) if raw is not None else 0
        if picks[key] is None or picks[key] < 0:
            picks[key] = 0
    ablate = () if model_changed else _parse_ablate(query.getlist("ablate"), errors)
    method = _last(query, "ablate_method") or "zero"
    if method not in ("zero", "mean"):
        errors.append(f"ablate_method={method!r} is not zero or mean")
        method = "zero"
    controls = Controls(model=name, text=text, **(_model_defaults(model) | given), layer=picks["layer"],
                        head=picks["head"], compare=_last(query, "view") == "compare",
                        classroom=(_last(query, "classroom") or "0").lower() in _TRUE,
                        ablate=ablate, ablate_method=method,
                        rollout=(_last(query, "rollout") or "0").lower() in _TRUE)
    return Parsed(controls, given, errors)


def _parse_ablate(values: list[str], errors: list[str]) -> tuple[tuple[int, int], ...]:
    """Ablated heads from repeated `ablate=layer.head` parameters ("0.2" = layer 0, head 2)."""
    heads = set()
    for value in values:
        layer, dot, head = value.strip().partition(".")
        if not (dot and layer.isdigit() and head.isdigit()):
            errors.append(f"ablate={value!r} is not layer.head, e.g. ablate=0.2 for layer 0, head 2")
            continue
        heads.add((int(layer), int(head)))
    return tuple(sorted(heads))


def canonical_query(parsed: Parsed) -> str:
    """The shortest URL that restores this view: only what differs from the model's defaults."""
    c = parsed.controls
    model = registry.models()[c.model]
    defaults = _model_defaults(model)
    params: dict[str, object] = {}
    if c.model != DEFAULT_MODEL:
        params["model"] = c.model
    if c.text != model.default_text:
        params["text"] = c.text
    for key, value in parsed.given.items():
        if value != defaults[key]:
            params[key] = int(value) if isinstance(value, bool) else value
    if c.layer:
        params["layer"] = c.layer
    if c.head:
        params["head"] = c.head
    if c.compare:
        params["view"] = "compare"
    if c.classroom:
        params["classroom"] = 1
    if c.ablate:
        params["ablate"] = [f"{layer}.{head}" for layer, head in c.ablate]
        if c.ablate_method != "zero":
            params["ablate_method"] = c.ablate_method
    if c.rollout:
        params["rollout"] = 1
    return "/?" + urlencode(params, doseq=True) if params else "/"


# ------------------------------------------------------------------ computing the view (service layer)

def _run_request(c: Controls, given: dict, hooks: list[str], top_k: int, **override) -> schemas.RunRequest:
    fields = {k: v for k, v in given.items()} | {"ablate": c.ablate_request()} | override
    return schemas.RunRequest(model=c.model, text=c.text, hooks=hooks, top_k=top_k, **fields)


def _config_line(r: service.RunResult) -> str:
    cfg = r.cfg
    divisor = (f"√{cfg.d_head}" if cfg.use_attn_scale else "1") + (
        f" × {cfg.attn_temperature:g}" if cfg.attn_temperature != 1 else "")
    return (f"{r.model}: {len(r.tokens)} tokens · d_model {cfg.d_model} · {cfg.n_heads} heads × d_head "
            f"{cfg.d_head} · {cfg.n_layers} layer{'s' if cfg.n_layers != 1 else ''} · d_mlp {cfg.d_mlp} · "
            f"{cfg.positional_embedding_type} positions · {'causal' if cfg.causal else 'bidirectional'} · "
            f"scores ÷ {divisor} · seed {r.seed}")


def _shape(dims) -> str:
    dims = list(dims)
    return "(" + ", ".join(map(str, dims)) + ("," if len(dims) == 1 else "") + ")"


def _shape_rows(r: service.RunResult, is_encoder: bool) -> list[dict]:
    """Every activation of this run in forward order, with its axes and its shape as NumPy prints it."""
    cfg, n = r.cfg, len(r.tokens)
    rows = [{"name": "tokens", "axes": "[pos]", "shape": _shape([n]), "layer_start": False}]
    for name in hook_names(cfg):
        rows.append({"name": name, "axes": hook_shape(name),
                     "shape": _shape(service.hook_dims(name, cfg, n)),
                     "layer_start": name.endswith("hook_resid_pre")})
    if not is_encoder:
        rows.append({"name": "logits", "axes": "[pos, d_vocab]", "shape": _shape([n, cfg.d_vocab]),
                     "layer_start": True})
    return rows


def _stage_figures(st: service.AttentionStages, tokens: list[str], r: service.RunResult, where: str) -> list[dict]:
    cfg = r.cfg
    top = figures.score_range(st.raw, st.scaled, st.masked)  # one colour range, so scaling shows
    divisor = ("√d_head = √" + f"{cfg.d_head} = {math.sqrt(cfg.d_head):.3g}") if cfg.use_attn_scale else "1 (scaling is off)"
    if cfg.attn_temperature != 1:
        divisor += f", then ÷ the temperature {cfg.attn_temperature:g}"
    mask_caption = ("The causal mask sets every key after the query to −∞ (hatched): a token cannot see the "
                    "future." if cfg.causal else
                    "No mask: every token may look at every token. Turn on the causal mask to hide the future.")
    specs = [
        ("raw", "1 · Raw scores  Q Kᵀ", st.raw, "scores", None,
         "How well each query matches each key: a dot product. Orange is positive, purple negative."),
        ("scaled", "2 · Scaled", st.scaled, "scores", None, f"Every score divided by {divisor}, "
         "so the softmax does not saturate as d_head grows. Same colour range as stage 1."),
        ("masked", "3 · Masked", st.masked, "scores", st.mask, mask_caption),
        ("weights", "4 · Softmax weights", st.weights, "weights", st.mask,
         "Each row exponentiated and normalised: weights are ≥ 0 and each row sums to 1."),
    ]
    out = []
    for key, title, matrix, kind, mask, caption in specs:
        fig = figures.attention_heatmap(matrix, tokens, kind=kind, mask=mask,
                                        zmax=top if kind == "scores" else None,
                                        export_name=f"{where}-{key}")
        out.append({"key": key, "title": title, "figure": fig, "caption": caption})
    return out


def _check_view_size(req: schemas.RunRequest, hooks: list[str], *, rollout: bool) -> None:
    """Refuse, before running, a view too big to draw, naming what the page's controls can reduce
    (the run's own limit would say "ask for fewer hooks", which a learner on this page cannot do)."""
    s = get_settings()
    st = service.setup(req)  # tokenises and configures only: cheap
    if st.n > s.explorer_max_tokens:
        raise ValueError(f"the text has {st.n} tokens; the explorer draws up to {s.explorer_max_tokens} "
                         f"(the API at /api/v1/run takes up to {s.max_tokens}): shorten the text")
    values = sum(math.prod(service.hook_dims(h, st.cfg, st.n)) for h in hooks)
    if values > s.max_hook_values:
        fewer = "fewer layers, a smaller d_model" + (", fewer heads or no attention rollout" if rollout else "")
        raise ValueError(f"this view would draw {values:,} numbers ({st.n} tokens, {st.cfg.n_layers} layers), "
                         f"more than this server's limit of {s.max_hook_values:,}: use a shorter text, {fewer}")


def build_view(c: Controls, given: dict) -> dict:
    """Run the model through the service layer and build every figure of the explorer."""
    model = registry.get(c.model)
    n_layers = given.get("n_layers", model.cfg.n_layers)
    positions = given.get("positional_embedding_type", model.cfg.positional_embedding_type)
    cfg_names = model.cfg.replace(n_layers=n_layers, positional_embedding_type=positions) \
        if (n_layers, positions) != (model.cfg.n_layers, model.cfg.positional_embedding_type) else model.cfg
    layer = min(c.layer, n_layers - 1)
    n_heads = given.get("n_heads", model.cfg.n_heads)
    # heads that no longer exist (fewer layers or heads now) are dropped, as layer and head are clamped
    c.ablate = tuple((l, h) for l, h in c.ablate if l < n_layers and h < n_heads)
    hooks = service.residual_hooks(cfg_names) + service.stage_hooks(cfg_names, layer)
    if c.rollout:
        hooks += [h for h in service.pattern_hooks(cfg_names) if h not in hooks]
    req = _run_request(c, given, hooks, 0 if model.is_encoder else TOP_K)
    _check_view_size(req, hooks, rollout=c.rollout)
    r = service.run(req)
    head = min(c.head, r.cfg.n_heads - 1)
    c.layer, c.head = layer, head  # what is shown is what the URL will say
    where = f"layer{layer}-head{head}"
    stages = service.attention_stages(r, layer, head)
    pattern = r.hooks[f"blocks.{layer}.attn.hook_pattern"]  # [head_index, query_pos, key_pos]
    head_figures = [figures.attention_heatmap(pattern[h], r.tokens, kind="weights", mask=stages.mask,
                                              small=True, export_name=f"layer{layer}-head{h}-weights")
                    for h in range(r.cfg.n_heads)]
    compare = None
    if c.compare and "causal" in model.toggles:
        other = service.run(_run_request(c, given, service.stage_hooks(cfg_names, layer), 0,
                                         causal=not r.cfg.causal))
        other_st = service.attention_stages(other, layer, head)
        pair = sorted([(r.cfg.causal, stages), (other.cfg.causal, other_st)], key=lambda p: not p[0])
        compare = [{"key": "causal" if is_causal else "bidirectional",
                    "title": "With the causal mask" if is_causal else "Without the mask (bidirectional)",
                    "caption": ("Each token mixes only itself and earlier tokens; rows are renormalised."
                                if is_causal else "Each token mixes every token, later ones included."),
                    "figure": figures.attention_heatmap(st.weights, r.tokens, kind="weights",
                                                        mask=st.mask if is_causal else None,
                                                        export_name=f"{where}-weights-"
                                                        f"{'causal' if is_causal else 'bidirectional'}")}
                   for is_causal, st in pair]
    norms = service.residual_norms(r)
    next_figure = None
    if r.ablation is not None and r.ablation.changes:
        changes = r.ablation.changes
        next_figure = figures.probability_change_bars([t.token for t in changes], [t.baseline_prob for t in changes],
                                                      [t.prob for t in changes])
    elif r.top_k:
        next_figure = figures.probability_bars([t.token for t in r.top_k], [t.prob for t in r.top_k])
    rollout = None
    if c.rollout:
        rollout = figures.attention_heatmap(service.rollout_of(r.hooks, r.cfg)[layer], r.tokens, kind="weights",
                                            value_name="rollout", export_name=f"rollout-through-layer{layer}")
    return {
        "ablated": set(c.ablate), "ablation": r.ablation, "rollout_figure": rollout,
        "model_name": r.model, "tokens": r.tokens, "token_labels": [figures.visible(t) for t in r.tokens],
        "config_line": _config_line(r), "layer": layer, "head": head, "n_layers": r.cfg.n_layers,
        "head_figures": head_figures, "stages": _stage_figures(stages, r.tokens, r, where),
        "compare": compare,
        "residual_figure": figures.stage_heatmap(norms.stream, r.tokens, [_short(n) for n in norms.stream_names],
                                                 value_name="‖x‖", export_name="residual-stream-norms"),
        "writes_figure": figures.stage_heatmap(norms.writes, r.tokens, norms.writes_names,
                                               value_name="‖added‖", export_name="sublayer-output-norms"),
        "next_figure": next_figure, "shapes": _shape_rows(r, model.is_encoder),
    }


def _short(stage: str) -> str:
    """"1 resid_mid" -> "1 mid": the stream's columns stay legible for deep models."""
    return stage.replace("resid_", "")


def _validation_messages(exc: ValidationError) -> list[str]:
    out = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()))
        out.append(f"{loc}: {err.get('msg')}" if loc else str(err.get("msg")))
    return out


# ------------------------------------------------------------------ the route

def _limits() -> dict[str, object]:
    s = get_settings()
    temperature = schemas.RunRequest.model_fields["temperature"].metadata
    bounds = {type(m).__name__: getattr(m, type(m).__name__.lower(), None) for m in temperature}
    return {"explorer_max_tokens": s.explorer_max_tokens, "explorer_max_chars": s.max_text_chars,
            "min_temperature": bounds.get("Gt", 0), "max_temperature": bounds.get("Le"),
            "n_heads": s.max_heads, "d_model": s.max_d_model, "n_layers": s.max_layers, "seed": schemas.MAX_SEED}


def _inspect_links(parsed: Parsed) -> list[dict]:
    from .inspect import links  # the Inspect pages build on this module's parse()

    return links(parsed)


@router.get("/", response_class=HTMLResponse, summary="The explorer")
def explorer(request: Request) -> HTMLResponse:
    headers = request.headers
    history_restore = headers.get("hx-history-restore-request") == "true"
    fragment = headers.get("hx-request") == "true" and not history_restore
    model_changed = fragment and headers.get("hx-trigger-name") == "model"
    parsed = parse(request.query_params, model_changed=model_changed)
    c = parsed.controls
    error = "; ".join(parsed.errors) or None
    view = None
    if error is None:
        try:
            view = build_view(c, parsed.given)
        except ValidationError as exc:
            error = "; ".join(_validation_messages(exc))
        except (ValueError, TypeError) as exc:
            error = str(exc)
    model = registry.get(c.model)
    limits = _limits()
    context = {
        "controls": c, "view": view, "error": error, "models": list(registry.models().values()),
        "model_description": model.description, "accepted": set(model.toggles),
        "text_hint": ("the model reads it one character at a time" if model.kind == "toy"
                      else "split into tokens by the model's own tokeniser"),
        "position_schemes": POSITION_SCHEMES, "limits": limits, "classroom": c.classroom,
        "size_fields": [(name, label, limits[name]) for name, label in
                        (("n_heads", "Heads"), ("d_model", "Width d_model"), ("n_layers", "Layers"),
                         ("seed", "Seed"))],
        "nav": "explorer", "form_id": "explorer",
        "inspect_links": _inspect_links(parsed),
    }
    # htmx only swaps a history restore that answers < 400, so the full page keeps 200 there.
    status = 422 if error and not history_restore else 200
    response_headers = {"Vary": "HX-Request"}
    if fragment:
        response_headers["HX-Push-Url"] = canonical_query(parsed)
        block = "explorer" if model_changed else "results"
        return templates.TemplateResponse(request, "explorer.html", context, block_name=block,
                                          status_code=status, headers=response_headers)
    return templates.TemplateResponse(request, "explorer.html", context, status_code=status,
                                      headers=response_headers)
