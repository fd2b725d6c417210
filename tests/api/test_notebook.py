"""docs/api.md's notebook example runs, and its figures hold the numbers the JSON API returns."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import plotly.graph_objects as go

DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def notebook_example() -> str:
    section = DOC.read_text(encoding="utf-8").split("## In a notebook", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_notebook_example_runs_and_draws_the_apis_numbers(client):
    ns: dict = {}
    exec(compile(notebook_example(), "docs/api.md", "exec"), ns)  # noqa: S102  the docs' own code
    figs = ns["figs"]
    assert all(isinstance(f, go.Figure) for f in figs.values())
    assert {"raw", "scaled", "masked", "weights", "head-0", "residual", "writes", "next-token"} <= set(figs)
    run = client.post(
        "/api/v1/run",
        json={
            "model": "toy",
            "text": "Ali makan nasi lemak",
            "causal": False,
            "hooks": ["blocks.1.attn.hook_pattern"],
            "top_k": 10,
        },
    ).json()
    pattern = np.array(run["hooks"]["blocks.1.attn.hook_pattern"])  # [head, query, key]
    np.testing.assert_array_equal(np.array(figs["weights"].data[0].z, dtype=float), pattern[2])
    np.testing.assert_array_equal(np.array(figs["head-0"].data[0].z, dtype=float), pattern[0])
    bars = figs["next-token"].data[0]
    assert bars.orientation == "h"
    np.testing.assert_array_equal(list(bars.x), [t["prob"] for t in run["top_k"]])
    # the hover text the page's script builds, filled in for the notebook
    assert figs["weights"].data[0].text[1][2] == "query 1 l → key 2 i"
    # core's cache in the same example answers from the same run
    assert ns["cache"].head_detector_scores()["induction"].shape == (2, 4)
