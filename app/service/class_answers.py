"""The model's answer to a live class's poll (issue 35: "the teacher ... reveals the model's answer"), worked
out by the server when the teacher reveals, for the view the class is on (the path the teacher pushed last):

- "Which token comes next?" (`next_token`): the model of the page (`model=` in its URL, else the model the
  explorer opens on) on the page's text (`text=`, else that model's default text) predicts its top next
  token, with its probability, as the explorer's next-token panel shows it (ModelViews.run, top_k 1). The
  page's other toggles (heads, causal, ablations...) are left at the model's own values.
- "Which head is the induction head?" (`induction_head`): the head of that model with the highest induction
  score on a repeated random sequence, as Inspect's detectors view computes it (InspectViews.detectors, with
  the DetectorsRequest defaults: 20 random tokens, seed 0), labelled L{layer}H{head} as the poll's options are.

A free-text poll keeps the teacher's pick. The answer is an option when one matches (a token's leading space
or the tokenizer's marks aside), else the model's token as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

import numpy as np

from app.service.inspect import InspectViews
from app.service.spec import RunSpec
from app.service.views import ModelViews
from core.errors import InputError
from core.i18n import _

RANDOM_LENGTH = 20  # Inspect's detectors view's defaults (app/api/requests.py DetectorsRequest)
RANDOM_SEED = 0
SPACE_MARKS = "Ġ▁ "  # how tokenizers write a leading space


@dataclass(frozen=True)
class ModelAnswer:
    answer: str  # the option it matches, else the model's own token or head
    detail: dict  # kind, model, and token + prob or head + score


def view_of(path: str, views: ModelViews, preferred: str) -> tuple[str, str]:
    """(model, text) of a class's page: its URL's `model` and `text`, else the explorer's defaults."""
    query = parse_qs(urlsplit(path).query)
    models = views.models()
    fallback = preferred if preferred in models and not models[preferred].error else "toy"
    name = (query.get("model") or [fallback])[-1]
    if name not in models or models[name].error:
        name = fallback
    text = (query.get("text") or [models[name].default_text])[-1]
    return name, text


def _bare(token: str) -> str:
    return token.strip(SPACE_MARKS).strip()


def matching(options: list[str], said: str) -> str:
    """The option that is the model's token (exactly, or without its leading space), else the token."""
    for option in options:
        if option == said or _bare(option) == _bare(said):
            return option
    return _bare(said) or said


def model_answer(views: ModelViews, kind: str, path: str, options: list[str], preferred: str) -> ModelAnswer:
    """The model's answer to a `next_token` or `induction_head` poll on the class's page `path`.
    InputError (422) when that model cannot say (an encoder predicts no next token)."""
    name, text = view_of(path, views, preferred)
    spec = RunSpec(model=name, text=text)
    if kind == "next_token":
        top = views.run(spec, [], 1).top_k
        if not top:
            raise InputError(_("the model {model!r} does not predict a next token").format(model=name))
        token = top[0]
        detail = {"kind": kind, "model": name, "text": text, "token": token.token, "prob": token.prob}
        return ModelAnswer(matching(options, token.token), detail)
    found = InspectViews(views).detectors(spec, RANDOM_LENGTH, RANDOM_SEED, 1.0)
    grid = np.where(np.isnan(found.detectors["induction"]["random"]), -np.inf, found.detectors["induction"]["random"])
    layer, head = (int(i) for i in np.unravel_index(int(np.argmax(grid)), grid.shape))
    label = f"L{layer}H{head}"
    detail = {"kind": kind, "model": name, "head": label, "score": float(grid[layer, head])}
    return ModelAnswer(matching(options, label), detail)
