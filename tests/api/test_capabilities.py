"""app/service/capabilities.py on every kind of model the catalogue holds: the toy (random weights),
the trained induction model, the spec's model (positions drawn to fit the text), the MiniLM encoder, a
GPT-2 checkpoint (tests/fixtures/gpt2-tiny) and a Llama one with RMS norm, a gated MLP and grouped
keys (tests/fixtures/families/llama-gqa); a decoder run without the causal mask too. Then each service
that asks refuses with the module's reason, word for word, in English and in Malay."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from app.http.language import translations
from app.models.catalog import build_catalog
from app.service import RunSpec, Service, capabilities
from app.service.generation import GenerateSettings
from app.settings import Settings
from core import InputError
from core.i18n import _, using

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
ENCODER = "all-MiniLM-L6-v2"


@pytest.fixture(scope="module")
def catalog(tmp_path_factory):
    models = tmp_path_factory.mktemp("models")
    shutil.copytree(FIXTURES / "gpt2-tiny", models / "gpt2-tiny")
    shutil.copytree(FIXTURES / "families" / "llama-gqa", models / "llama-gqa")
    return build_catalog(Settings(models_dir=models, access_log=False))


def answers(catalog, name: str, causal: bool | None = None) -> dict[str, str | None]:
    model = catalog.get_model(name)
    cfg = model.cfg if causal is None else model.cfg.replace(attention_dir="causal" if causal else "bidirectional")
    return {
        "generation": capabilities.generation(model, cfg),
        "kv_cache": capabilities.kv_cache(model, cfg),
        "gradients": capabilities.gradients(model, cfg),
        "patching": capabilities.patching(model, cfg),
        "decomposition": capabilities.decomposition(model, cfg, "the logit lens"),
        "qk_circuit": capabilities.qk_circuit(model, cfg),
        "ov_circuit": capabilities.ov_circuit(model, cfg),
    }


EVERYTHING = {"generation", "kv_cache", "gradients", "patching", "decomposition", "qk_circuit", "ov_circuit"}


@pytest.mark.parametrize(
    "name, can",
    [
        ("toy", EVERYTHING),
        ("induction", EVERYTHING),  # trained here, by core's backward pass
        ("gpt2-tiny", EVERYTHING),  # layer norm, GELU, pre-norm: what core/backprop.py implements
        # RMS norm, SwiGLU and grouped keys: core/backprop.py has their backward pass too
        ("llama-gqa", EVERYTHING),
        ("spec-forward", EVERYTHING - {"generation"}),  # its position table has one row per token of the text
        # bidirectional, post-norm, segment embeddings: its own figures, and gradients (of what core outputs)
        (ENCODER, {"gradients"}),
    ],
)
def test_what_each_kind_of_model_can_do(catalog, name, can):
    said = answers(catalog, name)
    assert {question for question, reason in said.items() if reason is None} == can, said


def test_each_reason_names_the_model_and_why(catalog):
    encoder = answers(catalog, ENCODER)
    for question in EVERYTHING - {"gradients", "qk_circuit"}:  # the two whose answer follows the config alone
        assert repr(ENCODER) in encoder[question] and "encoder" in encoder[question], question
    assert "post-norm" in encoder["qk_circuit"] and repr(ENCODER) in encoder["qk_circuit"]
    assert encoder["decomposition"].startswith("the logit lens does not apply")
    assert "position table" in answers(catalog, "spec-forward")["generation"]


@pytest.mark.parametrize("name", ["toy", "induction", "gpt2-tiny", "llama-gqa"])
def test_a_decoder_without_the_causal_mask_can_neither_cache_nor_be_patched(catalog, name):
    said = answers(catalog, name, causal=False)
    assert "causal" in said["kv_cache"] and "without the causal mask" in said["patching"]
    # generation turns the mask back on by itself; the decomposition and the circuits read a single pass
    assert said["generation"] is said["decomposition"] is said["qk_circuit"] is said["ov_circuit"] is None
    assert answers(catalog, name, causal=True)["patching"] is None


def test_only_a_decoder_predicts_the_next_token(catalog):
    assert [capabilities.predicts_next_token(catalog.get_model(n)) for n in ("toy", "gpt2-tiny", ENCODER)] == [
        True,
        True,
        False,
    ]


def test_require_raises_a_reason_and_passes_none():
    capabilities.require(None)
    with pytest.raises(InputError, match="^why not$"):
        capabilities.require("why not")


# Each service that decides a capability refuses with the module's answer, word for word.
REFUSALS = {
    "generation": lambda svc, spec: svc.generation.check(spec, GenerateSettings()),
    "kv_cache": lambda svc, spec: svc.inspect.kv_steps(spec, 2),
    "patching": lambda svc, spec: svc.circuits.patching(spec, "a b c", "a", "b", "resid_pre", "denoise", "logit_diff"),
    "decomposition": lambda svc, spec: svc.inspect.decompose(spec, -1, None),
    "logit_lens": lambda svc, spec: svc.inspect.logit_lens(spec, 5),
    "qk_circuit": lambda svc, spec: svc.circuits.qk_circuit(spec, 0, 0, -1, None),
    "ov_circuit": lambda svc, spec: svc.circuits.ov_circuit(spec, 0, 0, 5),
}


def expected(catalog, question: str, name: str, causal: bool | None) -> str:
    model = catalog.get_model(name)
    cfg = model.cfg if causal is None else model.cfg.replace(attention_dir="causal" if causal else "bidirectional")
    if question == "decomposition":
        return capabilities.decomposition(model, cfg, _("the residual-stream decomposition"))
    if question == "logit_lens":
        return capabilities.decomposition(model, cfg, _("the logit lens"))
    return getattr(capabilities, question)(model, cfg)


@pytest.mark.parametrize("lang", ["en", "ms"])
@pytest.mark.parametrize(
    "question, name, causal",
    [
        ("generation", ENCODER, None),
        ("generation", "spec-forward", None),
        ("kv_cache", ENCODER, None),
        ("kv_cache", "toy", False),
        ("patching", ENCODER, None),
        ("patching", "toy", False),
        ("decomposition", ENCODER, None),
        ("logit_lens", ENCODER, None),
        ("qk_circuit", ENCODER, None),
        ("ov_circuit", ENCODER, None),
    ],
)
def test_each_service_refuses_with_the_modules_reason(catalog, question, name, causal, lang):
    svc = Service(catalog, Settings(access_log=False))
    spec = RunSpec(model=name, text=catalog.get_model(name).default_text, causal=causal)
    with using(translations(lang)):
        reason = expected(catalog, question, name, causal)
        assert reason
        with pytest.raises(InputError, match=re.escape(reason)) as refused:
            REFUSALS[question](svc, spec)
    assert str(refused.value) == reason
    if lang == "ms":
        with using(translations("en")):
            assert expected(catalog, question, name, causal) != reason  # the Malay catalogue says it in Malay
