"""docs/deployment.md's "## Settings" table lists every field of app.settings.Settings by its environment name,
with its default, so an operator never has to read the code to configure a container."""

from __future__ import annotations

import re
from pathlib import Path

from app.settings import Settings

DOC = Path(__file__).resolve().parents[2] / "docs" / "deployment.md"
ROW = re.compile(r"^\| `(EXPLORER_[A-Z0-9_]+)` \| `([^`]*)` \| (.+) \|$")


def _documented() -> dict[str, str]:
    text = DOC.read_text()
    section = text.split("\n## Settings\n", 1)[1].split("\n## ", 1)[0]
    return {m.group(1): m.group(2) for m in map(ROW.match, section.splitlines()) if m}


def _shown(default) -> str:
    return "unset" if default is None else str(default).lower() if isinstance(default, bool) else str(default)


def expected_rows() -> str:
    """The rows to paste when a setting is added (the description column is yours to write)."""
    return "\n".join(
        f"| `EXPLORER_{name.upper()}` | `{_shown(field.default)}` | {field.description or '...'} |"
        for name, field in Settings.model_fields.items()
    )


def test_every_setting_is_documented_with_its_default():
    expected = {f"EXPLORER_{name.upper()}": _shown(f.default) for name, f in Settings.model_fields.items()}
    assert _documented() == expected, (
        f"docs/deployment.md's Settings table is out of date; expected rows:\n{expected_rows()}"
    )
