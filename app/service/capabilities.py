"""What a model can do, and why not, decided in one place: can it write (generation, stepping with a KV
cache), give gradients (training, and attribution to come), be patched, be decomposed (the residual
stream read through the final norm and the unembedding: direct logit attribution and the logit lens;
a head's QK and OV circuits)?

Each question takes the model (what it is: an encoder, the spec's model whose positions fit the text)
and the config it runs with (the request's toggles applied, so causal=false counts) and answers None
when the model can, or the reason it cannot, in the reader's language, saying what to choose instead.
`require` raises a reason as InputError (422); a page shows it in place of the figure.

    reason = capabilities.generation(model, cfg)          # None: it can write
    capabilities.require(capabilities.patching(st.model, st.cfg))

The answers follow the architecture: an encoder (BERT-style, all-MiniLM-L6-v2) predicts no next token
and is post-norm, so it has no final layer norm to read the residual stream through; a decoder run
without the causal mask predicts nothing either, and caches nothing; gradients exist for what
core/backprop.py implements (its TRAINABLE table: today every family core runs, BERT's encoder with the
logits core gives it, its last stream times W_E transposed).
"""

from __future__ import annotations

from app.models.catalog import Model
from core import InputError, TransformerConfig
from core.backprop import check_trainable
from core.i18n import _
from core.patching import require_causal_decoder


def require(reason: str | None) -> None:
    """Refuse (InputError, a 422) when there is a reason."""
    if reason:
        raise InputError(reason)


def predicts_next_token(model: Model) -> bool:
    """A decoder predicts the next token at every position (the top-k, an ablation's effect on it); an
    encoder predicts nothing."""
    return not model.is_encoder


def generation(model: Model, cfg: TransformerConfig) -> str | None:
    """Why this model cannot write (POST /api/v1/generate, the /generate page), or None."""
    if model.is_encoder:
        return _(
            "{model!r} is an encoder (BERT-style): it was trained to fill in masked words seeing both ways, "
            "not to predict the next token, so it cannot write. Choose a decoder such as 'toy' or a GPT-2, "
            "Llama or Qwen checkpoint"
        ).format(model=model.name)
    if model.make_cfg is not None:  # the spec's model: its position table is drawn to fit each text
        return _(
            "{model!r} draws its position table with exactly one row per token of the text (as the spec's "
            "snippet does), so it has no position left to write into. Choose 'toy' or a trained model such "
            "as 'python-docs'"
        ).format(model=model.name)
    return None


def kv_cache(model: Model, cfg: TransformerConfig) -> str | None:
    """Why stepping token by token with a KV cache cannot run on this model and setting, or None."""
    if model.is_encoder:
        return _(
            "{model!r} is an encoder: it generates nothing, and its bidirectional attention lets every new "
            "token change the earlier positions, so nothing could be cached. Choose a decoder such as "
            "'toy'"
        ).format(model=model.name)
    if not cfg.causal:
        return _(
            "a KV cache needs the causal mask: without it every new token changes the earlier positions "
            "too, so nothing can be reused. Turn causal back on"
        )
    return None


def gradients(model: Model, cfg: TransformerConfig) -> str | None:
    """Why core's backward pass cannot give this configuration's gradients (what training follows), or None:
    every field core/backprop.py does not implement, and what to change."""
    try:
        check_trainable(cfg)
    except InputError as refused:
        return str(refused)
    return None


def patching(model: Model, cfg: TransformerConfig) -> str | None:
    """Why activation patching cannot run on this model and setting, or None: it measures the next-token
    prediction at the last position, which a causal pre-norm decoder makes."""
    if model.is_encoder:
        return _(
            "activation patching measures the next-token prediction at the last position; "
            "{model!r} is an encoder, which predicts no next token: choose a decoder such as "
            "'induction' or 'toy'"
        ).format(model=model.name)
    try:
        require_causal_decoder(cfg)  # core's own check, which core's patching makes again
    except InputError as refused:
        return str(refused)
    return None


def steering(model: Model, cfg: TransformerConfig) -> str | None:
    """Why this model cannot be steered, or None: a steered run predicts the next token at the last position
    through the final norm, which a causal pre-norm decoder makes."""
    if model.is_encoder:
        return _(
            "steering changes the next-token prediction; {model!r} is an encoder, which predicts no next "
            "token: choose a decoder such as 'induction' or 'toy'"
        ).format(model=model.name)
    try:
        require_causal_decoder(cfg, _("steering"))
    except InputError as refused:
        return str(refused)
    return None


def decomposition(model: Model, cfg: TransformerConfig, what: str) -> str | None:
    """Why `what` (the residual-stream decomposition with its direct logits, the logit lens) cannot run on
    this model, or None. Both read the residual stream through the final layer norm and the unembedding,
    which only a pre-norm decoder has."""
    if model.is_encoder:
        return _(
            "{what} does not apply to {model!r}: it is an encoder (BERT-style), which predicts no next "
            "token, and post-norm, so it has no final layer norm and unembedding to read the residual stream "
            "through. Choose a decoder such as 'toy' (detectors and rollout do work on encoders)"
        ).format(what=what, model=model.name)
    if cfg.block_type != "pre_norm":
        return _(
            "{what} needs a pre-norm model (GPT-2 style, with a final layer norm); {model!r} is post-norm, "
            "whose residual stream is re-normalised in every block"
        ).format(what=what, model=model.name)
    return None


def qk_circuit(model: Model, cfg: TransformerConfig) -> str | None:
    """Why a head's pre-softmax score cannot be split into query part × key part terms, or None: the parts
    are what wrote the residual stream, which a post-norm block re-normalises."""
    if cfg.block_type != "pre_norm":
        return _(
            "the QK decomposition splits the residual stream into what wrote it, which needs a "
            "pre-norm model; {model!r} is post-norm (its stream is re-normalised in every block): "
            "choose a decoder such as 'induction'"
        ).format(model=model.name)
    return None


def ov_circuit(model: Model, cfg: TransformerConfig) -> str | None:
    """Why a head's OV circuit cannot be read through the final norm and the unembedding, or None."""
    if model.is_encoder or cfg.block_type != "pre_norm":
        return _(
            "the OV circuit reads a head's output through the final norm and the "
            "unembedding; {model!r} is an encoder (post-norm): choose a decoder "
            "such as 'induction'"
        ).format(model=model.name)
    return None
