"""Each set of knobs is declared once: the run's toggles in app/models/knobs.py, the training settings in
core/recipes.py (TrainSettings). Everything else derives from the declaration, so no other place may
spell a set out again.

The rule counted: a display (a tuple, list, set or dict literal, with what it nests: ("n_heads",
"Heads") pairs, a dict's keys) or a template tag that names three or more of a set's names as string
literals spells that set out. One name alone is a use of that knob for what it means ("causal" in
model.toggles: the compare view flips the mask), and attribute access (spec.causal) is no spelling.
Example requests (under "examples") are data and do not count. Names that are also TransformerConfig
fields (n_heads, d_model, ...) are not counted in core/, which validates its own config by those names;
in app/ every run toggle's name counts.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

from app.models import knobs
from core import TransformerConfig, recipes
from core.sae import SAEConfig

ROOT = Path(__file__).resolve().parent.parent
CONFIG_FIELDS = {f.name for f in dataclasses.fields(TransformerConfig)}
RUN = set(knobs.names())
SAE_CFG_FIELDS = {f.name for f in dataclasses.fields(SAEConfig)}  # SAELens's cfg.json names (architecture, d_sae...)
# steps, seed, batch_size, lr, ...: a model's config and an SAE's cfg.json name some of them too, as their own
TRAIN = {f.name for f in recipes.setting_fields()} - CONFIG_FIELDS - SAE_CFG_FIELDS
AT_LEAST = 3  # names of one set in one display: that set spelled out


def _strings(node: ast.AST, nested: set[int]) -> list[str]:
    """The string literals a display holds, its nested displays' included (marked as seen)."""
    out: list[str] = []
    items = [k for k in node.keys if k is not None] if isinstance(node, ast.Dict) else node.elts
    if isinstance(node, ast.Dict):
        items += [
            v for k, v in zip(node.keys, node.values) if not (isinstance(k, ast.Constant) and k.value == "examples")
        ]
    for item in items:
        if isinstance(item, ast.Constant) and isinstance(item.value, str):
            out.append(item.value)
        elif isinstance(item, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
            nested.add(id(item))
            out += _strings(item, nested)
    return out


def spellings(path: Path, names: set[str], root: Path = ROOT) -> list[str]:
    """Where a Python file names AT_LEAST of `names` in one display: "file:line: the names"."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nested: set[int] = set()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "examples":
            nested |= {id(n) for n in ast.walk(node.value)}
        if isinstance(node, ast.Dict):
            nested |= {
                id(n)
                for k, v in zip(node.keys, node.values)
                if isinstance(k, ast.Constant) and k.value == "examples"
                for n in ast.walk(v)
            }
        if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)) and id(node) not in nested:
            named = sorted(set(_strings(node, nested)) & names)
            if len(named) >= AT_LEAST:
                found.append((node.lineno, f"{path.relative_to(root)}:{node.lineno}: {', '.join(named)}"))
    return [where for _, where in sorted(found)]


def template_spellings(path: Path, names: set[str], root: Path = ROOT) -> list[str]:
    text = path.read_text(encoding="utf-8")
    found = []
    for tag in re.finditer(r"\{[{%].*?[%}]\}", text, re.S):
        named = sorted(set(re.findall(r"""['"](\w+)['"]""", tag.group(0))) & names)
        if len(named) >= AT_LEAST:
            found.append(f"{path.relative_to(root)}:{text.count(chr(10), 0, tag.start()) + 1}: {', '.join(named)}")
    return found


def sources(root: Path = ROOT) -> dict[str, list[Path]]:
    return {
        "app": sorted((root / "app").rglob("*.py")),
        "core": sorted((root / "core").rglob("*.py")),
        "templates": sorted((root / "templates").rglob("*.html")),
    }


def spelled_out(root: Path = ROOT) -> dict[str, list[str]]:
    """Every place outside its declaration that spells out the run's toggles or the training settings."""
    files = sources(root)
    knobs_file, recipes_file = root / "app" / "models" / "knobs.py", root / "core" / "recipes.py"
    run = [s for p in files["app"] if p != knobs_file for s in spellings(p, RUN, root)]
    run += [s for p in files["core"] for s in spellings(p, RUN - CONFIG_FIELDS, root)]
    run += [s for p in files["templates"] for s in template_spellings(p, RUN, root)]
    train = [s for p in files["app"] + files["core"] if p != recipes_file for s in spellings(p, TRAIN, root)]
    train += [s for p in files["templates"] for s in template_spellings(p, TRAIN, root)]
    return {"run toggles": run, "training settings": train}


def test_the_run_toggles_and_the_training_settings_are_spelled_out_only_where_declared():
    assert spelled_out() == {"run toggles": [], "training settings": []}


def test_the_rule_finds_a_set_spelled_out(tmp_path):
    """What the rule counts, on the kinds of places the declarations replaced (their old code)."""
    (tmp_path / "app" / "pages").mkdir(parents=True)
    (tmp_path / "core").mkdir()
    (tmp_path / "templates").mkdir()
    (tmp_path / "app" / "pages" / "web.py").write_text(
        'TOGGLES = ("causal", "scale", "temperature")\n'
        'SIZES = [(name, label) for name, label in (("n_heads", "Heads"), ("d_model", "Width"), ("seed", "Seed"))]\n'
        'def defaults(cfg):\n    return {"causal": cfg.causal, "scale": cfg.scale, "n_layers": cfg.n_layers}\n'
        'ONE = "causal" in ("causal", "seed")\n'  # two names: a use, not the set
        'EXAMPLE = dict(examples=[{"causal": False, "n_heads": 2, "seed": 3}])\n'
    )  # a sample request
    (tmp_path / "core" / "train.py").write_text(
        'FIELDS = ("d_model", "n_layers", "n_heads")\n'  # the config's own names, in core
        'OPTIONS = (("steps", int), ("seed", int), ("batch_size", int))\n'
    )
    (tmp_path / "templates" / "train.html").write_text(
        '{% for name in ("steps", "lr", "seq_len") %}{{ name }}{% endfor %}'
    )
    found = spelled_out(tmp_path)
    assert [s.split(":")[:2] for s in found["run toggles"]] == [
        ["app/pages/web.py", "1"],
        ["app/pages/web.py", "2"],
        ["app/pages/web.py", "4"],
    ]
    assert [s.split(":")[:2] for s in found["training settings"]] == [
        ["core/train.py", "2"],
        ["templates/train.html", "1"],
    ]
