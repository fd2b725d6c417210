"""What a route is given: the settings, the model catalogue and the service, as dependencies.

Each is declared once as an `Annotated` alias (as the FastAPI full-stack template does), so a
route states what it needs in its signature and a test swaps it with `app.dependency_overrides`:

    app.dependency_overrides[get_settings] = lambda: Settings(max_tokens=8)

The catalogue is built once, in the app's lifespan (app/main.py), and kept on `app.state`; a
`Service` is a cheap per-request pairing of it with the settings.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Annotated

from fastapi import Depends, Request

from app.models.catalog import Catalog, build_catalog
from app.service import Service
from app.service.classes import Classes
from app.settings import Settings, get_settings, put_in_effect

SettingsDep = Annotated[Settings, Depends(get_settings)]


async def apply_settings(settings: SettingsDep) -> None:
    """Every route's first dependency (app/main.py): the settings this request is served with become the
    ones its request models validate against (app/settings.py `settings_in_effect`). FastAPI solves the
    dependencies before it validates the query and the body, and awaits this one in the request's own
    context (an `async def`: a plain `def` would run in a worker thread, whose context is a copy), so
    the limits a request is refused by are the injected settings', overrides included."""
    put_in_effect(settings)


def get_catalog(request: Request) -> Catalog:
    return request.app.state.catalog


CatalogDep = Annotated[Catalog, Depends(get_catalog)]


def get_service(catalog: CatalogDep, settings: SettingsDep) -> Service:
    return Service(catalog, settings)


ServiceDep = Annotated[Service, Depends(get_service)]


def get_classes(request: Request) -> Classes:
    """The live classes (app/service/classes.py), opened once in the lifespan like the catalogue."""
    return request.app.state.classes


ClassesDep = Annotated[Classes, Depends(get_classes)]


@lru_cache(maxsize=1)
def standalone_catalog() -> Catalog:
    """The catalogue outside a server (a notebook): built once, with the environment's settings."""
    return build_catalog(get_settings())


def standalone_service() -> Service:
    """A Service as a request gets it, for code that runs without the server (app/pages/notebook.py)."""
    return Service(standalone_catalog(), get_settings())
