"""The /generate page's steer (its editor and the side-by-side continuations): one push, a feature of an SAE of
this model or a difference of means of two sets of texts, at a residual-stream hook, with a coefficient and a
mode; and the three continuations it is shown by, with the page's one seed: unsteered, steered with attention
recomputed, steered with attention frozen (POST /api/v1/generate's `steer` and `frozen_attention`).

URL state: steer=feature|means (absent: no steer), steer_sae, steer_feature, steer_hook, steer_a and steer_b (one
text a line), steer_coef, steer_mode=add|clamp.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlencode

from app.http.language import _
from app.pages import figures, web
from app.service import InputError, Model, RunSpec, Service
from app.service.generation import GenerateSettings, Generation
from app.service.spec import Steering, SteerSpec

SOURCES = ("feature", "means")
MODES = ("add", "clamp")
DEFAULT_COEFFICIENT = 4.0
PARAMS = ("steer", "steer_sae", "steer_feature", "steer_hook", "steer_a", "steer_b", "steer_coef", "steer_mode")


@dataclass
class SteerState:
    """The editor's values (the URL's, else these defaults)."""

    source: str | None = None  # None: no steer
    sae: str | None = None
    feature: int = 0
    hook: str | None = None
    texts_a: str = ""
    texts_b: str = ""
    coefficient: float = DEFAULT_COEFFICIENT
    mode: Literal["add", "clamp"] = "add"

    def params(self) -> dict[str, object]:
        """What differs from the defaults, for the page's canonical URL."""
        if self.source is None:
            return {}
        out: dict[str, object] = {"steer": self.source, "steer_coef": self.coefficient}
        if self.mode != "add":
            out["steer_mode"] = self.mode
        if self.source == "feature":
            out |= {"steer_sae": self.sae or "", "steer_feature": self.feature}
        else:
            out |= {"steer_hook": self.hook or "", "steer_a": self.texts_a, "steer_b": self.texts_b}
        return out


def parse(query, errors: list[str]) -> SteerState:
    state = SteerState()
    source = web.last(query, "steer")
    if source in SOURCES:
        state.source = source
    elif source:
        errors.append(_("steer={value!r}: choose feature or means").format(value=source))
    state.sae = web.last(query, "steer_sae") or None
    state.hook = web.last(query, "steer_hook") or None
    state.texts_a = web.last(query, "steer_a") or ""
    state.texts_b = web.last(query, "steer_b") or ""
    for key, kind, attr in (("steer_feature", int, "feature"), ("steer_coef", float, "coefficient")):
        raw = web.last(query, key)
        value = web.parse_number(key, raw, kind, errors) if raw is not None else None
        if value is not None:
            setattr(state, attr, value)
    mode = web.last(query, "steer_mode")
    if mode == "add":
        state.mode = "add"
    elif mode == "clamp":
        state.mode = "clamp"
    elif mode:
        errors.append(_("steer_mode={value!r}: choose add or clamp").format(value=mode))
    return state


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def steer_spec(svc: Service, spec: RunSpec, state: SteerState) -> tuple[SteerSpec, float | None]:
    """The page's one steer as the service's (a difference of means computed here), and that vector's norm."""
    if state.source == "feature":
        if not state.sae:
            raise InputError(_("choose an SAE of this model to steer with one of its features"))
        hook = svc.features.saes.get_entry(state.sae).hook or ""
        return SteerSpec(hook, state.coefficient, state.mode, sae=state.sae, feature=state.feature), None
    hook = state.hook or "blocks.0.hook_resid_post"
    vector = svc.steering.vector(spec, hook, _lines(state.texts_a), _lines(state.texts_b))
    return SteerSpec(hook, state.coefficient, state.mode, vector=tuple(map(float, vector.vector))), vector.norm


@dataclass(frozen=True)
class Column:
    key: str
    title: str
    help: str
    tokens: list[dict] = field(default_factory=list)  # {text, prob, differs}
    text: str = ""


def side_by_side(svc: Service, spec: RunSpec, settings: GenerateSettings, state: SteerState) -> dict:
    """The three continuations with the page's seed, and what the steer was (its hook, its vector's norm)."""
    steer, norm = steer_spec(svc, spec, state)
    plain = svc.generation.generate(spec, settings)
    runs: list[tuple[str, str, str, Generation]] = [("unsteered", _("Unsteered"), _("The model as it is."), plain)]
    for frozen in (False, True):
        steered = svc.generation.generate(spec.replace(steering=Steering((steer,), frozen)), settings)
        runs.append(
            (
                "frozen" if frozen else "recomputed",
                _("Steered, attention frozen") if frozen else _("Steered, attention recomputed"),
                _(
                    "Every attention pattern is the unsteered model's over the same tokens: the push acts only "
                    "through values and the residual stream."
                )
                if frozen
                else _("Attention is recomputed from the pushed stream: later heads may look elsewhere."),
                steered,
            )
        )
    base_ids = plain.generated.ids
    columns = []
    for key, title, help_text, g in runs:
        tokens = [
            {
                "text": step.token,  # as the stream shows it: the text itself, spaces kept
                "prob": step.prob,
                "differs": key != "unsteered" and (i >= len(base_ids) or base_ids[i] != step.id),
            }
            for i, step in enumerate(g.steps)
        ]
        columns.append(Column(key, title, help_text, tokens, g.generated.text))
    return {"columns": columns, "hook": steer.hook, "norm": norm, "seed": settings.seed, "steer": api_steer(steer)}


def api_steer(steer: SteerSpec) -> dict:
    """The steer as POST /api/v1/generate's `steer[0]`."""
    out: dict[str, object] = {"hook": steer.hook, "coefficient": steer.coefficient, "mode": steer.mode}
    if steer.vector is not None:
        out["vector"] = list(steer.vector)
    else:
        out["feature"] = {"sae": steer.sae, "index": steer.feature}
    return out


def steered_prediction(svc: Service, spec: RunSpec, state: SteerState, top_k: int) -> dict:
    """The explorer's next-token bars under the steer: the steered top-k with attention recomputed, and with every
    attention pattern frozen at the unsteered run's; a caption saying what was pushed and what the model said
    without it."""
    steer, _norm = steer_spec(svc, spec, state)
    out: dict = {}
    for frozen in (False, True):
        result = svc.steering.run(spec.replace(steering=Steering((steer,), frozen)), [], top_k)
        tokens, probs = [t.token for t in result.top_k], [t.prob for t in result.top_k]
        name = "next-token-steered-frozen" if frozen else "next-token"
        out["frozen_figure" if frozen else "figure"] = figures.probability_bars(tokens, probs, export_name=name)
        before = result.steering_effect.baseline_top_k if result.steering_effect else []
    out["caption"] = _(
        "Steered: {hook} pushed ({mode}, coefficient {c:g}) at every position, attention recomputed. Unsteered, the "
        "most likely next token is “{token}” ({p:.3f})."
    ).format(
        hook=steer.hook,
        mode=steer.mode,
        c=steer.coefficient,
        token=figures.visible(before[0].token) if before else "",
        p=before[0].prob if before else 0.0,
    )
    return out


def with_steer(url: str, state: SteerState) -> str:
    """A page's canonical URL with the steer's parameters after its own."""
    params = state.params()
    if not params:
        return url
    return url + ("&" if "?" in url else "?") + urlencode(params)


def editor(svc: Service, model: Model, state: SteerState) -> dict:
    """The editor's choices for this model: its residual-stream hooks, and the usable SAEs that read it."""
    cfg = model.cfg
    hooks = [f"blocks.{layer}.hook_resid_{where}" for layer in range(cfg.n_layers) for where in ("pre", "mid", "post")]
    if cfg.attn_only:
        hooks = [h for h in hooks if not h.endswith("_mid")]
    saes = [s for s in svc.features.list() if s.model == model.name and s.problem is None]
    return {"state": state, "hooks": hooks, "saes": saes, "modes": MODES}
