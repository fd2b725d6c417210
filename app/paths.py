"""Where templates and static files live: inside the package when installed from a wheel,
at the top of the repository when run from a checkout."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def _find(name: str) -> Path:
    for candidate in (_PACKAGE / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise RuntimeError(f"cannot find the {name}/ folder next to {_PACKAGE}")


TEMPLATES_DIR = _find("templates")
STATIC_DIR = _find("static")
