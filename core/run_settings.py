"""The settings of a training run, whichever its recipe: a model's (core/recipes.py) or the sae recipe's, an SAE on
one hook of a model (core/sae_run.py). Here, above both: the SAE's trainer builds on the recipes, which need not
know it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .errors import InputError
from .i18n import _
from .recipes import DEFAULTS, TrainSettings, model_settings
from .sae_run import sae_settings

ALL_RECIPES = (*DEFAULTS, "sae")


def given_settings(recipe: str, changes: dict[str, Any]) -> dict[str, Any]:
    """`changes` checked against the settings there are, None values dropped; `recipe` checked too."""
    if recipe not in ALL_RECIPES:
        raise InputError(
            _("recipe {recipe!r} is not one of {choices}").format(recipe=recipe, choices=", ".join(ALL_RECIPES))
        )
    fields = {f.name for f in dataclasses.fields(TrainSettings)} - {"recipe"}
    unknown = sorted(set(changes) - fields)
    if unknown:
        raise InputError(
            _("unknown setting {unknown}: the settings are {choices}").format(
                unknown=", ".join(unknown), choices=", ".join(sorted(fields))
            )
        )
    return {k: v for k, v in changes.items() if v is not None}


def settings(recipe: str, **changes) -> TrainSettings:
    """The recipe's defaults with `changes` applied (None values are ignored), checked (InputError says what to
    change). An SAE on a model run, whose weights' digest is one of its settings: sae_run.sae_settings."""
    given = given_settings(recipe, changes)
    return sae_settings(given) if recipe == "sae" else model_settings(recipe, **given)
