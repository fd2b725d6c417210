"""Words that fit the model: every explanatory sentence that depends on the model is true for the model
shown. The explorer and the Inspect pages are rendered for one model of each kind: random weights (toy,
spec-forward), trained here (induction: attention only; python-docs), a pretrained decoder (a GPT-2
checkpoint folder) and a pretrained encoder (all-MiniLM-L6-v2, post-norm), and the families whose blocks
say otherwise (GPT-NeoX's parallel block, GPT-Neo's unscaled scores and local layers, Mistral's sliding
window). Each page must say the sentences that fit and none of those that would be false.

The lessons are not here: each runs the spec's own model, drawn at random, and says so."""

from __future__ import annotations

import html
import re
import shutil
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

RANDOM = "Random weights: these preferences are noise, not knowledge"
TRAINED = "Weights trained by core.train: the bars are what this model learned to expect"
PRETRAINED = "Pretrained weights, loaded from a checkpoint: the bars are what this model expects"
ENCODER = "is an encoder: it has no next-token prediction."
NO_MLP = "this model's blocks have no MLP"
NO_MLP_WRITES = "Each attention sub-layer adds to the stream (these blocks have no MLP)"
WITH_MLP = "after attention adds to it (mid = resid_mid) and after the MLP adds to it (post = resid_post)"
WITH_MLP_WRITES = "Each attention and MLP sub-layer only adds to the stream"
POST_NORM = "attention's output added and normalised (mid = resid_mid)"
POST_NORM_WRITES = "and a layer norm then rescales the sum"
PARALLEL = "a partial sum: the MLP reads the input too"
PARALLEL_WRITES = "Attention and the MLP both read a layer's input and add to the stream side by side"
CAUSAL = "The causal mask sets every key after the query to −∞ (hatched): a token cannot see the future."
TURN_ON = "No mask: every token may look at every token. Turn on the causal mask to hide the future."
READS_WHOLE = "No mask: this model reads the whole text at once"
WINDOW = "in this local layer, every key more than {back} tokens back"
SCALED = "Every score divided by √d_head"
NOT_SCALED = "Scores are not divided by √d_head here: this stage equals stage 1"
ABLATED = "Hatched grey: the prediction without the ablation; blue: with it."
DETECTORS_RANDOM = "random weights rarely specialise."
DETECTORS_OTHER = "on your text or on the random sequence."
DECOMPOSE_NO_MLP = "every head's output and their biases (this model has no MLP)"
DECOMPOSE_MLP = "every head's output, every MLP's output and their biases"

# Every sentence above that only some models may say: a page says the ones its model fits and none of the rest.
EXPLORER_SENTENCES = [
    RANDOM,
    TRAINED,
    PRETRAINED,
    ENCODER,
    NO_MLP,
    NO_MLP_WRITES,
    WITH_MLP,
    WITH_MLP_WRITES,
    POST_NORM,
    POST_NORM_WRITES,
    PARALLEL,
    PARALLEL_WRITES,
    CAUSAL,
    TURN_ON,
    READS_WHOLE,
    SCALED,
    NOT_SCALED,
    ABLATED,
]


def text_of(page: str) -> str:
    """The page's words as a reader gets them (entities decoded, markup's quotes alike)."""
    return html.unescape(page)


def explorer(client, **params) -> str:
    r = client.get("/", params=params)
    assert r.status_code == 200, r.text[-2000:]
    return text_of(r.text)


def says_exactly(page: str, wanted: list[str]) -> None:
    said = [s for s in EXPLORER_SENTENCES if s in page]
    assert sorted(said) == sorted(wanted), (sorted(set(said) - set(wanted)), sorted(set(wanted) - set(said)))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> Path:
    """An EXPLORER_MODELS_DIR with a GPT-2 checkpoint and three families' (parallel, unscaled and local, windowed)."""
    root = tmp_path_factory.mktemp("models")
    shutil.copytree(FIXTURES / "gpt2-tiny", root / "gpt2-tiny")
    for family in ("gpt-neox-parallel", "gpt-neo-local", "mistral-window"):
        shutil.copytree(FIXTURES / "families" / family, root / family)
    return root


@pytest.fixture
def pretrained(client_with, checkpoints):
    return client_with(models_dir=checkpoints)


def test_random_weights_are_said_to_be_random_and_the_toy_s_numbers_are_its_own(client):
    page = explorer(client, model="toy", text="the cat sat")
    says_exactly(page, [RANDOM, WITH_MLP, WITH_MLP_WRITES, CAUSAL, SCALED])
    assert "a uniform guess would give each of the 96 tokens 0.010" in page  # the toy's vocabulary: 1/96
    page = explorer(client, model="spec-forward", text="nasi lemak")
    assert RANDOM in page and "each of the 9 tokens 0.111" in page


def test_the_toy_s_switches_change_the_sentences_they_touch(client):
    page = explorer(client, model="toy", text="the cat sat", causal="0", scale="0", ablate="0.1")
    says_exactly(page, [RANDOM, ABLATED, WITH_MLP, WITH_MLP_WRITES, TURN_ON, NOT_SCALED])
    page = explorer(client, model="toy", text="the cat sat", scale="0", temperature="2")
    assert "Scores are not divided by √d_head here, only by the temperature 2." in page


@pytest.mark.parametrize(
    ("model", "text", "blocks"),
    [
        ("induction", "abcabc", [NO_MLP, NO_MLP_WRITES]),  # attention only
        ("python-docs", "def f(x):", [WITH_MLP, WITH_MLP_WRITES]),
    ],
)
def test_trained_weights_are_said_to_be_trained(client, model, text, blocks):
    says_exactly(explorer(client, model=model, text=text), [TRAINED, CAUSAL, SCALED, *blocks])


def test_an_encoder_has_no_prediction_no_mask_to_turn_on_and_normalises_its_stream(client):
    page = explorer(client, model="all-MiniLM-L6-v2", text="the cat sat on the mat")
    says_exactly(page, [ENCODER, READS_WHOLE, POST_NORM, POST_NORM_WRITES, SCALED])


def test_a_pretrained_decoder_is_said_to_be_pretrained(pretrained):
    says_exactly(
        explorer(pretrained, model="gpt2-tiny", text="the cat sat"),
        [PRETRAINED, CAUSAL, SCALED, WITH_MLP, WITH_MLP_WRITES],
    )


def test_the_families_blocks_masks_and_scaling_are_said_as_they_are(pretrained):
    says_exactly(
        explorer(pretrained, model="gpt-neox-parallel", text="The cat sat"),
        [PRETRAINED, CAUSAL, SCALED, PARALLEL, PARALLEL_WRITES],
    )
    # GPT-Neo: no √d_head scaling; its layers alternate global and local (window 256 here)
    neo = explorer(pretrained, model="gpt-neo-local", text="The cat sat", layer="1")
    assert NOT_SCALED in neo and SCALED not in neo and PRETRAINED in neo
    window = re.search(r"in this local layer, every key more than (\d+) tokens back", neo)
    assert window and CAUSAL not in neo
    assert CAUSAL in explorer(pretrained, model="gpt-neo-local", text="The cat sat", layer="0")  # a global layer
    mistral = explorer(pretrained, model="mistral-window", text="The cat sat on the mat")
    assert re.search(r"every key more than \d+ tokens back: a token sees itself and the \d+ before it", mistral)


@pytest.mark.parametrize(
    ("model", "text", "random"),
    [
        ("toy", "the cat sat on the mat", True),
        ("induction", "abcabcabc", False),
        ("all-MiniLM-L6-v2", "the cat sat on the mat", False),
    ],
)
def test_the_detectors_blame_random_weights_only_when_they_are_random(client, model, text, random):
    r = client.get("/inspect", params={"view": "detectors", "model": model, "text": text, "threshold": "1"})
    page = text_of(r.text)
    assert r.status_code == 200 and "No head reaches 1" in page
    assert (DETECTORS_RANDOM in page) is random and (DETECTORS_OTHER in page) is not random


@pytest.mark.parametrize(
    ("model", "text", "sentence", "not_said"),
    [
        ("induction", "abcabc", DECOMPOSE_NO_MLP, DECOMPOSE_MLP),
        ("python-docs", "def f(x):", DECOMPOSE_MLP, DECOMPOSE_NO_MLP),
        ("toy", "the cat sat", DECOMPOSE_MLP, DECOMPOSE_NO_MLP),
    ],
)
def test_the_decomposition_lists_the_parts_this_model_has(client, model, text, sentence, not_said):
    r = client.get("/inspect", params={"view": "decompose", "model": model, "text": text})
    page = text_of(r.text)
    assert r.status_code == 200 and sentence in page and not_said not in page


def test_a_long_text_s_head_cards_say_the_four_stages_come_on_request(client):
    page = explorer(client, model="toy", text=("the cat sat on the mat. " * 11)[:256])
    assert "pick one to see its weights (tick “All four stages” for its scores too)" in page
    assert "pick one to see its four stages" in explorer(client, model="toy", text="the cat sat")
