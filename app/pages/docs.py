"""/docs: Swagger UI over /openapi.json, fully offline.

The page loads Swagger UI from /static/vendor (copied from the pinned npm package by make)
and starts it from static/js/docs.js, so it needs no CDN and no inline script.
"""

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from app.pages import web

router = APIRouter(tags=["docs"])


@router.get("/docs", response_class=HTMLResponse, include_in_schema=False)
def docs(request: Request) -> Response:
    return web.templates.TemplateResponse(
        request, "docs.html", {"openapi_url": request.app.openapi_url, "title": request.app.title}
    )
