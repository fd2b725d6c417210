"""Looking inside a run, under /api/v1/analysis: the residual stream decomposed with each part's direct
logit, the logit lens, the head detectors, KV-cache stepping, two settings compared, attention rollout
(the Inspect page's views as JSON; app/service/inspect.py computes them), and token attribution
(app/service/attribution.py)."""

from __future__ import annotations

from app.api import requests, responses
from app.api.attribution_models import AttributionRequest, AttributionResponse
from app.api.routes.shared import api_router, errors, respond
from app.deps import ServiceDep
from app.http.jsonio import FastJSONResponse

router = api_router()

_ENCODERS = (
    "Encoders (all-MiniLM-L6-v2) and post-norm models answer 422 saying why: they predict no next "
    "token and have no final layer norm to read the residual stream through."
)


@router.post(
    "/analysis/decompose",
    response_model=responses.DecomposeResponse,
    responses=errors(422),
    summary="Residual-stream decomposition and direct logit attribution at one position",
    description="The last residual stream at `pos` as the sum of what wrote it (embeddings, every head, "
    "every MLP, biases), and each part's direct contribution to the `target` token's logit, with "
    "the final layer norm's σ frozen from the run: `sum(direct_logit) + logit_bias == logit`. " + _ENCODERS,
)
def decompose(req: requests.DecomposeRequest, svc: ServiceDep) -> FastJSONResponse:
    return respond(responses.DecomposeResponse, svc.inspect.decompose(req.spec(), req.pos, req.target))


@router.post(
    "/analysis/logit-lens",
    response_model=responses.LogitLensResponse,
    responses=errors(422),
    summary="Logit lens: the top tokens the residual stream predicts after every layer",
    description="Each layer's `resid_pre` and `resid_mid`, and the last `resid_post`, passed through the "
    "final layer norm and the unembedding as if the remaining layers were deleted. The last "
    "point is the model's own prediction (equal to `/run`'s `top_k` at the last position). " + _ENCODERS,
)
def logit_lens(req: requests.LogitLensRequest, svc: ServiceDep) -> FastJSONResponse:
    return respond(responses.LogitLensResponse, svc.inspect.logit_lens(req.spec(), req.top_k))


@router.post(
    "/analysis/detectors",
    response_model=responses.DetectorsResponse,
    responses=errors(422),
    summary="Previous-token, duplicate-token and induction scores of every head",
)
def detectors(req: requests.DetectorsRequest, svc: ServiceDep) -> FastJSONResponse:
    """A head's score is its mean attention on the keys the detector names (1.0: only there), over the
    queries that have such a key: the token before (previous_token), earlier copies of the same token
    (duplicate_token), the tokens that followed earlier copies (induction). Computed on the text and on a
    random sequence repeated once, where the second half is predictable only by induction. Works on every
    model, encoders included."""
    return respond(
        responses.DetectorsResponse,
        svc.inspect.detectors(req.spec(), req.random_length, req.random_seed, req.threshold),
    )


@router.post(
    "/analysis/kv-cache",
    response_model=responses.KVStepsResponse,
    responses=errors(422),
    summary="Generate token by token with a KV cache: shapes, bytes, and agreement with recomputation",
)
def kv_cache_steps(req: requests.KVStepsRequest, svc: ServiceDep) -> FastJSONResponse:
    """Reads the text one token at a time, then greedily generates `n_new` tokens, keeping every layer's K
    and V. Each step appends one row to K and V; `max_abs_diff` compares that step's logits with a full
    recomputation of the whole sequence (it is 0 up to floating-point rounding). Causal decoders only
    (422 otherwise, saying why)."""
    return respond(responses.KVStepsResponse, svc.inspect.kv_steps(req.spec(), req.n_new))


@router.post(
    "/analysis/compare",
    response_model=responses.CompareResponse,
    responses=errors(422),
    summary="One head's attention pattern under two texts or two settings, and their difference",
)
def compare(req: requests.CompareRequest, svc: ServiceDep) -> FastJSONResponse:
    """Side `a` is the request's own settings; side `b` is the same with `other`'s fields changed (a text,
    the mask, the scale, the temperature, the positions, the seed, or the ablated heads). `difference` is
    b − a, when both have as many tokens."""
    return respond(responses.CompareResponse, svc.inspect.compare(req.spec(), req.other.changes(), req.layer, req.head))


@router.post(
    "/analysis/rollout",
    response_model=responses.RolloutResponse,
    responses=errors(422),
    summary="Attention rollout: how much each input token flows into each position, layer by layer",
)
def rollout(req: requests.RolloutRequest, svc: ServiceDep) -> FastJSONResponse:
    """Abnar & Zuidema (2020): per layer, the heads' mean pattern plus the identity (the residual
    connection), rows renormalised, multiplied through the layers. Works on every model."""
    return respond(responses.RolloutResponse, svc.inspect.rollout(req.spec()))


@router.post(
    "/analysis/attribution",
    response_model=AttributionResponse,
    responses=errors(422),
    summary="Token attribution: which tokens made the model predict the target at a position",
    description="The metric is logit(target) at `position` (minus logit(contrast) when given), a function of "
    "the token embeddings before positions are added (as Captum's embedding-layer attributions read them). "
    "saliency, input_x_gradient and integrated_gradients take its gradient (core's backward pass: checked "
    "against torch autograd and Captum); occlusion zeroes one token's embedding at a time; direct_logit splits "
    "it by head and source token through each head's OV circuit, with the other parts summing to the metric "
    "exactly. 422 with the reason for an encoder without a language-model head, a model whose gradients core "
    "does not compute yet (gradient methods and occlusion), an unknown target or contrast token, a position "
    "outside the text, or a request over the work limit (integrated gradients: steps × a backward pass).",
)
def attribution(req: AttributionRequest, svc: ServiceDep) -> FastJSONResponse:
    return respond(
        AttributionResponse,
        svc.attribution.attribute(req.spec(), req.method, req.position, req.target, req.contrast, req.steps),
    )
