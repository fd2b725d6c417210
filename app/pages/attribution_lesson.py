"""The lesson "Which words mattered?" (/lessons/attribution, in app/pages/lessons.py's table): token attribution
on the shipped induction model (core/trained/induction), from saliency to integrated gradients' completeness.

The text is the circuits page's induction example (app/service/circuits.py INDUCTION_PREFILL: random letters,
then the same letters again), cut `shown` letters into the repeat, so the model's answer is the letter that
followed the last one in the first copy. Each method's scores come from the service, asked as POST
/api/v1/analysis/attribution asks (app/pages/attribution.py `attribute`), and are shown as the attribution page
shows them; the lesson marks the letter after the earlier copy and says where each method ranks it, and how
integrated gradients' scores add up to the metric's change from the zero baseline as its steps grow.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from app.http.language import N_, _
from app.pages import attribution
from app.pages.numbers import fixed
from app.service import Service

TITLE = N_("Which words mattered?")
SUMMARY = N_("From saliency to integrated gradients on the induction model: the letter after the earlier copy.")
LESSON_MODEL = "induction"
TOKEN_METHODS = ("saliency", "input_x_gradient", "integrated_gradients", "occlusion")
COMPLETENESS_STEPS = (1, 2, 4, 8)  # integrated gradients' steps the completeness table adds to the chosen one


class AttributionLessonQuery(BaseModel):
    """How far into the repeat the text goes, and integrated gradients' steps."""

    model_config = ConfigDict(extra="forbid")

    shown: int = Field(10, ge=1, le=23, description="letters of the repeat in the text (the random sequence has 24)")
    steps: int = Field(32, ge=1, le=256, description="integrated gradients' steps (Gauss–Legendre points)")


def _rank(scores: list[float], i: int) -> int:
    """1 for the largest score, 2 for the next…"""
    return 1 + sum(s > scores[i] for s in scores)


def view(svc: Service, q: AttributionLessonQuery) -> dict:
    clean = svc.circuits.prefill(LESSON_MODEL).clean  # the random letters, then again (up to the last but one)
    period = next(p for p in range(1, len(clean)) if clean[p:] == clean[: len(clean) - p])  # 24 letters
    text = clean[: period + q.shown]
    marked = q.shown  # the letter after the last letter's earlier copy: the answer, in the first copy

    def run(method: str, steps: int | None = None):
        state = attribution.AttributionState(model=LESSON_MODEL, text=text, method=method, steps=steps)
        return attribution.attribute(svc, state)

    methods = []
    for method in TOKEN_METHODS:
        r = run(method, q.steps if method == "integrated_gradients" else None)
        scores = [float(s) for s in r.scores]
        tokens = attribution.shaded(list(r.tokens), scores, r.position)
        for t in tokens:
            t["marked"] = t["i"] in (marked, marked - 1)
        top = max((abs(s) for s in scores), default=0.0)
        methods.append(
            {
                "method": method,
                "name": _(attribution.METHOD_NAMES[method]),
                "help": _(attribution.METHOD_HELP[method]),
                "tokens": tokens,
                "top": top,
                "legend": attribution.legend(top),
                "rank": _rank(scores, marked),
                "best": max(range(len(scores)), key=lambda i: scores[i]),
                "sum": sum(scores),
                "r": r,
            }
        )
    ig = next(m["r"] for m in methods if m["method"] == "integrated_gradients")
    completeness = []
    for steps in sorted({*COMPLETENESS_STEPS, q.steps}):
        r = ig if steps == q.steps else run("integrated_gradients", steps)
        total, change = float(sum(r.scores)), r.metric - r.baseline_metric
        completeness.append(
            {"steps": steps, "sum": fixed(total, 4), "change": fixed(change, 4), "gap": f"{total - change:.2e}"}
        )
    return {
        "text": text,
        "answer": attribution.figures.visible(ig.target.token),
        "last": attribution.figures.visible(ig.tokens[-1]),
        "marked": marked,
        "metric": fixed(ig.metric, 4),
        "baseline": fixed(ig.baseline_metric, 4),
        "methods": methods,
        "completeness": completeness,
        "page": attribution.explain_link(LESSON_MODEL, text, len(ig.tokens) - 1, ig.target.token),
        "figures": [
            {
                "id": f"scores-{m['method']}",
                "title": m["name"],
                "caption": _("One bar per letter of the text."),
                "figure": attribution.scores_figure(list(m["r"].tokens), m["r"].scores, m["method"]),
            }
            for m in methods
            if m["method"] in ("saliency", "integrated_gradients")
        ],
    }


LESSON = (AttributionLessonQuery, view, ())  # the lesson table's query, view builder and JSON endpoints (GET: none)
