"""HTML pages: one live lesson per section of the spec (/lessons/...) and the calculator (/params).

Like the explorer, a page computes nothing itself. Its query string is parsed by the API's own
request models (app/api/requests.py: same names, defaults and limits, so every page state is also an
API call), the numbers come from the service layer (app/service/), the figures from
app/pages/figures.py, and the NumPy snippet of the current view from app/pages/snippets.py.

A plain GET answers the full page; an htmx request answers only the "results" block with the
canonical URL in HX-Push-Url. Bad settings render the API's message in place of the figures,
with status 422, and the controls keep the learner's values so they can fix them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar, get_args
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, PlainTextResponse, Response
from pydantic import BaseModel, Field, field_validator

from app.api import requests
from app.deps import ServiceDep
from app.http.language import N_, _, ngettext
from app.pages import attribution_lesson, explorer_cell, figures, snippets, web
from app.pages.numbers import cells, fixed, full, human_bytes
from app.service import Service, calculators
from app.service.calculators import SPEC_FORMULA_PRESETS

router = APIRouter(tags=["pages"], include_in_schema=False)

PAGE_ONLY = ("classroom", "lang")  # in the URL, but not a field of the API request


# ------------------------------------------------------------------ the pages' own request models


class CausalQuery(requests.AttentionQuery):
    """The attention lesson with the mask always on: the page shows it beside the unmasked weights."""

    causal: Literal[True] = Field(True, description="always on in this lesson")


class ParamsLessonQuery(requests.SizesQuery):
    """The spec's formula counts GPT-2-style models, so the lesson starts from GPT-2 small, offers the
    presets the formula counts exactly, and the unembedding is always tied (the calculator at /params
    counts untied models and the other families too)."""

    preset: Literal[SPEC_FORMULA_PRESETS] = Field(  # type: ignore[valid-type]
        "gpt2-small",
        description="start from this configuration (the calculator at /params has the other families' presets)",
    )

    @field_validator("tied_embeddings")
    @classmethod
    def _tied(cls, v: bool | None) -> bool | None:
        if v is False:
            raise ValueError(
                _("the spec's formula assumes a tied unembedding: count untied models in the calculator at /params")
            )
        return v


class CalculatorQuery(requests.ParamsQuery, requests.KVCacheQuery):
    """Both calculators' fields: the parameter count and the KV cache of one configuration. The page
    opens on GPT-2 small, the model the spec counts to the last digit."""

    preset: requests.PresetName = Field("gpt2-small", description="start from this configuration")


# ------------------------------------------------------------------ the lessons, one view builder each


def view_attention(svc: Service, q: requests.AttentionQuery) -> dict:
    svc.limits.check_drawable(len(q.text.split()))
    r = svc.lessons.attention(q.text, q.seed, q.d_model, q.d_k, q.causal, q.scale)
    a = r.lesson
    tokens = a.tokens
    scores = a.result.scores  # [query_pos, key_pos], scaled and masked
    top = figures.score_range(scores)
    return {
        "tokens": tokens,
        "shapes": {"Q": web.shape(a.Q), "K": web.shape(a.K), "V": web.shape(a.V), "output": web.shape(a.result.output)},
        "weights": [
            {"token": t, "cells": cells(row, masked=m), "sum": fixed(float(row.sum()), 2)}
            for t, row, m in zip(tokens, a.result.weights, a.mask)
        ],
        "last_token": tokens[-1],
        "last_scores": cells(r.scaled_scores[-1]),
        "divisor": r.divisor,
        "figures": [
            {
                "id": "scores",
                "title": _("Scores  Q Kᵀ / √d_k") if q.scale else _("Scores  Q Kᵀ (not scaled)"),
                "caption": _(
                    "How well each query (row) matches each key (column). Orange is positive, purple negative."
                )
                + (" " + _("Hatched cells are masked: the key comes after the query.") if q.causal else ""),
                "figure": figures.attention_heatmap(
                    scores,
                    tokens,
                    kind="scores",
                    mask=a.mask if q.causal else None,
                    zmax=top,
                    export_name="attention-scores",
                ),
            },
            {
                "id": "weights",
                "title": _("Weights  softmax(scores)"),
                "caption": _("Each row is a probability distribution over the keys: it sums to 1."),
                "figure": figures.attention_heatmap(
                    a.result.weights,
                    tokens,
                    kind="weights",
                    mask=a.mask if q.causal else None,
                    export_name="attention-weights",
                ),
            },
        ],
        "snippet": snippets.attention(q.text, q.seed, q.d_model, q.d_k, q.causal, q.scale),
        "cell": explorer_cell.lesson_context(r.cell(), tokens),  # the last token's row at its largest weight
    }


def view_scaling(svc: Service, q: requests.ScalingQuery) -> dict:
    rows = svc.lessons.scaling(q.dim_list, q.n_queries, q.n_keys, q.seed)
    dims = [r.d for r in rows]
    return {
        "rows": [
            {
                "d": r.d,
                "std": fixed(r.std, 1),
                "std_full": full(r.std),
                "sqrt_d": fixed(r.sqrt_d, 1),
                "unscaled": fixed(r.top_weight_unscaled, 2),
                "unscaled_full": full(r.top_weight_unscaled),
                "scaled": fixed(r.top_weight_scaled, 2),
                "scaled_full": full(r.top_weight_scaled),
            }
            for r in rows
        ],
        "uniform": fixed(1 / q.n_keys, 3),
        "n_keys": q.n_keys,
        "n_queries": q.n_queries,
        "figures": [
            {
                "id": "top-weight",
                "title": _("Average top weight vs width d"),
                "caption": _(
                    "The largest of {n_keys} softmax weights, averaged over {n_queries:,} random queries. "
                    "Unscaled, it climbs towards 1 (a one-hot spike); scaled by 1/√d it stays put."
                ).format(n_keys=q.n_keys, n_queries=q.n_queries),
                "figure": figures.line_chart(
                    [
                        (_("unscaled: softmax(q·k)"), dims, [r.top_weight_unscaled for r in rows]),
                        (_("scaled: softmax(q·k / √d)"), dims, [r.top_weight_scaled for r in rows]),
                        (_("uniform: 1/{n_keys}").format(n_keys=q.n_keys), dims, [1 / q.n_keys] * len(dims)),
                    ],
                    x_title=_("d (width of q and k)"),
                    y_title=_("average top weight"),
                    export_name="top-weight-vs-d",
                    x_log=len(dims) > 1 and max(dims) / min(dims) > 8,
                    y_range=[0, 1.05],
                    y_hover=".3f",
                    x_tickvals=dims,
                ),
            },
            {
                "id": "std",
                "title": _("Spread of the raw scores vs width d"),
                "caption": _(
                    "The standard deviation of q·k grows like √d, which is exactly what dividing by √d undoes."
                ),
                "figure": figures.line_chart(
                    [(_("std of q·k"), dims, [r.std for r in rows]), ("√d", dims, [r.sqrt_d for r in rows])],
                    x_title=_("d (width of q and k)"),
                    y_title=_("standard deviation"),
                    export_name="std-vs-d",
                    x_log=len(dims) > 1 and max(dims) / min(dims) > 8,
                    y_hover=".2f",
                    x_tickvals=dims,
                ),
            },
        ],
        "snippet": snippets.scaling(q.dim_list, q.n_queries, q.n_keys, q.seed),
    }


def view_causal(svc: Service, q: CausalQuery) -> dict:
    svc.limits.check_drawable(len(q.text.split()))
    r = svc.lessons.causal(q.text, q.seed, q.d_model, q.d_k, q.scale)
    masked, free = r.masked, r.free
    tokens = masked.tokens
    return {
        "tokens": tokens,
        "mask": [{"token": t, "cells": [int(c) for c in row]} for t, row in zip(tokens, masked.mask)],
        "weights": [
            {"token": t, "cells": cells(row, masked=m)} for t, row, m in zip(tokens, masked.result.weights, masked.mask)
        ],
        "unmasked": [{"token": t, "cells": cells(row)} for t, row in zip(tokens, free.result.weights)],
        "figures": [
            {
                "id": "without-mask",
                "title": _("Without the mask"),
                "caption": _("Every token mixes every token, later ones included."),
                "figure": figures.attention_heatmap(
                    free.result.weights, tokens, kind="weights", export_name="weights-bidirectional"
                ),
            },
            {
                "id": "with-mask",
                "title": _("With the causal mask"),
                "caption": _(
                    "Hatched cells are −∞ before the softmax, so their weight is exactly 0; "
                    "each row's remaining weights are renormalised."
                ),
                "figure": figures.attention_heatmap(
                    masked.result.weights, tokens, kind="weights", mask=masked.mask, export_name="weights-causal"
                ),
            },
        ],
        "snippet": snippets.causal(q.text, q.seed, q.d_model, q.d_k, q.scale),
    }


def view_multihead(svc: Service, q: requests.MultiheadQuery) -> dict:
    svc.limits.check_drawable(len(q.text.split()))
    r = svc.lessons.multihead(q.text, q.seed, q.d_model, q.n_heads, q.causal, q.scale)
    m, mask = r.lesson, r.mask
    return {
        "tokens": m.tokens,
        "d_head": m.d_head,
        "n_heads": m.n_heads,
        "shapes": {"Q": web.shape(m.Q), "weights": web.shape(m.result.weights), "out": web.shape(m.output)},
        "last_rows": [{"head": h, "cells": cells(w[-1])} for h, w in enumerate(m.result.weights)],
        "figures": [
            {
                "id": f"head-{h}",
                "title": _("Head {head}").format(head=h),
                "caption": (
                    _("softmax(Q Kᵀ / √d_head) of head {head}, d_head = {d_head}")
                    if q.scale
                    else _("softmax(Q Kᵀ) of head {head}, d_head = {d_head}")
                ).format(head=h, d_head=m.d_head),
                "figure": figures.attention_heatmap(
                    w, m.tokens, kind="weights", mask=mask, export_name=f"head-{h}-weights"
                ),
            }
            for h, w in enumerate(m.result.weights)
        ],
        "snippet": snippets.multihead(q.text, q.seed, q.d_model, q.n_heads, q.causal, q.scale),
    }


def view_positions(svc: Service, q: requests.PositionsQuery) -> dict:
    r = svc.lessons.positions(q.n_pos, q.d, q.pair_list, series=True)
    p = r.lesson
    series = [(_("from position {start}").format(start=s.start), s.gaps, s.dots) for s in r.series]
    return {
        "head": [cells(row) for row in p.encoding[:3, :6]],
        "dots": [{"i": i, "j": j, "gap": j - i, "dot": fixed(dot, 2), "full": full(dot)} for i, j, dot in p.dots],
        "figures": [
            {
                "id": "encoding",
                "title": _("The encoding: {n_pos} positions × {d} dimensions").format(n_pos=q.n_pos, d=q.d),
                "caption": _(
                    "Row = position, column = dimension: sin on even dimensions, cos on odd ones. Early "
                    "dimensions turn fast, later ones slowly."
                ),
                "figure": figures.value_heatmap(
                    p.encoding,
                    x_title=_("dimension"),
                    y_title=_("position"),
                    value_name=_("value"),
                    export_name="sinusoidal-encoding",
                ),
            },
            {
                "id": "dot-vs-gap",
                "title": _("Dot product vs gap"),
                "caption": _(
                    "pe[i] · pe[i + gap] for each starting position i: the lines coincide, because the dot "
                    "product depends only on the gap. It does not fall smoothly with distance."
                ),
                "figure": figures.line_chart(
                    series,
                    x_title=_("gap (positions apart)"),
                    y_title=_("dot product"),
                    export_name="dot-vs-gap",
                    y_hover=".2f",
                ),
            },
        ],
        "snippet": snippets.positions(q.n_pos, q.d, tuple((i, j) for i, j, _ in p.dots)),
    }


def _breakdown_figure(groups, export_name: str) -> dict:
    return figures.component_bars(
        [_(g.name) for g in groups],
        [g.size for g in groups],
        [g.counted for g in groups],
        [_(g.note) for g in groups],
        export_name=export_name,
    )


def view_params_lesson(svc: Service, q: ParamsLessonQuery) -> dict:
    r = svc.lessons.params(q.preset, q.sizes())
    rows = [
        {
            "name": row.name,
            "embeddings": f"{row.count.embeddings:,}",
            "per_block": f"{row.count.per_block:,}",
            "total": f"{row.count.total:,}",
            "count": row.count,
            "cfg": row.cfg,
        }
        for row in r.rows
    ]
    mine = r.rows[1].count
    return {
        "rows": rows,
        "d": r.rows[1].cfg.d_model,
        "rule": f"{r.rule:,}",
        "per_block": f"{mine.per_block:,}",
        "rule_gap": f"{r.rule_gap:.2%}",
        "embedding_share": f"{r.embedding_share:.1%}",
        "name": r.name,
        "figures": [
            {
                "id": "breakdown",
                "title": _("Where the parameters of {name} are").format(name=r.name),
                "caption": _(
                    "Counted components in blue; grey hatched ones exist but add nothing: the tied "
                    "unembedding reuses the token table, and the causal mask is a constant."
                ),
                "figure": _breakdown_figure(r.groups, "parameter-breakdown"),
            }
        ],
        "snippet": snippets.params(r.spec_sizes),
    }


def view_forward(svc: Service, q: requests.ForwardQuery) -> dict:
    svc.limits.check_drawable(len(q.prompt), prompt=True)
    r = svc.lessons.forward(q.text, q.prompt, q.seed, q.d_model, q.n_heads, q.d_mlp)
    f, tokens, pattern, mask = r.lesson, r.tokens, r.patterns, r.mask  # pattern [head_index, query_pos, key_pos]
    probs = f.next_token_probs
    return {
        "steps": [{"name": n, "shape": web.shape(s)} for n, s in f.steps],
        "probs": [{"char": figures.visible(c), "p": fixed(p, 3), "full": full(p)} for c, p in probs.items()],
        "vocab": "".join(figures.visible(c) for c in f.vocab),
        "n_vocab": len(f.vocab),
        "uniform": fixed(1 / len(f.vocab), 3),
        "prompt": f.prompt,
        "figures": [
            {
                "id": "next-char",
                "title": _("Next-character probabilities after the prompt"),
                "caption": _(
                    "With random weights the guess is close to uniform (1/{n} ≈ {p:.3f}); any preference is noise."
                ).format(n=len(f.vocab), p=1 / len(f.vocab)),
                "figure": figures.probability_bars(list(probs), list(probs.values()), export_name="next-char"),
            },
        ]
        + [
            {
                "id": f"head-{h}",
                "title": _("Head {head}: attention weights").format(head=h),
                "caption": _("The upper triangle is masked: each character sees only itself and earlier ones."),
                "figure": figures.attention_heatmap(
                    w, tokens, kind="weights", mask=mask, export_name=f"forward-head-{h}-weights"
                ),
            }
            for h, w in enumerate(pattern)
        ],
        "snippet": snippets.forward(q.text, q.prompt, q.seed, q.d_model, q.n_heads, q.d_mlp),
    }


# ------------------------------------------------------------------ the calculator


def view_calculator(svc: Service, q: CalculatorQuery) -> dict:
    r = calculators.calculator(q.preset, q.sizes(), q.seq_len, q.batch, q.dtype)
    cfg, count, kv = r.cfg, r.count, r.kv
    series = [
        (
            ngettext("{dtype} ({size} byte)", "{dtype} ({size} bytes)", size).format(dtype=dtype, size=size),
            r.lengths,
            r.kv_by_dtype[dtype],
        )
        for dtype, size in requests.DTYPE_BYTES.items()
    ]
    entries = [
        {
            "name": e.name,
            "shape": web.shape(e.shape),
            "copies": e.copies,
            "counted": e.counted,
            "total": f"{e.elements:,}",
            "note": e.said(),
        }
        for e in count.entries
    ]
    return {
        "cfg": cfg,
        "embeddings": f"{count.embeddings:,}",
        "per_block": f"{count.per_block:,}",
        "total": f"{count.total:,}",
        "entries": entries,
        "float32_weights": human_bytes(r.weights_bytes),
        "kv": kv,
        "kv_bytes": f"{kv.bytes:,}",
        "kv_human": human_bytes(kv.bytes),
        "dtype": q.dtype,
        "figures": [
            {
                "id": "breakdown",
                "title": _("Where the parameters are"),
                "caption": _(
                    "Counted components in blue; grey hatched ones exist but add nothing (a tied unembedding "
                    "reuses the token table; the causal mask is a constant)."
                ),
                "figure": _breakdown_figure(r.groups, "parameter-breakdown"),
            },
            {
                "id": "kv-cache",
                "title": _("KV-cache size vs sequence length (batch {batch})").format(batch=q.batch),
                "caption": _(
                    "Keys and values of every layer for every cached token: the cache grows linearly with "
                    "the sequence length, and halves with each halving of the element size."
                ),
                "figure": figures.line_chart(
                    series,
                    x_title=_("sequence length (tokens)"),
                    y_title=_("cache size (bytes)"),
                    export_name="kv-cache-vs-length",
                    x_log=True,
                    y_log=True,
                    y_hover=",.0f",
                    y_tickformat="~s",
                    x_tickvals=r.ticks,
                ),
            },
        ],
    }


# ------------------------------------------------------------------ the page table


Query = TypeVar("Query", bound=BaseModel)


@dataclass(frozen=True)
class Page(Generic[Query]):
    slug: str  # /lessons/{slug}, or the calculator
    title: str  # in English, marked for the catalogue: `shown` translates it
    summary: str
    query: type[Query]
    build: Callable[[Service, Query], dict]
    api: tuple[str, ...]  # the JSON endpoints that answer the same query

    def shown(self) -> Page[Query]:
        """This page as the reader sees it: its title and summary in the request's language."""
        return dataclasses.replace(self, title=_(self.title), summary=_(self.summary))


LESSONS: list[Page[Any]] = [
    Page(
        "attention",
        N_("Queries, keys and values"),
        N_("Scaled dot-product attention on four words: scores, softmax weights, output."),
        requests.AttentionQuery,
        view_attention,
        ("/api/v1/lessons/attention",),
    ),
    Page(
        "scaling",
        N_("Why divide by √d_k"),
        N_("Unscaled dot products grow with the width and the softmax collapses onto one key."),
        requests.ScalingQuery,
        view_scaling,
        ("/api/v1/lessons/scaling",),
    ),
    Page(
        "causal",
        N_("Causal masks"),
        N_("Forbid every token to look ahead, and watch the rows renormalise."),
        CausalQuery,
        view_causal,
        ("/api/v1/lessons/attention",),
    ),
    Page(
        "multihead",
        N_("Multiple heads"),
        N_("Several attentions side by side, heads as a batch axis."),
        requests.MultiheadQuery,
        view_multihead,
        ("/api/v1/lessons/multihead",),
    ),
    Page(
        "positions",
        N_("Positional information"),
        N_("Sinusoidal encodings, whose dot products depend only on the gap between positions."),
        requests.PositionsQuery,
        view_positions,
        ("/api/v1/lessons/positions",),
    ),
    Page(
        "params",
        N_("Counting parameters"),
        N_("GPT-2 small to the last digit: 124,439,808."),
        ParamsLessonQuery,
        view_params_lesson,
        ("/api/v1/params",),
    ),
    Page(
        "forward",
        N_("A full forward pass"),
        N_("One block, two heads, nine characters: every shape on the way to the next-character guess."),
        requests.ForwardQuery,
        view_forward,
        ("/api/v1/lessons/forward",),
    ),
    Page("attribution", attribution_lesson.TITLE, attribution_lesson.SUMMARY, *attribution_lesson.LESSON),
]
BY_SLUG = {p.slug: p for p in LESSONS}
CALCULATOR = Page(
    "calculator",
    N_("Parameter and KV-cache calculator"),
    N_("Presets and free sizes; where the parameters are; KV-cache memory by length and dtype."),
    CalculatorQuery,
    view_calculator,
    ("/api/v1/params", "/api/v1/kv-cache"),
)


# ------------------------------------------------------------------ query string <-> request model


def _given(query: web.QueryString) -> dict[str, str]:
    """The URL's fields for the request model: the last value of each (a checkbox sends a hidden "0"
    before its "1"); an empty box means "the default"."""
    out = {}
    for key in dict.fromkeys(query.keys()):
        if key in PAGE_ONLY:
            continue
        value = query.getlist(key)[-1]
        if value.strip() != "":
            out[key] = value
    return out


def _url_value(value: object) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def canonical(q: BaseModel) -> dict[str, str]:
    """The fields that differ from the defaults: the shortest query that restores the view."""
    return {k: _url_value(v) for k, v in q.model_dump(exclude_defaults=True).items() if v is not None}


def _api_fields(q: BaseModel, model: type[BaseModel]) -> dict[str, str]:
    """This page's state as a query for one JSON endpoint: the fields it takes, where they differ from
    its defaults (a page may default otherwise: the causal lesson's mask, the params lesson's preset)."""
    fields = model.model_fields
    return {
        k: _url_value(v) for k, v in q.model_dump().items() if k in fields and v is not None and v != fields[k].default
    }


def _with_query(path: str, params: Mapping[str, str]) -> str:
    return path + ("?" + urlencode(params) if params else "")


def _field_values(page: Page[Any], given: Mapping[str, str], q: BaseModel | None) -> dict[str, object]:
    """What the controls show: the validated values, else (after an error) what the learner typed."""
    defaults = {name: f.default for name, f in page.query.model_fields.items()}
    if q is not None:
        return q.model_dump()
    return defaults | dict(given)


API_QUERY: dict[str, type[BaseModel]] = {
    "/api/v1/lessons/attention": requests.AttentionQuery,
    "/api/v1/lessons/scaling": requests.ScalingQuery,
    "/api/v1/lessons/multihead": requests.MultiheadQuery,
    "/api/v1/lessons/positions": requests.PositionsQuery,
    "/api/v1/lessons/forward": requests.ForwardQuery,
    "/api/v1/params": requests.ParamsQuery,
    "/api/v1/kv-cache": requests.KVCacheQuery,
}


def _presets(page: Page[Any]) -> list[str]:
    """The presets a page's query accepts (its select's options), in the order of core's PRESETS."""
    field = page.query.model_fields.get("preset")
    return [] if field is None else [p for p in get_args(field.annotation) if isinstance(p, str)]


def render(request: Request, svc: Service, page: Page[Any], path: str, template: str) -> Response:
    given = _given(request.query_params)
    classroom = web.is_on(request.query_params, "classroom")
    q, view, error = None, None, None
    try:
        q = page.query.model_validate(given)
        view = page.build(svc, q)
    except web.PAGE_ERRORS as exc:
        error = web.error_message(exc)
    state = canonical(q) if q is not None else dict(given)
    if classroom:
        state["classroom"] = "1"
    url = _with_query(path, state)
    if view is not None and q is not None:  # a view is built from a query
        view["links"] = {
            "api": [_with_query(api, _api_fields(q, API_QUERY[api])) for api in page.api],
            "snippet": _with_query(f"{path}/snippet.py", canonical(q)) if "snippet" in view else None,
        }
    context = {
        "page": page.shown(),
        "lessons": [p.shown() for p in LESSONS],
        "view": view,
        "error": error,
        "values": _field_values(page, given, q),
        "url": url,
        "path": path,
        "classroom": classroom,
        "form_id": "lesson",
        "nav": "params" if page is CALCULATOR else "lessons",
        "presets": _presets(page),
        "dtypes": list(requests.DTYPE_BYTES),
        "limits": svc.settings,
        "max_seed": requests.MAX_SEED,
        "norm_types": list(requests.NORMALIZATION_TYPES),
        "position_schemes": list(requests.POSITION_SCHEMES),
    }
    return web.render(request, template, context, url=url, error=error)


# ------------------------------------------------------------------ routes


def _index(request: Request, missing: str | None = None) -> Response:
    context = {
        "lessons": [p.shown() for p in LESSONS],
        "calculator": CALCULATOR.shown(),
        "nav": "lessons",
        "classroom": False,
        "form_id": None,
    }
    if missing is not None:
        context["missing"] = missing
    return web.templates.TemplateResponse(
        request, "lessons/index.html", context, status_code=404 if missing is not None else 200
    )


@router.get("/lessons", response_class=HTMLResponse, summary="The lessons")
def index(request: Request) -> Response:
    return _index(request)


@router.get("/lessons/{slug}", response_class=HTMLResponse, summary="One lesson")
def lesson(request: Request, slug: str, svc: ServiceDep) -> Response:
    page = BY_SLUG.get(slug)
    if page is None:
        return _index(request, missing=slug)
    return render(request, svc, page, f"/lessons/{slug}", f"lessons/{slug}.html")


@router.get("/lessons/{slug}/snippet.py", response_class=PlainTextResponse, summary="A lesson's NumPy snippet")
def snippet(request: Request, slug: str, svc: ServiceDep) -> PlainTextResponse:
    """The snippet of the view this query shows, as a file (the page's download link)."""
    page = BY_SLUG.get(slug)
    if page is None or page.slug == "calculator":
        return PlainTextResponse(_("there is no lesson {slug!r}: see /lessons").format(slug=slug), status_code=404)
    try:
        view = page.build(svc, page.query.model_validate(_given(request.query_params)))
    except web.PAGE_ERRORS as exc:
        return PlainTextResponse(web.error_message(exc), status_code=422)
    if "snippet" not in view:  # a lesson built on a service beyond the spec's code (attribution: the API's)
        no_snippet = _("the lesson {slug!r} has no NumPy snippet: its numbers come from the REST API (see /docs)")
        return PlainTextResponse(no_snippet.format(slug=slug), status_code=404)
    return PlainTextResponse(
        view["snippet"],
        media_type="text/x-python; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="{slug}.py"'},
    )


@router.get("/params", response_class=HTMLResponse, summary="The parameter and KV-cache calculator")
def calculator(request: Request, svc: ServiceDep) -> Response:
    return render(request, svc, CALCULATOR, "/params", "params.html")
