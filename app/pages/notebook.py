"""The explorer's figures in a notebook, as plotly Figures: the same numbers and the same drawing.

    from app.pages.notebook import attribution_figures, explorer_figures
    figs = explorer_figures("Ali makan nasi lemak", model="toy", layer=1, head=2, causal=False)
    figs["weights"]        # a plotly.graph_objects.Figure; Jupyter shows it
    list(figs)             # raw, scaled, masked, weights, head-0 ... head-3, residual, writes, next-token

    figs = attribution_figures("Ali makan nasi lemak. Ali makan nasi", model="induction", method="direct_logit")
    list(figs)             # scores (a bar per token, shaded as the page's text), heads (direct_logit only)

The figures are the explorer page's and the attribution page's own (app/pages/explorer.py and
app/pages/attribution.py build them from the service's views, app/pages/figures.py draws them), turned
into plotly Figures by `to_plotly`, which also fills in each heatmap cell's hover text (the page's
script does that in the browser).
"""

from __future__ import annotations

import plotly.graph_objects as go

from app.deps import standalone_service
from app.pages import attribution
from app.pages.explorer import TOP_K, view_context
from app.service import AblatedHead, Method, RunSpec


def to_plotly(fig: dict) -> go.Figure:
    """A figure dict of app/pages/figures.py as a plotly Figure.

    Its "export" entry (labels for the page's downloads) is not Plotly's: it is dropped, and a
    heatmap's hover pattern ("query {i} {y} → key {j} {x}") is filled into the trace's text."""
    fig = dict(fig)
    export = fig.pop("export", {})
    data = [dict(trace) for trace in fig["data"]]
    pattern = export.get("cell_text")
    if pattern and data and data[0].get("type") == "heatmap":
        ys = data[0].get("y") or export["y"]
        xs = data[0].get("x") or export["x"]
        data[0]["text"] = [[pattern.format(i=i, y=y, j=j, x=x) for j, x in enumerate(xs)] for i, y in enumerate(ys)]
    return go.Figure(data=data, layout=fig.get("layout", {}))


def explorer_figures(
    text: str,
    model: str = "toy",
    layer: int = 0,
    head: int = 0,
    *,
    compare: bool = False,
    rollout: bool = False,
    ablate: tuple[tuple[int, int], ...] = (),
    ablate_method: Method = "zero",
    **toggles,
) -> dict[str, go.Figure]:
    """Every figure the explorer draws for this state, by name. `toggles` are the explorer's (causal,
    scale, temperature, positional_embedding_type, n_heads, n_layers, d_model, seed)."""
    svc = standalone_service()
    spec = RunSpec(model, text, ablate=tuple(AblatedHead(lay, h, ablate_method) for lay, h in ablate), **toggles)
    top_k = 0 if svc.views.models()[model].is_encoder else TOP_K
    result = svc.views.explorer(spec, layer, head, compare=compare, rollout=rollout, top_k=top_k)
    view = view_context(result, set(ablate))
    figures = {stage["key"]: stage["figure"] for stage in view["stages"]}
    figures |= {f"head-{h}": fig for h, fig in enumerate(view["head_figures"])}
    figures |= {f"compare-{c['key']}": c["figure"] for c in view["compare"] or ()}
    figures |= {"residual": view["residual_figure"], "writes": view["writes_figure"]}
    if view["next_figure"] is not None:
        figures["next-token"] = view["next_figure"]
    if view["rollout_figure"] is not None:
        figures["rollout"] = view["rollout_figure"]
    return {name: to_plotly(fig) for name, fig in figures.items()}


def attribution_figures(
    text: str,
    model: str = "induction",
    *,
    position: int | None = None,
    target: str | None = None,
    contrast: str | None = None,
    method: str = attribution.DEFAULT_METHOD,
    steps: int | None = None,
) -> dict[str, go.Figure]:
    """The attribution page's figures for this state (app/pages/attribution.py): `scores`, each token's score by
    `method`, and with method="direct_logit" `heads`, what each head moved from each source token."""
    state = attribution.AttributionState(model, text, position, target, contrast, method, steps)
    v = attribution.view(attribution.attribute(standalone_service(), state), state)
    figures = {"scores": v["scores_figure"]} | ({"heads": v["heads_figure"]} if v["heads_figure"] else {})
    return {name: to_plotly(fig) for name, fig in figures.items()}
