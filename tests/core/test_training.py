"""The training loop: reproducible bit for bit on one machine (same BLAS kernel and thread count),
resumable exactly, stoppable, its records plain data, its settings checked, its schedule and clipping
as stated, its checkpoints loadable and their cards saying what they were trained on. (Across CPUs a
retrain is the same only within bounds: tests/core/nasi_lemak_reproduction.py.)"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from core import run_with_cache
from core.checkpoints import load_checkpoint
from core.optim import AdamW, ParamVector, clip_grad_norm, learning_rate
from core.recipes import (
    MAX_STEPS,
    NASI_LEMAK_PROMPT,
    TEXT_MAX_CHARS,
    TEXT_MAX_VOCAB,
    make_recipe,
    python_docs,
)
from core.run_settings import settings
from core.train import Record, Snapshot, Training


@pytest.fixture(autouse=True)
def one_blas_thread():
    """Training's default (and, with the same BLAS kernel, what makes it reproducible bit for bit): at
    these sizes two BLAS threads are slower, several times so on a loaded machine."""
    with threadpool_limits(1, user_api="blas"):
        yield


SMALL = dict(steps=12, eval_interval=4, batch_size=4, seq_len=16, d_model=16, n_heads=2)


def small(recipe="induction", **changes):
    return settings(recipe, **(SMALL | changes))


# ------------------------------------------------------------------ reproducibility


def test_same_settings_give_the_same_weights_bit_for_bit():
    a, b = Training(small()), Training(small())
    a.run(), b.run()
    assert a.vector.flat.tobytes() == b.vector.flat.tobytes()
    c = Training(small(seed=1))
    c.run()
    assert not np.array_equal(a.vector.flat, c.vector.flat)


@pytest.mark.parametrize("recipe", ["induction", "nasi-lemak", "text"])
def test_a_snapshot_resumes_exactly_where_it_stopped(recipe, tmp_path):
    changes = dict(steps=10, eval_interval=5, batch_size=4, seq_len=16)
    if recipe != "nasi-lemak":
        changes |= dict(d_model=16, n_heads=2)
    if recipe == "text":
        changes["text"] = python_docs()[:20_000]
    s = settings(recipe, **changes)
    whole = Training(s)
    whole_records = whole.run()

    first = Training(s)
    stops = iter([False] * 7 + [True])
    first_records = list(first.records(stop=lambda: next(stops)))  # stopped between steps 7 and 8
    assert first.step == 7 and [r.step for r in first_records] == [0, 5]
    path = first.snapshot().save(tmp_path / "run.npz")
    second = Training.resume(Snapshot.load(path))
    rest = second.run()
    assert second.vector.flat.tobytes() == whole.vector.flat.tobytes()
    assert second.optimizer.state.m.tobytes() == whole.optimizer.state.m.tobytes()
    strip = lambda r: {k: v for k, v in r.to_dict().items() if k != "elapsed_s"}  # noqa: E731
    assert [strip(r) for r in first_records + rest] == [strip(r) for r in whole_records]


def test_records_are_plain_json_data_at_the_stated_interval():
    run = Training(small(snapshot_interval=8))
    records = run.run()
    assert [r.step for r in records] == [0, 4, 8, 12]
    assert records[0].train_loss is None and all(r.train_loss > 0 for r in records[1:])
    decoded = json.loads(json.dumps([r.to_dict() for r in records]))
    first = decoded[0]
    assert np.array(first["previous_token"]).shape == np.array(first["induction"]).shape == (2, 2)
    assert np.array(first["patterns"]).shape == (2, 2, 16, 16)  # [layer, head, query, key] of the probe
    assert [r.patterns is not None for r in records] == [True, False, True, True]  # snapshots: 0, 8 and the end
    assert isinstance(first["sample"], str) and 0 < first["target"] < 1
    for r in records:
        assert np.allclose(np.array(r.patterns).sum(-1), 1.0) if r.patterns else True


def test_held_out_loss_starts_near_uniform_and_icl_is_late_minus_early():
    run = Training(small())
    r = run.evaluate()
    assert abs(r.val_loss - math.log(32)) < 1.0  # a random model is close to uniform over 32 tokens
    assert isinstance(r.icl_score, float)


def test_icl_score_is_the_late_quarters_held_out_loss_minus_the_early_quarters():
    """Written out here from its definition, on a model trained 12 steps (so its losses differ by position):
    each held-out sequence of 17 tokens gives 16 predictions; a quarter is 4 of them. The score is the mean
    −log p(next token) of predictions 12-15 (late in the context) minus that of predictions 0-3 (early),
    over every held-out sequence, with the model's logits from core.forward (the inference pass, not the
    training pass evaluate() uses) and the log-softmax written out in plain Python."""
    from core import forward

    run = Training(small())
    run.run()
    held_out = run.recipe.held_out
    assert held_out.shape == (16, 17)
    early, late = [], []
    for sequence in held_out:
        logits = forward(run.params, run.cfg, sequence[:-1])[0].astype(float)
        for pos, target in enumerate(sequence[1:]):
            row = logits[pos].tolist()
            top = max(row)
            loss = top + math.log(sum(math.exp(z - top) for z in row)) - row[int(target)]
            if pos < 4:
                early.append(loss)
            elif pos >= 12:
                late.append(loss)
    assert len(early) == len(late) == 16 * 4
    expected = sum(late) / len(late) - sum(early) / len(early)
    r = run.evaluate()
    assert r.icl_score == pytest.approx(expected, abs=1e-5)
    assert abs(expected) > 1e-3  # a score that is not trivially 0: it tells late from early


# ------------------------------------------------------------------ optimiser pieces


def test_schedule_warms_up_linearly_then_decays_by_a_cosine_to_its_floor():
    lrs = [learning_rate(s, lr=1.0, steps=110, warmup=10, min_lr=0.1) for s in range(110)]
    assert lrs[:10] == pytest.approx([(s + 1) / 10 for s in range(10)])
    assert lrs[10] == pytest.approx(1.0) and lrs[-1] == pytest.approx(0.1)
    assert lrs[60] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 50 / 99)))
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))


def test_clipping_scales_to_the_norm_and_leaves_small_gradients_alone():
    g = np.array([3.0, 4.0])
    assert clip_grad_norm(g, 1.0) == pytest.approx(5.0)
    assert np.linalg.norm(g) == pytest.approx(1.0, rel=1e-6)
    small_g = np.array([0.3, 0.4])
    clip_grad_norm(small_g, 1.0)
    assert np.allclose(small_g, [0.3, 0.4], rtol=1e-5)


def test_adamw_first_step_and_decoupled_decay_by_hand():
    params = {"w": np.array([[1.0, -2.0]]), "b": np.array([0.5])}
    vector = ParamVector(params)
    opt = AdamW(vector, weight_decay=0.1)
    opt.step(np.array([0.2, -0.4, 0.1]), lr=0.01)
    # Step 1: m̂ = g, v̂ = g², so the step is lr · g / (|g| + eps) ≈ lr · sign(g); decay only on the matrix.
    expected_w = np.array([1.0, -2.0]) * (1 - 0.01 * 0.1) - 0.01 * np.sign([0.2, -0.4])
    assert vector.params["w"][0] == pytest.approx(expected_w, rel=1e-6)
    assert vector.params["b"][0] == pytest.approx(0.5 - 0.01, rel=1e-6)


# ------------------------------------------------------------------ settings


@pytest.mark.parametrize(
    "recipe, changes, message",
    [
        ("induction", dict(steps=0), "at least one step"),
        ("induction", dict(steps=MAX_STEPS + 1), "steps="),
        ("induction", dict(d_model=30, n_heads=4), "not divisible by n_heads=4"),
        ("induction", dict(seq_len=6), "cannot hold a segment"),
        ("induction", dict(lr=0), "lr=0"),
        ("induction", dict(warmup=2000), "fewer than steps"),
        ("induction", dict(text="abc"), "text recipe"),
        ("induction", dict(colour="red"), "unknown setting colour"),
        ("nasi-lemak", dict(n_layers=2), "shape is fixed"),
        ("nasi-lemak", dict(seq_len=4), "cannot hold 'nasi '"),
        ("text", dict(text="x" * (TEXT_MAX_CHARS + 1)), "at most 1,000,000"),
        ("text", dict(text="".join(map(chr, range(0x4E00, 0x4E00 + TEXT_MAX_VOCAB + 1))) * 10), "distinct characters"),
        ("text", dict(text="too short"), "lengthen it or lower seq_len"),
        ("poetry", {}, "not one of"),
    ],
)
def test_bad_settings_are_refused_with_what_to_change(recipe, changes, message):
    with pytest.raises(ValueError, match=message):
        settings(recipe, **changes)


def _longest_repeat(row: np.ndarray) -> tuple[int, int]:
    """(length, end of the second copy) of the longest segment that appears twice without overlapping."""
    best = (0, 0)
    for first in range(len(row)):
        for second in range(first + 1, len(row)):
            k = 0
            while second + k < len(row) and first + k < second and row[first + k] == row[second + k]:
                k += 1
            best = max(best, (k, second + k))
    return best


def test_induction_batches_repeat_a_segment_of_varying_length_at_varying_places():
    recipe = make_recipe(settings("induction"))
    batch = recipe.batch(np.random.default_rng(0))
    assert batch.shape == (32, 33) and batch.min() >= 0 and batch.max() < 32
    repeats = [_longest_repeat(row) for row in batch]
    assert all(k >= 4 for k, _ in repeats)
    assert len({k for k, _ in repeats}) > 3 and len({end for _, end in repeats}) > 3  # neither length nor place fixed


def test_nasi_lemak_starts_from_the_spec_model():
    run = Training(settings("nasi-lemak"))
    assert run.recipe.target(lambda t: run._logits(np.asarray(t)[None])[0]) == pytest.approx(0.151, abs=5e-4)
    # The spec's printed distribution after "nasi ", all nine characters.
    logits = run._logits(run.recipe.encode(NASI_LEMAK_PROMPT)[None])[0, -1].astype(np.float64)
    p = np.exp(logits - logits.max())
    p /= p.sum()
    spec = {" ": 0.211, "a": 0.115, "e": 0.112, "i": 0.123, "k": 0.062, "l": 0.151, "m": 0.076, "n": 0.09, "s": 0.06}
    assert {c: round(float(x), 3) for c, x in zip(run.recipe.vocab, p)} == spec


# ------------------------------------------------------------------ export


def test_the_card_records_the_blas_the_run_trained_on(tmp_path):
    """config.json's card: NumPy's BLAS, its kernel and the thread count of the steps (one, here), which
    with NumPy's version decide the last bits; none for a run that took no step."""
    from threadpoolctl import threadpool_info

    run = Training(small(steps=2, eval_interval=2))
    run.run()
    card = json.loads((run.export(tmp_path / "model") / "config.json").read_text())["transformer_explorer"]
    numpy_blas = [i for i in threadpool_info() if i["user_api"] == "blas" and "numpy" in i["filepath"]]
    if not numpy_blas:  # a BLAS threadpoolctl cannot see (macOS's Accelerate): nothing to record
        pytest.skip("threadpoolctl sees no BLAS of NumPy's here")
    blas = numpy_blas[0]
    assert card["blas"] == {
        "library": blas["internal_api"],
        "version": blas["version"],
        "kernel": blas.get("architecture"),
        "threads": 1,
    }
    assert card["numpy"] == np.__version__
    untrained = Training(small(steps=2, eval_interval=2)).export(tmp_path / "untrained")
    assert "blas" not in json.loads((untrained / "config.json").read_text())["transformer_explorer"]


def test_exported_folder_loads_in_core_with_the_same_logits(tmp_path):
    run = Training(small(attn_only=True, steps=4, eval_interval=4))
    run.run()
    folder = run.export(tmp_path / "model")
    assert sorted(p.name for p in folder.iterdir()) == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    ckpt = load_checkpoint(folder)
    assert ckpt.cfg.attn_only and "mlp" not in ckpt.params["blocks"][0]
    text = "Ali makan nasi."  # 15 characters: the context here is 16
    ids = ckpt.tokenizer.encode(text).ids
    assert ids == list(run.recipe.encode(text))  # lower-cased, one token per character
    ours, _ = run_with_cache(run.params, run.cfg, np.array(ids))
    theirs, _ = run_with_cache(ckpt.params, ckpt.cfg, np.array(ids))
    assert np.array_equal(ours, theirs)  # the same float32 numbers, exactly
    assert run_with_cache(ckpt.params, ckpt.cfg, np.array(ids), logits=False)[1].head_detector_scores()[
        "induction"
    ].shape == (2, 2)


def test_nasi_lemak_exports_exactly_with_unit_gains_and_zero_biases(tmp_path):
    run = Training(settings("nasi-lemak", steps=5, eval_interval=5))
    run.run()
    ckpt = load_checkpoint(run.export(tmp_path / "nasi"))
    block = ckpt.params["blocks"][0]
    assert np.all(block["ln1"]["w"] == 1) and np.all(block["ln1"]["b"] == 0)
    assert not np.any(block["attn"]["b_QKV"]) and not np.any(block["mlp"]["b_in"])
    ids = np.array(ckpt.tokenizer.encode(NASI_LEMAK_PROMPT).ids)
    np.testing.assert_array_equal(
        run_with_cache(ckpt.params, ckpt.cfg, ids)[0], run_with_cache(run.params, run.cfg, ids)[0]
    )
    with pytest.raises(ValueError, match="'gor' are not in this model's vocabulary"):
        ckpt.tokenizer.encode("nasi goreng")


def test_char_tokenizer_round_trips_every_character(tmp_path):
    from tokenizers import Tokenizer

    recipe = make_recipe(settings("text", **SMALL, text=python_docs()[:30_000]))
    run = Training(recipe.settings)
    folder = run.export(tmp_path / "text")
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    text = "def f(x):\n    return {'a': x}  # ok\n"
    enc = tok.encode(text)
    assert enc.ids == list(recipe.encode(text)) and len(enc.ids) == len(text)
    assert tok.decode(enc.ids) == text
    assert tok.encode("é").ids == [0]  # a character the text never had is [UNK]


# ------------------------------------------------------------------ the recipes learn what they promise


def test_an_induction_head_forms_and_the_one_layer_control_forms_none():
    """The induction recipe's defaults (seed 0), stopped as soon as a layer-1 head's induction score on the
    probe passes 0.4 (bounded by the recipe's 1,000 steps); the 1-layer control, trained as long, stays
    below 0.15 at every record."""
    run = Training(settings("induction"))
    first = None
    for record in run.records():
        first = first or record
        if record.best_induction > 0.4:
            break
    assert first.best_induction < 0.15  # untrained: attention is nearly uniform
    assert record.best_induction > 0.4, f"no induction head by step {run.step}"
    assert max(max(row) for row in record.previous_token) > 0.3  # the previous-token head it builds on
    control = Training(run.recipe.control().replace(steps=run.step))
    scores = [r.best_induction for r in control.records()]
    assert max(scores) < 0.15, scores


def test_nasi_lemak_learns_that_l_follows_nasi():
    run = Training(settings("nasi-lemak"))
    records = []
    for record in run.records():
        records.append(record)
        if record.target > 0.9:
            break
    assert records[0].target == pytest.approx(0.151, abs=5e-4)  # the spec's random model
    assert records[-1].target > 0.9


# ------------------------------------------------------------------ the command line


def test_the_command_prints_one_line_per_record_and_saves_a_folder(tmp_path):
    import subprocess
    import sys

    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "core.train",
            "nasi-lemak",
            "--steps",
            "20",
            "--eval-interval",
            "10",
            "--out",
            str(tmp_path / "m"),
            "--snapshot",
            str(tmp_path / "s.npz"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if " step " in line]
    assert [line.split("step")[1].split()[0] for line in lines] == ["0/20", "10/20", "20/20"]
    assert "target" in lines[-1] and (tmp_path / "m" / "model.safetensors").is_file()
    assert Snapshot.load(tmp_path / "s.npz").step == 20

    bad = subprocess.run(
        [sys.executable, "-m", "core.train", "induction", "--d-model", "30"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "not divisible by n_heads=4" in bad.stderr


def test_a_diverging_run_stops_with_what_to_change():
    run = Training(small())
    run.vector.flat[:5] = np.inf  # what a far too high learning rate ends in
    with (
        np.errstate(invalid="ignore"),
        pytest.raises(ValueError, match="loss became nan at step 1: .* lower the learning rate"),
    ):
        run.train_step()


def test_missing_scores_are_json_null():
    r = Record(
        step=0,
        steps=1,
        lr=0.1,
        train_loss=None,
        val_loss=float("nan"),
        grad_norm=float("inf"),
        previous_token=[[0.5, float("nan")]],
        induction=[[0.1, 0.2]],
        icl_score=0.0,
        target=None,
    )
    assert json.loads(json.dumps(r.to_dict(), allow_nan=False))["previous_token"] == [[0.5, None]]


def test_the_loader_refuses_an_attn_only_folder_whose_mlp_is_not_zero(tmp_path):
    from safetensors.numpy import load_file, save_file

    from core.checkpoints import CheckpointError

    run = Training(small(attn_only=True, steps=1, eval_interval=1))
    folder = run.export(tmp_path / "m")
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["transformer.h.1.mlp.c_proj.bias"] = np.ones_like(tensors["transformer.h.1.mlp.c_proj.bias"])
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="attn_only, but layer 1's MLP"):
        load_checkpoint(folder)
