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

from app.pages.figures import IMAGE_MIN_TOKENS, MASK_FILL

from .conftest import SERVER_START_TIMEOUT_S, liveserver
from .test_explorer import FIGURE

pytestmark = pytest.mark.browser

FAMILIES = Path(__file__).resolve().parents[1] / "fixtures" / "families"
ONE_PER_FAMILY = ["llama-gqa", "mistral-window", "qwen2-sliding", "qwen3-qk-norm", "gpt-neox-parallel", "gpt-neo-local"]
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


# 64 tokens of mistral-window's tokenizer (its <s> included): its whole context, and IMAGE_MIN_TOKENS.
WINDOW_TEXT = "The quick brown fox jumps over the lazy dog; the cat sat on the mat, and a bird sang. The quick brown"

# The weights figure's mask data and, at each cell's centre, the colour painted into its canvas.
PAINTED = """() => {
  const el = document.querySelector('#stage-weights .plot');
  const canvas = el.querySelector('canvas.matrix-image');
  const area = PlotlyAdapter.plotArea(el), ratio = canvas.width / area.width;
  const n = el._explorerShown.export.shape[0];  // painted from its colour levels (app/pages/figures.py)
  const data = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
  const at = (letter, k) => Math.floor((PlotlyAdapter.dataToPixel(el, letter, k) - area[letter === 'x' ? 'left' : 'top']) * ratio);
  const rgb = [];
  for (let i = 0; i < n; i++) {
    for (let j = 0; j < n; j++) {
      const o = 4 * (at('y', i) * canvas.width + at('x', j));
      rgb.push([i, j, data[o], data[o + 1], data[o + 2]]);
    }
  }
  return {n: n, mask: el._explorerShown.export.mask, rgb: rgb};
}"""


def test_a_sliding_window_is_painted_from_the_figures_mask_data(page, families_server):
    """Mistral's sliding window at its whole context (64 tokens): the weights are painted as an image, and
    the figure says which cells are masked as data, runs of keys per query row (app/pages/figures.py
    _mask_runs): the future, and the keys the window has left behind. Those, and only those, are hatched
    in MASK_FILL's colours."""
    window = json.loads((FAMILIES / "mistral-window" / "config.json").read_text())["sliding_window"]
    page.goto(f"{families_server}/?model=mistral-window&text={WINDOW_TEXT.replace(' ', '+')}")
    page.wait_for_function("() => document.querySelector('#stage-weights .plot canvas.matrix-image')")
    painted = page.evaluate(PAINTED)
    n = painted["n"]
    assert n == page.locator(".tokens .tok").count() == IMAGE_MIN_TOKENS
    masked = [[j > i or i - j >= window for j in range(n)] for i in range(n)]
    expected_runs = [[i, a, b] for i in range(n) for a, b in ((0, i - window + 1), (i + 1, n)) if a < b]
    assert painted["mask"] == {"runs": expected_runs, "bgcolor": MASK_FILL["bgcolor"], "fgcolor": MASK_FILL["fgcolor"]}
    hexes = {c: tuple(int(MASK_FILL[c][k : k + 2], 16) for k in (1, 3, 5)) for c in ("bgcolor", "fgcolor")}
    for i, j, *rgb in painted["rgb"]:
        if masked[i][j]:
            assert tuple(rgb) == hexes["fgcolor" if (i + j) % 4 == 0 else "bgcolor"], (i, j, rgb)
        else:
            assert tuple(rgb) not in hexes.values(), (i, j, rgb)  # a weight's colour (YlGnBu has no grey)
    assert page.watch.page_errors == [] and page.watch.console_errors == []
