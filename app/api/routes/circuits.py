"""The circuits endpoints under /api/v1/analysis: why a head attends and what it causes.

    POST /analysis/patching     activation patching, a sweep of one patched run per cell
    POST /analysis/qk-circuit   one pre-softmax score split into query part × key part terms
    POST /analysis/composition  Q-, K- and V-composition between every pair of heads
    POST /analysis/ov-circuit   a head's OV circuit through the unembedding, and its copying score

Request model (app/api/circuit_models.py) -> service (app/service/circuits.py) -> response model -> JSON, as
every route of app/api/routes/. Each is priced before it runs (a sweep: its patched runs against
settings.patching_max_passes, and its work against the cost limits): 422 saying what was asked and the limit.
"""

from __future__ import annotations

from app.api.circuit_models import (
    CompositionRequest,
    CompositionResponse,
    OVCircuitRequest,
    OVCircuitResponse,
    PatchingRequest,
    PatchingResponse,
    QKCircuitRequest,
    QKCircuitResponse,
)
from app.api.routes.shared import api_router, errors, respond
from app.deps import ServiceDep
from app.http.jsonio import FastJSONResponse

router = api_router()
_DECODERS = (
    "Causal pre-norm decoders only: an encoder (all-MiniLM-L6-v2) or a run without the causal mask answers "
    "422 saying why."
)


@router.post(
    "/analysis/patching",
    response_model=PatchingResponse,
    responses=errors(422),
    summary="Activation patching: which activations carry the behaviour from a clean text to a corrupted one",
    description="Runs `clean` and `corrupted` (the same number of tokens), then, for every cell of the "
    "`target`'s grid, one of them again with that activation taken from the other (`denoise`: "
    "into the corrupted run; `noise`: into the clean run), measuring `metric` at the last "
    "position. `grid` is normalised so that 0 is the corrupted run and 1 the clean run; "
    "`raw_grid` holds the metric itself. A patched run starts at the patched layer and, for "
    "one position, at that position (the earlier ones' keys and values are the unpatched "
    "run's). With `frozen_attention`, every later attention pattern keeps its unpatched value. "
    "The sweep's patched runs are counted before anything runs (at most the server's "
    "patching_max_passes, stated under `target`; 422 naming how many were asked), and so is its "
    "work (multiply-adds, against the server's cost limits). With `method: attribution` every cell is "
    "instead estimated to first order from one forward and backward pass (attribution patching: the "
    "activation's change times the metric's gradient in the run patched into), in the same units. " + _DECODERS,
)
def patching(req: PatchingRequest, svc: ServiceDep) -> FastJSONResponse:
    [view] = svc.circuits.patching(
        req.spec(),
        req.corrupted,
        req.answer,
        req.wrong,
        req.target,
        req.direction,
        req.metric,
        (req.frozen_attention,),
        req.method,
    )
    return respond(PatchingResponse, view)


@router.post(
    "/analysis/qk-circuit",
    response_model=QKCircuitResponse,
    responses=errors(422),
    summary="Why a head attends: one score split into query part × key part terms",
    description="The residual stream before `layer` at the query and at the key is a sum of what wrote it "
    "(token and position embeddings, each earlier head, each MLP, biases). With each norm's "
    "scale frozen at the run's value, the head's pre-softmax score is exactly a sum of query "
    "part × key part terms (`contributions`), which add up to `score`. Rotary positions turn "
    "each part's query by the query's position and each key part by the key's. Pre-norm "
    "models only.",
)
def qk_circuit(req: QKCircuitRequest, svc: ServiceDep) -> FastJSONResponse:
    return respond(QKCircuitResponse, svc.circuits.qk_circuit(req.spec(), req.layer, req.head, req.query, req.key))


@router.post(
    "/analysis/composition",
    response_model=CompositionResponse,
    responses=errors(422),
    summary="How heads compose: Q-, K- and V-composition between every pair of heads in different layers",
    description="For an earlier head's W_OV = W_V W_O and a later head's W_QK = W_Q W_Kᵀ (or its W_OV), the "
    'score ‖W_A W_B‖_F / (‖W_A‖_F ‖W_B‖_F) of "A Mathematical Framework for Transformer '
    "Circuits\", with each norm's gain folded into the matrices that read it and the writing "
    "matrices centred (layer norm). `baseline` is the same score for random matrices of the same "
    "shapes: a score well above it is a path the weights prepared. Rotary positions and biases "
    "are left out.",
)
def composition(req: CompositionRequest, svc: ServiceDep) -> FastJSONResponse:
    return respond(CompositionResponse, svc.circuits.composition(req.spec()))


@router.post(
    "/analysis/ov-circuit",
    response_model=OVCircuitResponse,
    responses=errors(422),
    summary="What a head writes: its OV circuit through the unembedding, and its copying score",
    description="A source token's embedding through the head's W_V W_O and the unembedding (norm gains "
    "folded in, layer-norm centring, positions and scales aside): the logits the head raises "
    "when it attends to that token. The copying score is Σλ / Σ|λ| over the eigenvalues of the "
    "whole vocabulary's circuit W_E W_V W_O W_U, computed from a d_head × d_head matrix. "
    "Pre-norm decoders only.",
)
def ov_circuit(req: OVCircuitRequest, svc: ServiceDep) -> FastJSONResponse:
    return respond(OVCircuitResponse, svc.circuits.ov_circuit(req.spec(), req.layer, req.head, req.top_k))
