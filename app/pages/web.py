"""What every HTML page shares: one Jinja environment, one htmx render helper, and page state from the URL.

- `templates`: the single Jinja2 environment (jinja2-fragments, so a page can render one named
  block for htmx) with its filters, and Jinja's i18n extension: `{% trans %}` blocks and `_()` in the
  templates answer in the request's language (app/http/language.py), and `link(url)` keeps a Malay
  page's links in Malay.
- `render`: the one answer to a page request. A plain GET gets the whole page; an htmx request
  (HX-Request) only the named block, with the canonical URL in HX-Push-Url. Both send
  `Vary: HX-Request`. A page whose settings cannot run says why in place of its figures, with
  status 422 (htmx is configured to swap 422s, templates/base.html), except for a history
  restore, which htmx only swaps below 400.
- Page state: the helpers that read a query string (`last`, `parse_bool`, `parse_number`,
  `parse_ablate`, `parse_knob`) and the explorer's state (`ExplorerState`, `parse_explorer`), which
  the Inspect pages share, with `explorer_query` (the shortest URL restoring it) and `inspect_links`.
  The toggles in it are the knobs of app/models/knobs.py: the state's fields, the URL's parameters,
  a model's defaults and the form's controls (`knob_fieldsets`) all follow that declaration.
- `shape`: an array's shape as NumPy prints it, for every page's tables and every snippet.

Routers use these; they never import each other (ARCHITECTURE.md).
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode

import numpy as np
import orjson
from fastapi import Request
from fastapi.responses import Response
from jinja2_fragments.fastapi import Jinja2Blocks
from markupsafe import Markup
from pydantic import ValidationError
from starlette.datastructures import ImmutableMultiDict

from app.http import language
from app.http.errors import readable
from app.http.language import N_, _
from app.paths import TEMPLATES_DIR
from app.service import InputError, Knobs, NotFound, Unavailable, knobs
from app.settings import Settings

if TYPE_CHECKING:
    from app.service import Model


# ------------------------------------------------------------------ the Jinja environment


def _packed(value):
    """orjson's fallback for what figure dicts hold besides JSON types: a 2-D array (a heatmap's z)
    as Plotly's typed-array spec, base64 of its float64 bytes (every bit of every number, a third
    of the characters of JSON, and decoded by the browser without parsing numbers); a uint8 array (a
    painted matrix's colour levels, app/pages/figures.py) the same way, as "u1"; any other array as a
    list (NaN as null); NumPy scalars as numbers. A float32 matrix (app/pages/figures.py, long inputs)
    goes as "f4", its own bytes. static/js/explorer-figures.js `unpack` reads them all."""
    if isinstance(value, np.ndarray):
        if value.dtype == np.uint8 or (value.ndim == 2 and value.dtype.kind == "f"):
            dtype = "u1" if value.dtype == np.uint8 else "f4" if value.dtype == np.float32 else "f8"
            data = np.ascontiguousarray(value, "<" + dtype).tobytes()
            return {"dtype": dtype, "bdata": base64.b64encode(data).decode(), "shape": ",".join(map(str, value.shape))}
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


# What an attribute value must not hold raw, as markupsafe escapes it.
_ATTRIBUTE_ESCAPES = (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ('"', "&#34;"), ("'", "&#39;"))


def figure_json(fig: dict) -> Markup:
    """A figure dict as JSON for a data- attribute, escaped for it.

    Heatmap matrices are packed (`_packed`); orjson writes NaN and ±inf as null, which is what a
    masked cell must be in JSON. Escaped here with str.replace, not autoescape: at 1,024 tokens a
    page holds ~20 MB of base64, which markupsafe's escape walks at a tenth of the speed."""
    text = orjson.dumps(fig, default=_packed).decode()
    for char, entity in _ATTRIBUTE_ESCAPES:
        if char in text:
            text = text.replace(char, entity)
    return Markup(text)


def language_switch(request: Request, here: str | None = None) -> list[dict]:
    """The header's BM / EN links: this page (`here`, its canonical URL, else the request's) in each
    language (static/js/language.js points them at the address bar's URL when htmx has moved it on)."""
    here = here or str(request.url.path) + ("?" + request.url.query if request.url.query else "")
    return [
        {
            "code": code,
            "label": code.replace("ms", "bm").upper(),
            "name": name,
            "url": language.switched(here, code),
            "current": code == language.current(),
        }
        for code, name in language.LANGUAGES.items()
    ]


templates = Jinja2Blocks(directory=str(TEMPLATES_DIR))
templates.env.filters["figure_json"] = figure_json
templates.env.add_extension("jinja2.ext.i18n")
# New-style gettext: `_("%(n)s tokens", n=...)` formats after translating, so a translation may move
# its placeholders; `{% trans %}` blocks are trimmed, so a message is one line whatever the template's wrapping.
templates.env.install_gettext_callables(  # type: ignore[attr-defined]  # the i18n extension adds it
    gettext=_, ngettext=language.ngettext, newstyle=True
)
templates.env.policies["ext.i18n.trimmed"] = True
templates.env.globals.update(language=language.current, link=language.localized, language_switch=language_switch)


def shape(array_or_dims) -> str:
    """A shape as NumPy prints it, (4,) (4, 8), so a page shows what `x.shape` shows and a snippet's
    code can hold it as a tuple: an array's own, or a sequence of sizes."""
    dims = tuple(array_or_dims.shape if hasattr(array_or_dims, "shape") else array_or_dims)
    return "(" + ", ".join(map(str, dims)) + ("," if len(dims) == 1 else "") + ")"


# ------------------------------------------------------------------ answering a page request


def is_fragment(request: Request) -> bool:
    """An htmx request for part of the page (a history restore wants the whole page)."""
    headers = request.headers
    return headers.get("hx-request") == "true" and headers.get("hx-history-restore-request") != "true"


def render(
    request: Request,
    template: str,
    context: dict[str, Any],
    *,
    block: str = "results",
    url: str | None = None,
    error: str | None = None,
    status: int = 422,
    compress: bool = True,
) -> Response:
    """The page, or for htmx its `block` with `url` pushed to the address bar; `status` (422) when `error`.
    compress=False asks the gzip middleware to leave the body as it is (Cache-Control: no-transform)."""
    history_restore = request.headers.get("hx-history-restore-request") == "true"
    context = context if url is None else {"here": url, **context}  # the header's language switch
    status = status if error and not history_restore else 200
    headers = {"Vary": "HX-Request"} | ({} if compress else {"Cache-Control": "no-transform"})
    if is_fragment(request):
        if url is not None:
            headers["HX-Push-Url"] = language.localized(url)
        return templates.TemplateResponse(
            request, template, context, block_name=block, status_code=status, headers=headers
        )
    return templates.TemplateResponse(request, template, context, status_code=status, headers=headers)


# What a page shows in place of its figures: its settings fail the request model's limits or the service
# refuses them (422), a run that does not exist (404), training that is off or full (503, 429).
# Anything else is a bug (500).
PAGE_ERRORS = (ValidationError, InputError, NotFound, Unavailable)


def error_status(exc: Exception) -> int:
    if isinstance(exc, NotFound):
        return 404
    return exc.status_code if isinstance(exc, Unavailable) else 422


def error_message(exc: Exception) -> str:
    """What a page shows for a request it cannot run: pydantic's errors worded as the API words them."""
    if isinstance(exc, ValidationError):
        return "; ".join(readable(e)["msg"] for e in exc.errors())
    return str(exc)


# ------------------------------------------------------------------ reading a query string

TRUE, FALSE = {"1", "true", "on", "yes"}, {"0", "false", "off", "no"}
# A page's query string (request.query_params): a parameter may repeat, and its last value counts.
QueryString = ImmutableMultiDict[str, Any]  # or a form's fields (the training page's: no files)


def last(query: QueryString, name: str) -> str | None:
    """The last value of a repeated parameter (a checkbox sends a hidden "0" then its "1"); "" is None."""
    values = query.getlist(name)
    value = values[-1] if values else None
    return None if value is None or value.strip() == "" else value.strip()


def is_on(query: QueryString, name: str) -> bool:
    """A checkbox-like flag: on when its last value is 1, true, on or yes."""
    return (last(query, name) or "0").lower() in TRUE


def parse_bool(name: str, value: str, errors: list[str]) -> bool | None:
    if value.lower() in TRUE:
        return True
    if value.lower() in FALSE:
        return False
    errors.append(_("{name}={value!r} is not on or off: use 1 or 0").format(name=name, value=value))
    return None


def parse_number(name: str, value: str, kind: type, errors: list[str]):
    try:
        number = kind(value)
    except ValueError:
        errors.append(
            (
                _("{name}={value!r} is not a whole number") if kind is int else _("{name}={value!r} is not a number")
            ).format(name=name, value=value)
        )
        return None
    if kind is float and not math.isfinite(number):
        errors.append(_("{name} must be a finite number, got {value!r}").format(name=name, value=value))
        return None
    return number


def parse_cell(value: str | None, errors: list[str]) -> tuple[int, int] | None:
    """ "QUERY,KEY" (token positions, from 0) -> (query, key); None when absent."""
    if value is None or value == "":
        return None
    query, comma, key = value.partition(",")
    if not (comma and query.strip().isdigit() and key.strip().isdigit()):
        errors.append(_("cell={value!r} is not QUERY,KEY (two token positions, e.g. cell=2,0)").format(value=value))
        return None
    return int(query), int(key)


def parse_ablate(values: list[str], errors: list[str]) -> tuple[tuple[int, int], ...]:
    """Ablated heads from `layer.head` values ("0.2" = layer 0, head 2), sorted, each once."""
    heads = set()
    for value in values:
        layer, dot, head = value.strip().partition(".")
        if not (dot and layer.isdigit() and head.isdigit()):
            errors.append(
                _("ablate={value!r} is not layer.head, e.g. ablate=0.2 for layer 0, head 2").format(value=value)
            )
            continue
        heads.add((int(layer), int(head)))
    return tuple(sorted(heads))


def parse_knob(knob: knobs.Knob, raw: str, errors: list[str], name: str | None = None):
    """A knob's value from the URL by its type (a switch: on or off; a number; a choice as it is, which
    the request model checks), or None with the reason in `errors`. `name`: the parameter's, if not the knob's."""
    name = name or knob.name
    if knob.type is bool:
        return parse_bool(name, raw, errors)
    if knob.type in (int, float):
        return parse_number(name, raw, knob.type, errors)
    return raw


def page_limits(settings: Settings) -> dict[str, object]:
    """The limits the explorer's and Inspect's text boxes show (max= attributes, help texts); each
    knob's own are in its control (knob_fieldsets)."""
    return {"explorer_max_tokens": settings.explorer_max_tokens, "explorer_max_chars": settings.max_text_chars}


@dataclass(frozen=True)
class KnobControl:
    """One knob as the explorer's form draws it (templates/explorer.html): a checkbox for a switch, a
    select for a choice, else a number input from its least to its greatest value."""

    name: str
    label: str
    hint: str | None
    kind: str  # "check" | "select" | "number" | "text"
    group: str
    low: int | float | None = None
    high: int | float | None = None
    step: str = "1"
    inputmode: str = "numeric"
    choices: tuple[str, ...] = ()


def knob_fieldsets(settings: Settings) -> list[dict]:
    """The form's fieldsets (app/models/knobs.py GROUPS), each with its knobs' controls in the form's order;
    a number's greatest value is these settings' limit."""

    def kind(k: knobs.Knob) -> str:
        return "check" if k.type is bool else "select" if k.choices else "number" if k.type in (int, float) else "text"

    controls = [
        KnobControl(
            k.name,
            _(k.label),
            k.hint and _(k.hint),
            kind(k),
            k.group,
            k.low,
            k.upper(settings),
            "0.1" if k.type is float else "1",
            "decimal" if k.type is float else "numeric",
            k.choices,
        )
        for k in knobs.on_form()
    ]
    return [
        {
            "group": group,
            "legend": _(legend),
            "hint": hint and _(hint),
            "controls": [c for c in controls if c.group == group],
        }
        for group, (legend, hint) in knobs.GROUPS.items()
    ]


# ------------------------------------------------------------------ the explorer's state

# The model the explorer opens on when the server's choice (settings.default_model: by default the
# trained induction model, whose default head shows what training made of random weights) cannot run.
FALLBACK_MODEL = "toy"


def default_model(models: Mapping[str, Model], preferred: str) -> str:
    return preferred if preferred in models and not models[preferred].error else FALLBACK_MODEL


@dataclass(frozen=True)
class ExplorerState(Knobs):
    """What the explorer's controls show: the URL's values, else the model's defaults. Its toggles are the
    run's knobs (app/models/knobs.py), each set: the URL's value, else the model's own."""

    model: str
    text: str
    layer: int = 0
    head: int = 0
    compare: bool = False
    classroom: bool = False
    ablate: tuple[tuple[int, int], ...] = ()  # (layer, head) of every ablated head, sorted
    ablate_method: str = "zero"  # "zero" | "mean", for every ablated head
    rollout: bool = False  # show attention rollout beside the pattern
    all_stages: bool = False  # long texts: the scores stages too, not only the weights (app/pages/explorer.py)
    cell: tuple[int, int] | None = None  # the open cell (query, key) of the head's stages (app/pages/explorer_cell.py)

    def ablate_request(self) -> list[dict]:
        """The ablated heads as a request's `ablate` list."""
        return [{"layer": layer, "head": head, "method": self.ablate_method} for layer, head in self.ablate]

    def __getitem__(self, name: str) -> Any:  # templates read controls[name]
        return getattr(self, name)


@dataclass
class Parsed:
    controls: ExplorerState
    # a knob's value is a bool, an int, a float or a str (app/models/knobs.py): Any, by name
    given: dict[str, Any]  # toggles the URL sets (not left to the model's default)
    defaults: dict[str, Any]  # the model's own values of the toggles
    errors: list[str] = field(default_factory=list)
    default_text: str = ""
    default_model: str = FALLBACK_MODEL
    default_head: tuple[int, int] = (0, 0)  # the model's own (layer, head) to open on

    def request(self, **fields) -> dict[str, object]:
        """The model request's fields for this state: the model, the text, the toggles set, ablations."""
        c = self.controls
        return {"model": c.model, "text": c.text, **self.given, "ablate": c.ablate_request(), **fields}


def model_defaults(model: Model) -> dict[str, Any]:
    """The model's own value of every knob, in the form's order."""
    return {k.name: k.default(model) for k in knobs.on_form()}


def parse_explorer(
    query: QueryString, models: Mapping[str, Model], *, preferred: str, model_changed: bool = False
) -> Parsed:
    """The explorer's state from its query string; `preferred` is the model it opens on (when this
    server runs it). With model_changed, the new model's defaults replace the toggles (they belong
    to the previous model)."""
    errors: list[str] = []
    default = default_model(models, preferred)
    name = last(query, "model") or default
    if name not in models:
        errors.append(_("unknown model {name!r}: choose one of {choices}").format(name=name, choices=", ".join(models)))
        name = default
    model = models[name]
    text = query.getlist("text")[-1] if query.getlist("text") else None
    if text is None or (model_changed and text in {m.default_text for m in models.values()}):
        text = model.default_text  # a default text follows the model; the learner's own text stays
    given: dict[str, Any] = {}
    if not model_changed:
        for knob in knobs.on_form():  # the URL lists them in the form's order (explorer_query)
            raw = last(query, knob.name)
            if raw is None:
                continue
            value = parse_knob(knob, raw, errors)
            if value is not None and knob.name in model.toggles:
                given[knob.name] = value
    picks = {}
    for key, start in zip(("layer", "head"), model.default_head):
        raw = None if model_changed else last(query, key)
        picks[key] = parse_number(key, raw, int, errors) if raw is not None else start
        if picks[key] is None or picks[key] < 0:
            picks[key] = 0
    ablate = () if model_changed else parse_ablate(query.getlist("ablate"), errors)
    method = last(query, "ablate_method") or "zero"
    if method not in ("zero", "mean"):
        errors.append(_("ablate_method={method!r} is not zero or mean").format(method=method))
        method = "zero"
    defaults = model_defaults(model)
    controls = ExplorerState(
        model=name,
        text=text,
        **(defaults | given),
        layer=picks["layer"],
        head=picks["head"],
        compare=last(query, "view") == "compare",
        classroom=is_on(query, "classroom"),
        ablate=ablate,
        ablate_method=method,
        rollout=is_on(query, "rollout"),
        all_stages=is_on(query, "stages"),
        cell=parse_cell(last(query, "cell"), errors),
    )
    return Parsed(controls, given, defaults, errors, model.default_text, default, model.default_head)


def explorer_query(parsed: Parsed, *, cell: bool = True) -> str:
    """The shortest URL that restores this view: only what differs from the model's defaults.
    cell=False: the view without its open cell (what the figures, and the values kept for them, depend on)."""
    c = parsed.controls
    params: dict[str, object] = {}
    if c.model != parsed.default_model:
        params["model"] = c.model
    if c.text != parsed.default_text:
        params["text"] = c.text
    for key, value in parsed.given.items():
        if value != parsed.defaults[key]:
            params[key] = int(value) if isinstance(value, bool) else value
    if (c.layer, c.head) != parsed.default_head:
        params["layer"], params["head"] = c.layer, c.head
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
    if c.all_stages:
        params["stages"] = 1
    if cell and c.cell is not None:
        params["cell"] = f"{c.cell[0]},{c.cell[1]}"
    return "/?" + urlencode(params, doseq=True) if params else "/"


# The Inspect views (/inspect?view=...), in the order of their tabs; the explorer links to each.
INSPECT_VIEWS = {
    "decompose": N_("Residual decomposition"),
    "lens": N_("Logit lens"),
    "detectors": N_("Head detectors"),
    "kvcache": N_("KV cache, stepped"),
    "compare": N_("Compare"),
}


def explorer_state(parsed: Parsed) -> list[tuple[str, str]]:
    """The explorer's canonical parameters (model, text, toggles, layer, head, ablations), minus its view."""
    query = explorer_query(parsed, cell=False).partition("?")[2]
    return [(k, v) for k, v in parse_qsl(query) if k != "view"]


def inspect_links(parsed: Parsed) -> list[dict]:
    """One link per Inspect view, carrying the explorer's current state (and a Malay page's language)."""
    state = explorer_state(parsed)
    return [
        {"key": key, "label": _(label), "url": language.localized("/inspect?" + urlencode([("view", key)] + state))}
        for key, label in INSPECT_VIEWS.items()
    ]
