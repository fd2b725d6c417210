"""One explorer page per decoder family in a real browser: Llama, Mistral, Qwen2, Qwen3, GPT-NeoX and
GPT-Neo checkpoints (tests/fixtures/families/) served from EXPLORER_MODELS_DIR by a real server.

Each page draws its head cards, labelled with the key/value head each query head reads under
grouped-query attention, and the chosen head's weights heatmap, whose rows are the tokens and sum to 1.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from .conftest import SERVER_START_TIMEOUT_S, liveserver
from .test_explorer import FIGURE

pytestmark = pytest.mark.browser

FAMILIES = Path(__file__).resolve().parents[1] / "fixtures" / "families"
ONE_PER_FAMILY = ["llama-gqa", "mistral-window", "qwen2-sliding", "qwen3-qk-norm", "gpt-neox-parallel",
                  "gpt-neo-local"]
TEXT = "The cat sat on the mat"


@pytest.fixture(scope="module")
def families_server(tmp_path_factory):
    """A real server whose EXPLORER_MODELS_DIR holds one checkpoint of each family."""
    models = tmp_path_factory.mktemp("models")
    for folder in ONE_PER_FAMILY:
        shutil.copytree(FAMILIES / folder, models / folder)
    env = {"EXPLORER_ACCESS_LOG": "false", "EXPLORER_MODELS_DIR": str(models)}
    with liveserver.live_server(env=env, startup_timeout_s=SERVER_START_TIMEOUT_S) as server:
        yield server.url


@pytest.mark.parametrize("folder", ONE_PER_FAMILY)
def test_each_familys_explorer_labels_shared_kv_heads_and_draws_the_weights(page, families_server, folder):
    config = json.loads((FAMILIES / folder / "config.json").read_text())
    n_heads = config.get("num_attention_heads") or config["num_heads"]
    n_kv = config.get("num_key_value_heads") or n_heads
    page.goto(f"{families_server}/?model={folder}&text={TEXT.replace(' ', '+')}")
    page.wait_for_function(f"() => ({FIGURE})('stage-weights') !== null")
    n_tokens = page.locator(".tokens .tok").count()
    assert n_tokens >= len(TEXT.split())
    # one card per query head, each drawn; under grouped-query attention each names its K/V head
    assert page.locator(".head-grid .head").count() == n_heads
    page.wait_for_function(f"() => document.querySelectorAll('.head-grid .plot-thumb .main-svg').length >= {n_heads}")
    names = page.locator(".head-grid .head-name").all_inner_texts()
    if n_kv != n_heads:
        group = n_heads // n_kv
        assert names == [f"head {h} KV {h // group}" for h in range(n_heads)]
        config_line = page.locator(".summary .config").inner_text()
        assert f"{n_heads} query heads share {n_kv} K/V head{'s' if n_kv > 1 else ''}" in config_line
    else:
        assert names == [f"head {h}" for h in range(n_heads)]
    # the chosen head's weights heatmap is drawn: one row per token, each a distribution
    drawn = page.evaluate(FIGURE, "stage-weights")
    assert len(drawn["z"]) == n_tokens and drawn["yticks"] and "heatmap" in drawn["traces"]
    assert all(abs(sum(v for v in row if v is not None) - 1) < 1e-6 for row in drawn["z"])
    assert page.watch.page_errors == [] and page.watch.console_errors == []
