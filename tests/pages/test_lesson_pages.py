"""The lesson pages and the calculator as HTML (TestClient): the spec's numbers in the default view,
the JSON API's numbers in any view (or the published formulas' for the calculator), errors in place
with 422, every state a canonical URL, user text escaped, and the snippet download equal to the
snippet on the page. Rounded cells are checked against the full-precision value, not re-rounded
the way the page rounds them."""

from __future__ import annotations

import html
from html.parser import HTMLParser
from urllib.parse import urlencode

import pytest

from app.pages import snippets
from core import lessons
from tests.api.test_calculators import FAMILY_PRESETS, PRESETS_JSON

HX = {"HX-Request": "true"}


class Tables(HTMLParser):
    """Every <table id=...> of a page: rows of (cell text, title attribute)."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[tuple[str, str | None]]]] = {}
        self._table: str | None = None
        self._cell: list[str] | None = None
        self._title: str | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table" and a.get("id"):
            self._table = a["id"]
            self.tables[self._table] = []
        elif self._table and tag == "tr":
            self.tables[self._table].append([])
        elif self._table and tag in ("td", "th"):
            self._cell, self._title = [], a.get("title")

    def handle_endtag(self, tag):
        if tag == "table":
            self._table = None
        elif self._table and tag in ("td", "th") and self._cell is not None:
            self.tables[self._table][-1].append(("".join(self._cell).strip(), self._title))
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def tables(text: str) -> dict[str, list[list[str]]]:
    p = Tables()
    p.feed(text)
    return {k: [[c for c, _ in row] for row in rows] for k, rows in p.tables.items()}


def titles(text: str, table: str) -> list[list[str | None]]:
    p = Tables()
    p.feed(text)
    return [[t for _, t in row] for row in p.tables[table]]


def error_text(text: str) -> str:
    start = text.index('<p class="error">') + len('<p class="error">')
    return html.unescape(text[start : text.index("</p>", start)])


# ------------------------------------------------------------------ the spec's numbers, by default


def test_attention_page_prints_the_spec_table_and_the_last_scores(client):
    r = client.get("/lessons/attention")
    assert r.status_code == 200
    t = tables(r.text)["weights-table"]
    assert t[0] == ["query \\ key", "Ali", "makan", "nasi", "lemak", "sum"]
    assert t[1:] == [
        ["Ali", "0.89", "0.02", "0.08", "0.01", "1.00"],
        ["makan", "0.51", "0.15", "0.21", "0.13", "1.00"],
        ["nasi", "0.09", "0.17", "0.59", "0.15", "1.00"],
        ["lemak", "0.96", "0.03", "0.01", "0.00", "1.00"],
    ]
    last = r.text[r.text.index('id="last-scores"') :]
    assert [s for s in ("4.15", "0.69", "-0.52", "-2.84") if s in last[:600]] == ["4.15", "0.69", "-0.52", "-2.84"]
    # full precision on hover: each cell's title is the API's float
    w = client.get("/api/v1/lessons/attention").json()["weights"]
    assert [float(x) for x in titles(r.text, "weights-table")[1][1:5]] == w[0]


def test_scaling_page_prints_the_spec_rows(client):
    t = tables(client.get("/lessons/scaling").text)["scaling-table"]
    assert [[row[0], row[1], row[3], row[4]] for row in t[1:]] == [
        ["4", "2.0", "0.43", "0.24"],
        ["64", "8.0", "0.84", "0.24"],
        ["512", "22.5", "0.95", "0.25"],
    ]


def test_causal_page_prints_the_spec_mask_and_weights(client):
    t = tables(client.get("/lessons/causal").text)
    assert [row[1:] for row in t["mask-table"][1:]] == [
        ["0", "1", "1", "1"],
        ["0", "0", "1", "1"],
        ["0", "0", "0", "1"],
        ["0", "0", "0", "0"],
    ]
    assert [row[1:] for row in t["weights-table"][1:]] == [
        ["1.00", "0.00", "0.00", "0.00"],
        ["0.78", "0.22", "0.00", "0.00"],
        ["0.11", "0.20", "0.69", "0.00"],
        ["0.96", "0.03", "0.01", "0.00"],
    ]
    # beside it, the attention lesson's unmasked rows (the spec: "used to be 0.09, 0.17, 0.59, 0.15")
    assert t["unmasked-table"][3][1:] == ["0.09", "0.17", "0.59", "0.15"]


def test_multihead_page_prints_the_spec_last_token_rows(client):
    t = tables(client.get("/lessons/multihead").text)["heads-table"]
    assert t[1:] == [["head 0", "0.27", "0.18", "0.26", "0.28"], ["head 1", "0.21", "0.23", "0.36", "0.20"]]


def test_positions_page_prints_the_spec_rows_and_dots(client):
    t = tables(client.get("/lessons/positions").text)
    assert [row[1:] for row in t["encoding-table"][1:]] == [
        ["0.00", "1.00", "0.00", "1.00", "0.00", "1.00"],
        ["0.84", "0.54", "0.31", "0.95", "0.10", "1.00"],
        ["0.91", "-0.42", "0.59", "0.81", "0.20", "0.98"],
    ]
    assert [(row[0], row[2]) for row in t["dots-table"][1:]] == [
        ("pos 10 vs pos 10", "8.00"),
        ("pos 10 vs pos 11", "7.49"),
        ("pos 10 vs pos 12", "6.37"),
        ("pos 10 vs pos 15", "6.14"),
        ("pos 10 vs pos 30", "5.78"),
        ("pos 30 vs pos 35", "6.14"),
    ]


def test_params_lesson_prints_the_spec_counts(client):
    r = client.get("/lessons/params")
    t = tables(r.text)["params-table"]
    assert [[row[0], row[5], row[6], row[7]] for row in t[1:]] == [
        ["toy", "8,256", "49,984", "108,352"],
        ["GPT-2 small", "39,383,808", "7,087,872", "124,439,808"],
    ]
    assert "7,077,888" in r.text  # the 12d² rule for d = 768


def test_forward_page_prints_the_spec_shapes_and_probabilities(client):
    t = tables(client.get("/lessons/forward").text)
    assert t["steps-table"][1:] == [
        ["embed", "(5, 16)"],
        ["qkv", "(5, 48)"],
        ["scores", "(2, 5, 5)"],
        ["after attn", "(5, 16)"],
        ["after mlp", "(5, 16)"],
        ["logits", "(5, 9)"],
    ]
    assert t["probs-table"][1:] == [
        ["␣", "0.211"],
        ["a", "0.115"],
        ["e", "0.112"],
        ["i", "0.123"],
        ["k", "0.062"],
        ["l", "0.151"],
        ["m", "0.076"],
        ["n", "0.090"],
        ["s", "0.060"],
    ]


def test_calculator_opens_on_gpt2_small(client):
    r = client.get("/params")
    assert r.status_code == 200
    assert '<dd id="total">124,439,808</dd>' in r.text
    kv = 2 * 12 * 1024 * 768 * 4  # K and V × layers × n_ctx × d_model × float32 bytes
    assert "75,497,472" in r.text and kv == 75_497_472


# ------------------------------------------------------------------ other settings: the service's numbers


def rounded_from(cell: str, value: float, digits: int = 2) -> bool:
    """A table cell shows `value` to `digits` decimals: that many printed, no "-0.00", and the
    nearest such number (half a unit in the last place away at most)."""
    whole, _, frac = cell.partition(".")
    return (
        len(frac) == digits
        and cell.lstrip("-").replace(".", "").isdigit()
        and cell != "-0." + "0" * digits
        and abs(float(cell) - value) <= 0.5 * 10**-digits + 1e-12
    )


def test_attention_table_follows_the_settings(client):
    query = {"text": "the cat sat on the mat", "seed": 5, "d_model": 16, "d_k": 8, "causal": "true", "scale": "false"}
    r = client.get("/lessons/attention?" + urlencode(query))
    t = tables(r.text)["weights-table"]
    w = client.get("/api/v1/lessons/attention", params=query).json()["weights"]
    assert len(t) == 1 + 6
    for row, expected in zip(t[1:], w):
        assert all(rounded_from(cell, v) for cell, v in zip(row[1:7], expected)), (row, expected)
    # each hover title is the API's number itself
    assert [[float(x) for x in row[1:7]] for row in titles(r.text, "weights-table")[1:]] == w


def gpt_params(vocab: int, n_ctx: int, d: int, layers: int, d_mlp: int) -> int:
    """GPT-2's parameter count (Radford et al., 2019): token and position tables, per block W_QKV, W_O,
    W_in, W_out with their biases and two layer norms, a final layer norm; W_U tied to W_E."""
    block = d * 3 * d + 3 * d + d * d + d + d * d_mlp + d_mlp + d_mlp * d + d + 2 * 2 * d
    return vocab * d + n_ctx * d + layers * block + 2 * d


def test_calculator_follows_preset_sizes_batch_and_dtype(client):
    query = {"preset": "gpt2-xl", "seq_len": 2048, "batch": 4, "dtype": "int8", "n_layers": 10}
    r = client.get("/params?" + urlencode(query))
    d = 1600  # GPT-2 XL's width; its 48 layers cut to 10 here
    total = gpt_params(50257, 1024, d, 10, 4 * d)
    kv = 2 * 10 * 4 * 2048 * d * 1  # K and V × layers × batch × seq_len × d_model × int8's one byte
    assert f'<dd id="total">{total:,}</dd>' in r.text
    assert f"{kv:,}" in r.text and kv == client.get("/api/v1/kv-cache", params=query).json()["bytes"]
    assert gpt_params(50257, 1024, 768, 12, 3072) == 124_439_808  # the formula gives GPT-2 small's published count
    rows = tables(r.text)["entries-table"]
    assert any(row[0] == "unembed.W_U" and row[3] == "not counted" for row in rows)


@pytest.mark.parametrize(
    "path",
    [
        "/lessons/attention?text=a+b&d_model=4&d_k=2&causal=1",
        "/lessons/scaling?dims=3,9&n_queries=50&n_keys=4&seed=1",
        "/lessons/causal?text=x+y+z&seed=3",
        "/lessons/multihead?n_heads=4&causal=true",
        "/lessons/positions?n_pos=40&d=8&pairs=1:4,20:23",
        "/lessons/params?preset=gpt2-medium&n_layers=3",
        "/lessons/forward?text=hello+world&prompt=low&d_model=8&n_heads=4&d_mlp=16",
    ],
)
def test_the_download_is_the_snippet_shown_and_the_api_link_answers(client, path):
    r = client.get(path)
    assert r.status_code == 200
    shown = html.unescape(r.text.split('<code id="snippet-code">')[1].split("</code>")[0])
    slug = path.split("?")[0].rsplit("/", 1)[1]
    download = client.get(path.replace(slug, slug + "/snippet.py", 1))
    assert download.status_code == 200
    assert download.headers["content-disposition"] == f'attachment; filename="{slug}.py"'
    assert download.text == shown
    compile(shown, "<snippet>", "exec")
    api = html.unescape(r.text.split('<p class="help api-links">')[1].split('href="')[1].split('"')[0])
    assert api.startswith("/api/v1/")
    assert client.get(api).status_code == 200


def test_causal_page_api_link_asks_for_the_mask(client):
    r = client.get("/lessons/causal")
    assert 'href="/api/v1/lessons/attention?causal=true"' in r.text
    weights = client.get("/api/v1/lessons/attention?causal=true").json()["weights"]
    assert [f"{v:.2f}" for v in weights[1]] == tables(r.text)["weights-table"][2][1:]


def test_snippet_download_matches_the_snippets_module(client):
    r = client.get("/lessons/multihead/snippet.py?n_heads=4&d_model=12&seed=3")
    assert r.text == snippets.multihead(lessons.DEFAULT_TEXT, 3, 12, 4, False, True)
    assert client.get("/lessons/multihead/snippet.py?n_heads=5").status_code == 422
    assert client.get("/lessons/calculator/snippet.py").status_code == 404


# ------------------------------------------------------------------ errors in place


@pytest.mark.parametrize(
    "path, message",
    [
        ("/lessons/attention?d_model=0", "d_model: Input should be greater than or equal to 1"),
        ("/lessons/multihead?n_heads=3", "d_model=8 is not divisible by n_heads=3"),
        ("/lessons/positions?d=7", "even"),
        ("/lessons/positions?pairs=10:99", "outside 0..49"),
        ("/lessons/forward?prompt=xyz", "'xyz' are not in the vocabulary"),
        ("/lessons/scaling?dims=4,x", "dims"),
        ("/lessons/params?tied_embeddings=false", "calculator at /params"),
        ("/lessons/attention?colour=red", "colour: is not a field"),
        ("/params?n_heads=5", "not divisible by n_heads=5"),
        ("/params?dtype=float8", "dtype"),
    ],
)
def test_a_bad_setting_shows_the_message_in_place_with_422(client, path, message):
    r = client.get(path)
    assert r.status_code == 422
    assert 'class="error-panel"' in r.text and message in error_text(r.text)
    assert 'id="lesson"' in r.text  # the controls are still there, to fix the setting
    fragment = client.get(path, headers=HX)
    assert fragment.status_code == 422
    assert fragment.text.lstrip().startswith('<section id="results"') and message in error_text(fragment.text)


def test_the_controls_keep_the_bad_value_so_it_can_be_fixed(client):
    r = client.get("/lessons/attention?d_model=0&d_k=3")
    assert 'id="d_model" name="d_model" value="0"' in r.text
    assert 'id="d_k" name="d_k" value="3"' in r.text


def test_a_page_refuses_more_words_than_it_can_draw(client):
    from app.settings import get_settings

    n = get_settings().lesson_max_tokens + 1
    r = client.get("/lessons/attention?" + urlencode({"text": " ".join(["w"] * n)}))
    assert r.status_code == 422 and f"has {n} words" in error_text(r.text)


def test_unknown_lesson_is_a_404_listing_the_lessons(client):
    r = client.get("/lessons/nope")
    assert r.status_code == 404
    assert all(
        f'href="/lessons/{slug}"' in r.text
        for slug in ("attention", "scaling", "causal", "multihead", "positions", "params", "forward")
    )


# ------------------------------------------------------------------ URLs and fragments


@pytest.mark.parametrize(
    "query, pushed",
    [
        ("", "/lessons/attention"),
        ("scale=0&scale=1&causal=0&d_model=8", "/lessons/attention"),  # checkboxes and defaults drop out
        ("causal=0&causal=1&d_model=16&text=", "/lessons/attention?d_model=16&causal=true"),
        ("scale=0&classroom=1", "/lessons/attention?scale=false&classroom=1"),
    ],
)
def test_an_htmx_request_gets_the_results_block_and_the_canonical_url(client, query, pushed):
    r = client.get("/lessons/attention?" + query, headers=HX)
    assert r.status_code == 200
    assert r.headers["hx-push-url"] == pushed
    assert "vary" in r.headers and "HX-Request" in r.headers["vary"]
    assert r.text.lstrip().startswith('<section id="results"') and "<html" not in r.text
    assert client.get(pushed).status_code == 200  # the pushed URL restores the view


def test_a_history_restore_gets_the_full_page(client):
    r = client.get("/lessons/scaling?seed=1", headers=HX | {"HX-History-Restore-Request": "true"})
    assert "<html" in r.text and 'id="scaling-table"' in r.text


def test_params_lesson_pushes_only_what_differs_from_its_own_defaults(client):
    r = client.get("/lessons/params?preset=gpt2-small&d_model=", headers=HX)
    assert r.headers["hx-push-url"] == "/lessons/params"
    assert "/api/v1/params?preset=gpt2-small" in r.text  # the API's default preset is toy


# ------------------------------------------------------------------ user text is text


def test_user_text_is_escaped_in_the_page_and_in_the_figures(client):
    evil = "<script>alert(1)</script> <img/src/onerror=alert(2)> \"q\" 'a' &amp;"
    r = client.get("/lessons/attention?" + urlencode({"text": evil}))
    assert r.status_code == 200
    assert "<script>alert" not in r.text and "<img" not in r.text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in r.text
    assert r.text.count("<script") == client.get("/lessons/attention").text.count("<script")
    # inside a figure, the label is escaped for Plotly (&lt;) and again for the attribute (&amp;lt;)
    assert "&amp;lt;script&amp;gt;" in r.text
    # in the snippet, the text is a string literal, escaped for HTML
    assert "tokens = [&#34;&lt;script&gt;alert(1)&lt;/script&gt;&#34;" in r.text


def test_an_error_message_quoting_user_text_is_escaped(client):
    r = client.get("/lessons/forward?" + urlencode({"prompt": "<b>x</b>"}))
    assert r.status_code == 422
    assert "<b>x" not in r.text and "&lt;" in r.text


def test_every_rounded_cell_is_the_apis_number_to_two_decimals(client):
    """Causal weights hold exact zeros and many small numbers: none prints as "-0.00", each is its
    full-precision value (the cell's title, equal to the API's) to two decimals."""
    query = {"text": "a b c d e f g h", "seed": 7}
    r = client.get("/lessons/causal?" + urlencode(query))
    w = client.get("/api/v1/lessons/attention", params=query | {"causal": "true"}).json()["weights"]
    cells = [row[1:9] for row in tables(r.text)["weights-table"][1:]]
    hover = [[float(x) for x in row[1:9]] for row in titles(r.text, "weights-table")[1:]]
    assert hover == w
    assert all(rounded_from(cell, v) for row, values in zip(cells, w) for cell, v in zip(row, values))
    assert "-0.00" not in r.text and cells[0][1:] == ["0.00"] * 7  # masked: exactly 0


def test_the_calculator_page_offers_every_preset_and_says_which_heads_share(client):
    r = client.get("/params", params={"preset": "smollm2-135m"})
    assert r.status_code == 200
    for preset in FAMILY_PRESETS:
        assert f'<option value="{preset}"' in r.text
    text = " ".join(html.unescape(r.text).split())
    assert "9 query heads sharing 3 K/V heads × d_head 64" in text and "d_mlp 1536 gated" in text
    assert f'<dd id="total">{PRESETS_JSON["presets"]["smollm2-135m"]["num_parameters"]:,}</dd>' in r.text
    r = client.get("/params", params={"preset": "gpt2-small", "n_key_value_heads": 3, "gated_mlp": "true"})
    text = " ".join(html.unescape(r.text).split())
    assert r.status_code == 200 and "12 query heads sharing 3 K/V heads" in text
    assert "/api/v1/kv-cache?preset=gpt2-small&amp;n_key_value_heads=3" in r.text  # the API link says the same


def test_the_params_lesson_keeps_to_the_models_its_formula_counts(client):
    r = client.get("/lessons/params")
    assert '<option value="gpt2-xl"' in r.text and '<option value="smollm2-135m"' not in r.text
    r = client.get("/lessons/params", params={"preset": "smollm2-135m"})
    assert r.status_code == 422 and "gpt2-small" in html.unescape(r.text)
