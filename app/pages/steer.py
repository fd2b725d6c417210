"""The /generate page's steers (their editor and the side-by-side continuations): up to the server's limit of
pushes (EXPLORER_MAX_STEERS), each a feature of an SAE of this model or a difference of means of two sets of texts,
at a residual-stream hook, with a coefficient, a mode and positions; and the three continuations they are shown by,
with the page's one seed: unsteered, steered with attention recomputed, steered with attention frozen (POST
/api/v1/generate's `steer` and `frozen_attention`).

URL state, one group of parameters a steer, the first's named steer…, the second's steer2…, and so on:
steer=feature|means (absent: no steer), steer_sae, steer_feature, steer_hook, steer_a and steer_b (one text a line),
steer_coef, steer_mode=add|clamp, steer_pos (the prompt's positions, e.g. "0, -1"; absent: every position). A steer
that cannot be used is said under its own row (and in the results' error panel, naming it), with a 422.
"""

from __future__ import annotations

import re
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
KEYS = ("", "_sae", "_feature", "_hook", "_a", "_b", "_coef", "_mode", "_pos")  # each steer's parameters' endings


def prefix(i: int) -> str:
    """The URL name of steer i (from 0): steer, steer2, steer3, ..."""
    return "steer" if i == 0 else f"steer{i + 1}"


@dataclass
class SteerRow:
    """One steer's values in the editor (the URL's, else these defaults), and what is wrong with it."""

    source: str | None = None  # None: this row steers nothing
    sae: str | None = None
    feature: int = 0
    hook: str | None = None
    texts_a: str = ""
    texts_b: str = ""
    coefficient: float = DEFAULT_COEFFICIENT
    mode: Literal["add", "clamp"] = "add"
    positions: tuple[int, ...] | None = None  # None: every position
    errors: list[str] = field(default_factory=list)

    def params(self, i: int) -> dict[str, object]:
        """What differs from the defaults, under steer i's names."""
        if self.source is None:
            return {}
        p = prefix(i)
        out: dict[str, object] = {p: self.source, p + "_coef": self.coefficient}
        if self.mode != "add":
            out[p + "_mode"] = self.mode
        if self.positions is not None:
            out[p + "_pos"] = ", ".join(map(str, self.positions))
        if self.source == "feature":
            out |= {p + "_sae": self.sae or "", p + "_feature": self.feature}
        else:
            out |= {p + "_hook": self.hook or "", p + "_a": self.texts_a, p + "_b": self.texts_b}
        return out

    @property
    def positions_text(self) -> str:
        return "" if self.positions is None else ", ".join(map(str, self.positions))


@dataclass
class SteerState:
    """The editor's steers, in order (the rows that steer nothing left out)."""

    rows: list[SteerRow] = field(default_factory=list)

    @property
    def active(self) -> bool:
        return bool(self.rows)

    @property
    def errors(self) -> list[str]:
        """Every row's problems, each naming its steer."""
        return [
            _("steer {n}: {problem}").format(n=i + 1, problem=problem)
            for i, row in enumerate(self.rows)
            for problem in row.errors
        ]

    def params(self) -> dict[str, object]:
        """What differs from the defaults, for the page's canonical URL."""
        out: dict[str, object] = {}
        for i, row in enumerate(self.rows):
            out |= row.params(i)
        return out


def _row(query, i: int) -> SteerRow | None:
    """Steer i of the URL (None: it has none)."""
    p = prefix(i)
    row = SteerRow()
    source = web.last(query, p)
    if source in SOURCES:
        row.source = source
    elif source:
        row.errors.append(_("{name}={value!r}: choose feature or means").format(name=p, value=source))
    else:
        return None  # no steer here: its other fields (an editor's leftovers) are ignored
    row.sae = web.last(query, p + "_sae") or None
    row.hook = web.last(query, p + "_hook") or None
    row.texts_a = web.last(query, p + "_a") or ""
    row.texts_b = web.last(query, p + "_b") or ""
    for key, kind, attr in (("_feature", int, "feature"), ("_coef", float, "coefficient")):
        raw = web.last(query, p + key)
        value = web.parse_number(p + key, raw, kind, row.errors) if raw is not None else None
        if value is not None:
            setattr(row, attr, value)
    mode = web.last(query, p + "_mode")
    if mode == "add":
        row.mode = "add"
    elif mode == "clamp":
        row.mode = "clamp"
    elif mode:
        row.errors.append(_("{name}={value!r}: choose add or clamp").format(name=p + "_mode", value=mode))
    raw = web.last(query, p + "_pos")
    if raw is not None:
        parts = [x for x in re.split(r"[\s,]+", raw) if x]
        if all(re.fullmatch(r"-?\d+", x) for x in parts) and parts:
            row.positions = tuple(dict.fromkeys(int(x) for x in parts))
        else:
            row.errors.append(
                _("{name}={value!r}: give the prompt's positions as whole numbers, e.g. 0, 3, -1").format(
                    name=p + "_pos", value=raw
                )
            )
    return row


def parse(query, errors: list[str], limit: int) -> SteerState:
    """The URL's steers, up to `limit` (more: said in `errors`); each row's own problems stay on the row."""
    rows = [row for i in range(limit) if (row := _row(query, i)) is not None]
    if web.last(query, prefix(limit)) is not None:
        errors.append(_("at most {limit} steers: remove some").format(limit=limit))
    return SteerState(rows)


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def steer_spec(svc: Service, spec: RunSpec, row: SteerRow) -> tuple[SteerSpec, float | None]:
    """One row as the service's steer (a difference of means computed here), and that vector's norm."""
    if row.source == "feature":
        if not row.sae:
            raise InputError(_("choose an SAE of this model to steer with one of its features"))
        hook = svc.features.saes.get_entry(row.sae).hook or ""
        return SteerSpec(
            hook, row.coefficient, row.mode, sae=row.sae, feature=row.feature, positions=row.positions
        ), None
    hook = row.hook or "blocks.0.hook_resid_post"
    vector = svc.steering.vector(spec, hook, _lines(row.texts_a), _lines(row.texts_b))
    steer = SteerSpec(hook, row.coefficient, row.mode, vector=tuple(map(float, vector.vector)), positions=row.positions)
    return steer, vector.norm


_INDEXED = re.compile(r"^steer\[0\]: ")


def steer_specs(
    svc: Service, spec: RunSpec, state: SteerState, check
) -> tuple[list[SteerSpec], list[float | None]] | None:
    """Every row as the service's steer, each checked alone by `check` (a Steering -> None that raises what the
    service would refuse); a row that fails keeps the reason in its errors. None when any row failed."""
    specs, norms = [], []
    for row in state.rows:
        if row.errors:
            continue
        try:
            steer, norm = steer_spec(svc, spec, row)
            check(Steering((steer,), False))
        except web.PAGE_ERRORS as exc:
            row.errors.append(_INDEXED.sub("", web.error_message(exc)))
            continue
        specs.append(steer)
        norms.append(norm)
    return None if state.errors else (specs, norms)


@dataclass(frozen=True)
class Column:
    key: str
    title: str
    help: str
    tokens: list[dict] = field(default_factory=list)  # {text, prob, differs}
    text: str = ""


def describe(steer: SteerSpec) -> str:
    """One steer in words: its hook, mode, coefficient and positions."""
    where = (
        _("every position")
        if steer.positions is None
        else _("positions {positions}").format(positions=", ".join(map(str, steer.positions)))
    )
    what = steer.hook if steer.sae is None else f"{steer.hook} ({steer.sae} #{steer.feature})"
    return _("{what}: {mode}, coefficient {c:g}, {where}").format(
        what=what, mode=steer.mode, c=steer.coefficient, where=where
    )


def side_by_side(
    svc: Service, spec: RunSpec, settings: GenerateSettings, steers: list[SteerSpec], norms: list[float | None]
) -> dict:
    """The three continuations with the page's seed, and what the steers were (in words, a vector's norm)."""
    plain = svc.generation.generate(spec, settings)
    runs: list[tuple[str, str, str, Generation]] = [("unsteered", _("Unsteered"), _("The model as it is."), plain)]
    for frozen in (False, True):
        steered = svc.generation.generate(spec.replace(steering=Steering(tuple(steers), frozen)), settings)
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
    return {
        "columns": columns,
        "described": [{"text": describe(steer), "norm": norm} for steer, norm in zip(steers, norms)],
        "seed": settings.seed,
        "steers": [api_steer(steer) for steer in steers],
    }


def api_steer(steer: SteerSpec) -> dict:
    """The steer as one of POST /api/v1/generate's `steer`."""
    out: dict[str, object] = {"hook": steer.hook, "coefficient": steer.coefficient, "mode": steer.mode}
    if steer.vector is not None:
        out["vector"] = list(steer.vector)
    else:
        out["feature"] = {"sae": steer.sae, "index": steer.feature}
    if steer.positions is not None:
        out["positions"] = list(steer.positions)
    return out


def steered_prediction(svc: Service, spec: RunSpec, state: SteerState, top_k: int) -> dict:
    """The explorer's next-token bars under the steers: the steered top-k with attention recomputed, and with every
    attention pattern frozen at the unsteered run's; a caption saying what was pushed and what the model said
    without it. InputError naming the steer that cannot be used."""
    if state.errors:
        raise InputError("; ".join(state.errors))
    steers = []
    for i, row in enumerate(state.rows):
        try:
            steers.append(steer_spec(svc, spec, row)[0])
        except InputError as e:
            raise InputError(_("steer {n}: {problem}").format(n=i + 1, problem=e)) from None
    out: dict = {}
    for frozen in (False, True):
        try:
            result = svc.steering.run(spec.replace(steering=Steering(tuple(steers), frozen)), [], top_k)
        except InputError as e:  # the service names the steer from 0
            raise InputError(
                re.sub(r"^steer\[(\d+)\]", lambda m: _("steer {n}").format(n=int(m.group(1)) + 1), str(e))
            ) from None
        tokens, probs = [t.token for t in result.top_k], [t.prob for t in result.top_k]
        name = "next-token-steered-frozen" if frozen else "next-token"
        out["frozen_figure" if frozen else "figure"] = figures.probability_bars(tokens, probs, export_name=name)
        before = result.steering_effect.baseline_top_k if result.steering_effect else []
    out["caption"] = _(
        "Steered ({steers}), attention recomputed. Unsteered, the most likely next token is “{token}” ({p:.3f})."
    ).format(
        steers="; ".join(describe(s) for s in steers),
        token=figures.visible(before[0].token) if before else "",
        p=before[0].prob if before else 0.0,
    )
    return out


def with_steer(url: str, state: SteerState) -> str:
    """A page's canonical URL with the steers' parameters after its own."""
    params = state.params()
    if not params:
        return url
    return url + ("&" if "?" in url else "?") + urlencode(params)


def editor(svc: Service, model: Model, state: SteerState) -> dict:
    """The editor's choices for this model: its residual-stream hooks, the usable SAEs that read it, and its rows
    (one that steers nothing when the URL has none, for a reader without the script's Add button)."""
    cfg = model.cfg
    hooks = [f"blocks.{layer}.hook_resid_{where}" for layer in range(cfg.n_layers) for where in ("pre", "mid", "post")]
    if cfg.attn_only:
        hooks = [h for h in hooks if not h.endswith("_mid")]
    saes = [s for s in svc.features.list() if s.model == model.name and s.problem is None]
    rows = state.rows or [SteerRow()]
    return {
        "rows": rows,
        "hooks": hooks,
        "saes": saes,
        "modes": MODES,
        "limit": svc.settings.max_steers,
        "blank": SteerRow(),
    }
