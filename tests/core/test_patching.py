"""Activation patching (core/patching.py): the identities every patch must satisfy, the shortcuts a sweep
takes (starting at the patched layer and position) against a plain run of every block on every position,
frozen attention, bad input, the induction model's mechanism as a test, and patched logits against
transformers with torch forward hooks (tests/fixtures/patching.npz, scripts/make_patching_fixtures.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from core import InputError, TransformerConfig, forward, run_with_cache
from core.attention import merge_heads
from core.checkpoints import load_checkpoint, trained_models
from core.hooks import PassContext
from core.model import embed, norm, transformer_block, unembedding
from core.patching import (
    DIRECTIONS,
    TARGETS,
    Patch,
    ablated_logits,
    final_resid,
    induction_example,
    last_logits,
    patched_resid,
    run_for_patching,
    sweep,
    sweep_cells,
    sweep_passes,
    sweep_work,
)

from .test_analysis import random_params
from .test_parity import as_float64

CLEAN = np.array([3, 7, 1, 7, 3, 9, 0, 7, 2])
CORRUPTED = np.array([3, 5, 1, 8, 3, 9, 4, 7, 2])
VARIANTS = {
    "gpt2": {},
    "llama": dict(
        positional_embedding_type="rotary",
        normalization_type="RMS",
        n_key_value_heads=2,
        gated_mlp=True,
        act_fn="silu",
        bias=False,
    ),
    "attn-only": dict(attn_only=True),
    "parallel": dict(parallel_attn_mlp=True, positional_embedding_type="rotary", rotary_dim=2),
    "window": dict(attn_types=("local", "global", "local"), window_size=3, positional_embedding_type="sinusoidal"),
}


def model(name: str):
    cfg = TransformerConfig(d_model=16, n_heads=4, n_layers=3, d_vocab=23, n_ctx=16, d_mlp=32, **VARIANTS[name])
    return cfg, random_params(cfg)


def patches(cfg: TransformerConfig):
    for target in TARGETS:
        if cfg.attn_only and target in ("resid_mid", "mlp_out") or target == "attn_head_pos":
            continue
        for layer in range(cfg.n_layers):
            for pos in (None, 0, 4, 8):
                for head in (None,) if target not in ("attn_head", "pattern") else (0, 3):
                    yield Patch(target, layer, head, pos)


# ------------------------------------------------------------------ a plain reference: every block, every position


def reference_resid(params, cfg, base_tokens, source_cache, patch: Patch, frozen_patterns=None) -> np.ndarray:
    """The patched run done the long way: embed and run every block on every position, replacing the patched
    activation in place (a head's z before W_O, recomputing W_O over every head), and with frozen_patterns
    ({layer: [n_heads, pos, pos]}) computing each frozen layer's z = pattern @ V."""
    rows = slice(None) if patch.pos is None else slice(patch.pos, patch.pos + 1)
    b = f"blocks.{patch.layer}."
    seen = {}

    def hook(name, value):
        seen[name] = value
        if name == b + "hook_" + patch.target:  # resid_mid, resid_post, mlp_out
            value = value.copy()
            value[rows] = source_cache[name][rows]
        if name.endswith("hook_attn_out"):
            layer = int(name.split(".")[1])
            attn = params["blocks"][layer]["attn"]
            z = seen[f"blocks.{layer}.attn.hook_z"].swapaxes(0, 1).copy()  # [n_heads, pos, d_head]
            v = seen[f"blocks.{layer}.attn.hook_v"].swapaxes(0, 1)  # [n_kv_heads, pos, d_head]
            heads = range(cfg.n_heads)
            if frozen_patterns is not None and layer in frozen_patterns:
                z = np.stack([frozen_patterns[layer][h] @ v[cfg.kv_head(h)] for h in heads])
            if layer == patch.layer and patch.target == "attn_head":
                z[patch.head, rows] = source_cache[b + "attn.hook_z"][rows, patch.head]
            if layer == patch.layer and patch.target == "pattern":
                z[patch.head, rows] = (
                    source_cache[b + "attn.hook_pattern"][patch.head][rows] @ v[cfg.kv_head(patch.head)]
                )
            value = merge_heads(z) @ attn["W_O"] + attn.get("b_O", 0.0)
        return value

    ctx = PassContext(edit=hook)  # keeps every activation: the blocks' long path, scores and patterns made
    x = embed(params, cfg, base_tokens, ctx)
    for layer, block in enumerate(params["blocks"]):
        if layer == patch.layer and patch.target == "resid_pre":
            x = x.copy()
            x[rows] = source_cache[b + "hook_resid_pre"][rows]
        x, _ = transformer_block(x, block, cfg, ctx, layer)
    return x[-1]


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("frozen", [False, True])
def test_a_patched_run_equals_the_same_patch_made_on_every_block_and_position(variant, frozen):
    cfg, params = model(variant)
    base, source = run_for_patching(params, cfg, CORRUPTED), run_for_patching(params, cfg, CLEAN)
    for patch in patches(cfg):
        frozen_patterns = None
        if frozen:
            first = patch.layer if patch.target == "resid_pre" else patch.layer + 1
            frozen_patterns = {la: base[f"blocks.{la}.attn.hook_pattern"] for la in range(first, cfg.n_layers)}
        ours = patched_resid(params, cfg, base, source, patch, frozen)
        np.testing.assert_allclose(
            ours,
            reference_resid(params, cfg, CORRUPTED, source, patch, frozen_patterns),
            atol=1e-12,
            rtol=0,
            err_msg=str(patch),
        )


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_patching_everything_gives_the_source_and_patching_nothing_the_base(variant):
    cfg, params = model(variant)
    clean, corrupted = run_for_patching(params, cfg, CLEAN), run_for_patching(params, cfg, CORRUPTED)
    for layer in range(cfg.n_layers):
        for target in ("resid_pre", "resid_post"):
            whole = Patch(target, layer)  # every position
            np.testing.assert_allclose(
                patched_resid(params, cfg, corrupted, clean, whole), final_resid(clean), atol=1e-12, rtol=0
            )
            np.testing.assert_allclose(
                patched_resid(params, cfg, clean, corrupted, whole), final_resid(corrupted), atol=1e-12, rtol=0
            )
    for patch in patches(cfg):  # a patch from the run itself changes nothing, frozen or not
        for frozen in (False, True):
            np.testing.assert_allclose(
                patched_resid(params, cfg, corrupted, corrupted, patch, frozen),
                final_resid(corrupted),
                atol=1e-12,
                rtol=0,
            )


def test_a_sweep_is_normalised_between_the_corrupted_run_and_the_clean_run():
    cfg, params = model("gpt2")
    for direction in DIRECTIONS:
        r = sweep(params, cfg, CLEAN, CORRUPTED, 5, 7, "resid_pre", direction=direction)
        logits_clean = forward(params, cfg, CLEAN)[0][-1]
        assert r.clean_metric == pytest.approx(logits_clean[5] - logits_clean[7], abs=1e-12)
        assert r.raw.shape == (3, 9) and r.rows == ["L0", "L1", "L2"] and r.columns[-1] == "8"
        # positions where the texts agree and nothing earlier differs change nothing: position 0
        expected = 0.0 if direction == "denoise" else 1.0
        np.testing.assert_allclose(r.normalised[:, 0], expected, atol=1e-12)
        # the last layer's output stream at the last position is the whole prediction
        post = sweep(params, cfg, CLEAN, CORRUPTED, 5, 7, "resid_post", direction=direction)
        np.testing.assert_allclose(post.normalised[-1, -1], 1.0 - expected, atol=1e-12)
    prob = sweep(params, cfg, CLEAN, CORRUPTED, 5, 7, "mlp_out", metric="prob")
    assert 0 < prob.clean_metric < 1 and prob.raw.shape == (3, 9)


def test_every_target_sweeps_its_grid():
    cfg, params = model("gpt2")
    for target in TARGETS:
        r = sweep(params, cfg, CLEAN, CORRUPTED, 5, 7, target)
        rows, columns, cells = sweep_cells(cfg, CLEAN.size, target)
        assert r.raw.shape == (len(rows), len(columns)) == (len(cells), len(cells[0]))
        assert r.passes == r.raw.size == sweep_passes(cfg, CLEAN.size, target)
        assert np.isfinite(r.raw).all()
    assert sweep_cells(cfg, 9, "attn_head_pos")[0][:2] == ["L0H0", "L0H1"]
    assert sweep_cells(cfg, 9, "attn_head")[1] == ["H0", "H1", "H2", "H3"]


def test_a_sweep_costs_less_than_its_passes_run_whole():
    cfg = TransformerConfig(d_model=768, n_heads=12, n_layers=12, d_vocab=50257, n_ctx=1024)
    from core.params import forward_work

    full = forward_work(cfg, 32, logits=False)
    work = sweep_work(cfg, 32, "resid_pre")
    assert 2 * full < work < (2 + sweep_passes(cfg, 32, "resid_pre")) * full / 3


@pytest.mark.parametrize("variant", ["gpt2", "llama"])
def test_ablation_recomputed_is_the_forward_pass_and_frozen_differs(variant):
    cfg, params = model(variant)
    ablate = {(0, 1): "zero", (1, 2): "mean"}
    logits = forward(params, cfg, CLEAN, ablate=ablate)[0][-1]
    np.testing.assert_allclose(ablated_logits(params, cfg, CLEAN, ablate), logits, atol=1e-12, rtol=0)
    assert not np.allclose(ablated_logits(params, cfg, CLEAN, ablate, frozen=True), logits)
    # frozen: the later layers' patterns are the unablated run's, so a head in the last layer alone is the same
    last = {(2, 0): "zero"}
    np.testing.assert_allclose(
        ablated_logits(params, cfg, CLEAN, last, frozen=True),
        forward(params, cfg, CLEAN, ablate=last)[0][-1],
        atol=1e-12,
        rtol=0,
    )
    np.testing.assert_allclose(ablated_logits(params, cfg, CLEAN, {}), forward(params, cfg, CLEAN)[0][-1], atol=1e-12)


def test_last_logits_are_the_models():
    cfg, params = model("llama")
    cache = run_for_patching(params, cfg, CLEAN)
    logits = forward(params, cfg, CLEAN)[0][-1]
    np.testing.assert_allclose(last_logits(params, cfg, final_resid(cache)), logits, atol=1e-12, rtol=0)
    np.testing.assert_allclose(last_logits(params, cfg, final_resid(cache), [5, 7]), logits[[5, 7]], atol=1e-12)
    W_U, _ = unembedding(params)
    x = norm(final_resid(cache), params["ln_final"], cfg)
    assert float(x @ W_U[:, 5]) == pytest.approx(logits[5], abs=1e-12)


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda p, c: sweep(p, c, CLEAN, CORRUPTED[:-1], 5, 7, "resid_pre"),
            "the clean text has 9 tokens and the corrupted text 8",
        ),
        (lambda p, c: sweep(p, c, CLEAN, CORRUPTED, 5, 5, "resid_pre"), "the answer and the wrong token are the same"),
        (lambda p, c: sweep(p, c, CLEAN, CORRUPTED, 99, 5, "resid_pre"), "token id 99 is outside the vocabulary"),
        (lambda p, c: sweep(p, c, CLEAN, CLEAN, 5, 7, "resid_pre"), "give the same logit_diff"),
        (lambda p, c: sweep(p, c, CLEAN, CORRUPTED, 5, 7, "resid_side"), "target 'resid_side' is not one of"),
        (lambda p, c: sweep(p, c, CLEAN, CORRUPTED, 5, 7, "resid_pre", direction="up"), "direction 'up'"),
        (lambda p, c: sweep(p, c, CLEAN, CORRUPTED, 5, 7, "resid_pre", metric="loss"), "metric 'loss'"),
        (
            lambda p, c: patched_resid(
                p, c, run_for_patching(p, c, CLEAN), run_for_patching(p, c, CLEAN), Patch("resid_pre", 0, None, 9)
            ),
            "position 9 is outside the text's 9 tokens",
        ),
        (
            lambda p, c: patched_resid(
                p, c, run_for_patching(p, c, CLEAN), run_for_patching(p, c, CLEAN), Patch("attn_head", 3, 0)
            ),
            "layer 3 does not exist",
        ),
        (
            lambda p, c: patched_resid(
                p, c, run_for_patching(p, c, CLEAN), run_for_patching(p, c, CLEAN), Patch("pattern", 0, 4)
            ),
            "head 4 does not exist",
        ),
    ],
)
def test_bad_input_says_what_to_change(call, message):
    cfg, params = model("gpt2")
    with pytest.raises(InputError, match=message):
        call(params, cfg)


def test_what_patching_cannot_measure_is_refused():
    cfg, params = model("attn-only")
    with pytest.raises(InputError, match="attention-only: it has no MLP, so no mlp_out"):
        sweep(params, cfg, CLEAN, CORRUPTED, 5, 7, "mlp_out")
    encoder = TransformerConfig(
        d_model=16, n_heads=4, n_layers=2, d_vocab=23, n_ctx=16, block_type="post_norm", attention_dir="bidirectional"
    )
    with pytest.raises(InputError, match="an encoder"):
        sweep(random_params(encoder), encoder, CLEAN, CORRUPTED, 5, 7, "resid_pre")
    cfg, params = model("gpt2")
    with pytest.raises(InputError, match="turn causal back on"):
        sweep(params, cfg.replace(attention_dir="bidirectional"), CLEAN, CORRUPTED, 5, 7, "resid_pre")


# ------------------------------------------------------------------ the induction model's mechanism


def induction_model():
    ckpt = load_checkpoint(trained_models()["induction"])
    return ckpt.cfg, ckpt.params, ckpt.tokenizer


def test_the_induction_example_is_a_repeat_and_its_first_half_resampled():
    clean, corrupted, answer, wrong = induction_example("abc", 6, seed=1)
    assert len(clean) == len(corrupted) == 11 and clean[:6][:-1] == clean[6:] and corrupted[6:] == clean[6:]
    assert answer == clean[5] and wrong == corrupted[5] != answer


def test_the_previous_token_head_feeds_the_induction_head_through_its_attention():
    """On the induction model, the clean run predicts the repeat. Noising L0H2 (the previous-token head) removes
    at least half of the normalised metric: L1's induction heads can no longer find what followed the current
    token last time. With every later pattern frozen, the same patch removes much less: L0H2 acts through
    layer 1's attention patterns (its keys: K-composition), not through its values or directly."""
    cfg, params, tok = induction_model()
    recomputed, frozen = [], []
    for seed in range(4):
        clean, corrupted, answer, wrong = induction_example("abcdefghijklmnopqrstuvwxyz", 24, seed)
        ids = [np.array(tok.encode(t).ids) for t in (clean, corrupted)]
        a, w = tok.encode(answer).ids[0], tok.encode(wrong).ids[0]
        for out, fr in ((recomputed, False), (frozen, True)):
            r = sweep(params, cfg, *ids, a, w, "attn_head", direction="noise", frozen=fr)
            assert r.clean_metric > r.corrupted_metric + 1.0  # the clean run predicts the repeat
            out.append(r.normalised[0, 2])  # L0H2
    assert max(recomputed) <= 0.5
    assert min(frozen) >= 0.75


def test_the_induction_models_full_sweep_makes_one_pass_per_cell():
    cfg, params, tok = induction_model()
    clean, corrupted, answer, wrong = induction_example("abcdefghijklmnopqrstuvwxyz", 24)
    ids = [tok.encode(t).ids for t in (clean, corrupted)]
    r = sweep(params, cfg, *ids, tok.encode(answer).ids[0], tok.encode(wrong).ids[0], "resid_pre")
    assert r.passes == 2 * 47
    logits = run_with_cache(params, cfg, np.array(ids[0]))[0][-1]
    assert r.clean_metric == pytest.approx(
        float(logits[tok.encode(answer).ids[0]] - logits[tok.encode(wrong).ids[0]]), abs=1e-4
    )


# ------------------------------------------------------------------ against transformers

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "patching.npz"
GENERATOR = Path(__file__).resolve().parents[2] / "scripts" / "make_patching_fixtures.py"
CHECKPOINTS = {"gpt2-tiny": "gpt2-tiny", "llama-gqa": "families/llama-gqa"}


def test_the_fixture_was_recorded_by_the_generator_as_it_is():
    with np.load(FIXTURE) as z:
        assert str(z["meta_generator_sha256"]) == hashlib.sha256(GENERATOR.read_bytes()).hexdigest(), (
            "scripts/make_patching_fixtures.py changed since tests/fixtures/patching.npz was made: run make fixtures"
        )


@pytest.mark.parametrize("name", list(CHECKPOINTS))
@pytest.mark.parametrize("dtype, atol", [("64", 1e-10), ("32", 1e-4)])
def test_patched_logits_equal_transformers_with_torch_hooks(name, dtype, atol):
    """GPT-2 (learned positions, layer norm) and Llama (rotary, RMS norm, gated MLP, grouped-query heads): the
    block's input at one position, a head's z at every position or one, an MLP's output at one position, patched
    by forward hooks in transformers and by core, give the same last-position logits."""
    ckpt = load_checkpoint(FIXTURE.parent / CHECKPOINTS[name])
    params = as_float64(ckpt.params) if dtype == "64" else ckpt.params
    with np.load(FIXTURE) as z:
        ref = {k.split("/", 1)[1]: z[k] for k in z.files if k.startswith(name + "/")}
        targets = [str(t) for t in z["targets"]]
    cfg = ckpt.cfg
    clean = run_for_patching(params, cfg, ref["clean"])
    corrupted = run_for_patching(params, cfg, ref["corrupted"])
    np.testing.assert_allclose(last_logits(params, cfg, final_resid(clean)), ref["clean_logits" + dtype], atol=atol)
    np.testing.assert_allclose(
        last_logits(params, cfg, final_resid(corrupted)), ref["corrupted_logits" + dtype], atol=atol
    )
    for (target, layer, head, pos, noise), expected in zip(ref["patches"], ref["logits" + dtype]):
        patch = Patch(targets[target], int(layer), None if head < 0 else int(head), None if pos < 0 else int(pos))
        base, source = (clean, corrupted) if noise else (corrupted, clean)
        ours = last_logits(params, cfg, patched_resid(params, cfg, base, source, patch))
        np.testing.assert_allclose(ours, expected, atol=atol, rtol=0, err_msg=f"{name} {patch} noise={noise}")


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("frozen", [False, True])
def test_a_batched_sweep_equals_one_run_per_cell(variant, frozen, monkeypatch):
    """Cells run several to a pass (core.hooks.Batch: each variant from its own patched position, attention
    within each): the numbers of one patched run per cell, to rounding, on every target and both directions."""
    import core.patching

    monkeypatch.setattr(core.patching, "BATCH_ROWS", 20)  # several batches a layer, of different starts
    cfg, params = model(variant)
    assert any(len({c.pos for _i, c in b}) > 1 for b in core.patching.sweep_batches(cfg, CLEAN.size, "resid_pre"))
    for i, target in enumerate(TARGETS):
        if cfg.attn_only and target in ("resid_mid", "mlp_out"):
            continue
        direction = DIRECTIONS[(i + frozen) % 2]  # each target both ways over the two frozen settings
        kw = dict(direction=direction, frozen=frozen, metric="prob" if target == "pattern" else "logit_diff")
        batched = sweep(params, cfg, CLEAN, CORRUPTED, 2, 5, target, **kw)
        single = sweep(params, cfg, CLEAN, CORRUPTED, 2, 5, target, batched=False, **kw)
        np.testing.assert_allclose(batched.raw, single.raw, rtol=0, atol=1e-12)
        assert batched.passes == single.passes == batched.raw.size


# ------------------------------------------------------------------ attribution patching


@pytest.mark.parametrize("name", list(CHECKPOINTS))
@pytest.mark.parametrize("target", TARGETS)
def test_attribution_patching_equals_the_torch_autograd_estimate(name, target):
    """GPT-2 and Llama (rotary, RMS norm, gated MLP, grouped-query heads) in float64: every cell's
    (a_source − a_base) · ∂metric/∂a|base, summed over what the cell covers, with the gradient taken in the run
    patched into (the corrupted run when denoising), as torch autograd on the same weights gives it
    (scripts/make_patching_fixtures.py atp_estimates), both directions and both metrics."""
    from core.attribution_patching import attribution_sweep

    ckpt = load_checkpoint(FIXTURE.parent / CHECKPOINTS[name])
    params, cfg = as_float64(ckpt.params), ckpt.cfg
    with np.load(FIXTURE) as z:
        ref = {k.split("/", 1)[1]: z[k] for k in z.files if k.startswith(name + "/")}
    answer, wrong = (int(t) for t in ref["atp_answer_wrong"])
    for direction in DIRECTIONS:
        for metric in ("logit_diff", "prob"):
            ours = attribution_sweep(
                params, cfg, ref["clean"], ref["corrupted"], answer, wrong, target, direction=direction, metric=metric
            )
            expected = ref[f"atp/{target}/{direction}/{metric}"]
            assert ours.method == "attribution" and ours.passes == 0
            np.testing.assert_allclose(ours.raw, expected, rtol=0, atol=1e-10, err_msg=f"{name} {direction} {metric}")
            assert np.ptp(expected) > 0.01  # the grid varies: a wrong cell would show


def test_attribution_patching_has_the_exact_sweeps_grid_and_follows_it():
    """The same rows, columns and two runs' metrics as the exact sweep; on a small GPT-2 the estimate ranks the
    cells nearly as the patched runs do, and compare() names the cells where they differ most."""
    from core.attribution_patching import DISAGREE, attribution_sweep, compare, spearman

    cfg, params = model("gpt2")
    for target in ("resid_pre", "attn_head"):
        exact = sweep(params, cfg, CLEAN, CORRUPTED, 2, 5, target)
        estimate = attribution_sweep(params, cfg, CLEAN, CORRUPTED, 2, 5, target)
        assert (estimate.rows, estimate.columns, estimate.raw.shape) == (exact.rows, exact.columns, exact.raw.shape)
        assert estimate.clean_metric == pytest.approx(exact.clean_metric, abs=1e-10)
        assert estimate.corrupted_metric == pytest.approx(exact.corrupted_metric, abs=1e-10)
        c = compare(exact, estimate)
        assert c.spearman == pytest.approx(spearman(exact.normalised, estimate.normalised))
        assert c.spearman > 0.5
        gaps = [abs(d.exact - d.estimate) for d in c.disagreements]
        assert gaps == sorted(gaps, reverse=True) and all(g >= DISAGREE for g in gaps)


def test_spearman_ranks_ties_by_their_average():
    from core.attribution_patching import ranks, spearman

    np.testing.assert_array_equal(ranks(np.array([3.0, 1.0, 3.0, 2.0])), [3.5, 1.0, 3.5, 2.0])
    assert spearman(np.array([1.0, 2, 3, 4]), np.array([1.0, 3, 2, 4])) == pytest.approx(0.8)
    assert spearman(np.array([1.0, 2, 3]), np.array([3.0, 2, 1])) == pytest.approx(-1.0)
    assert np.isnan(spearman(np.ones(3), np.arange(3.0)))


def test_attribution_patching_says_when_a_model_has_no_gradients(monkeypatch):
    import core.attribution_patching as atp

    def refuse(cfg):
        raise InputError("training does not support gated_mlp=True")

    monkeypatch.setattr(atp, "check_trainable", refuse)
    cfg, params = model("gpt2")
    with pytest.raises(InputError, match="attribution patching needs the metric's gradient.*gated_mlp"):
        atp.attribution_sweep(params, cfg, CLEAN, CORRUPTED, 2, 5, "resid_pre")
