"""Sparse autoencoders (EXPLORER_SAES_DIR, app/models/saes.py) and their features.

GET  /saes                          the SAEs, and why one cannot be used
POST /analysis/features             a text's features: each token's non-zero features, largest first
GET  /saes/{name}/features/{index}  a feature's dashboard (top examples, histogram, density, logit effect)
GET  /saes/{name}/download          the SAE's folder as a zip (SAELens's SAE.load_from_disk reads it)
POST /analysis/steering-vector      a direction from two sets of texts (a difference of means), to steer with
"""

from __future__ import annotations

import io
import zipfile
from typing import Annotated

from fastapi import Path
from fastapi.responses import Response

from app.api.routes.shared import api_router, errors, respond
from app.api.sae_models import (
    MAX_FEATURE_INDEX,
    FeatureDashboardResponse,
    FeaturesRequest,
    FeaturesResponse,
    SAEsResponse,
    SteeringVectorRequest,
    SteeringVectorResponse,
)
from app.deps import ServiceDep
from app.http.jsonio import FastJSONResponse

router = api_router()
SAEName = Annotated[str, Path(min_length=1, max_length=200, description="an SAE's name, from GET /api/v1/saes")]


@router.get("/saes", response_model=SAEsResponse, summary="The sparse autoencoders this server has")
def saes(svc: ServiceDep) -> FastJSONResponse:
    """Every folder of EXPLORER_SAES_DIR in SAELens's format, with the model and hook it reads, its size, the
    features its labels.json names, and `problem` when it cannot be used (a folder that does not load, a model
    this server does not have, a hook of another width)."""
    return respond(SAEsResponse, {"saes": svc.features.list()})


@router.post(
    "/analysis/features",
    response_model=FeaturesResponse,
    responses=errors(422),
    summary="A text's SAE features: each token's non-zero features, largest first",
    description="Runs the model once keeping the SAE's hook and encodes it with the SAE (SAELens's `encode`). "
    "422 with the reason for an unknown SAE, one for another model or a hook this model does not have, "
    "or a d_in other than the hook's width.",
)
def features(req: FeaturesRequest, svc: ServiceDep) -> FastJSONResponse:
    return respond(FeaturesResponse, svc.features.features(req.spec(), req.sae, req.top_k))


@router.get(
    "/saes/{name}/features/{index}",
    response_model=FeatureDashboardResponse,
    responses=errors(422),
    summary="A feature's dashboard: top examples, activation histogram, density, logit effect, label",
    description="Read from a scan of the SAE's model's own text (the training text where the model says so), "
    "at most the server's sae_scan_max_tokens tokens, made once per SAE and kept. 422 with the reason for "
    "an unknown SAE or a feature index out of range.",
)
def dashboard(
    name: SAEName,
    index: Annotated[int, Path(ge=0, le=MAX_FEATURE_INDEX, description="counted from 0, below the SAE's d_sae")],
    svc: ServiceDep,
) -> FastJSONResponse:
    return respond(FeatureDashboardResponse, svc.features.dashboard(name, index))


@router.get(
    "/saes/{name}/download",
    responses={**errors(422), 200: {"content": {"application/zip": {}}, "description": "the SAE's folder"}},
    response_class=Response,
    summary="An SAE's folder as a zip: cfg.json, sae_weights.safetensors and labels.json if it has one",
)
def download(name: SAEName, svc: ServiceDep) -> Response:
    """The folder as SAELens wrote it, under a folder of the SAE's name, for `SAE.load_from_disk` (422 when the
    folder has no cfg.json or weights)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        for path in svc.features.files(name):
            z.write(path, f"{name}/{path.name}")
    return Response(
        buffer.getvalue(),
        media_type="application/zip",
        headers={"content-disposition": f'attachment; filename="{name}.zip"'},
    )


@router.post(
    "/analysis/steering-vector",
    response_model=SteeringVectorResponse,
    responses=errors(422),
    summary="A steering vector: the mean activation over one set of texts minus the mean over another",
    description="At a residual-stream `hook`, the mean over every token of every text of `texts_a` minus the same "
    "over `texts_b` (activation addition's direction: Turner et al.; Rimsky et al.). Send it as a steer's `vector` "
    "to POST /api/v1/run or /api/v1/generate. Every text is run once; the whole request is priced first.",
)
def steering_vector(req: SteeringVectorRequest, svc: ServiceDep) -> FastJSONResponse:
    return respond(SteeringVectorResponse, svc.steering.vector(req.spec(), req.hook, req.texts_a, req.texts_b))
