"""/glossary: the field's terms in English and in Bahasa Melayu, the words the Malay pages use.

Each term is written once here: its English name, the Malay term every Malay page and message uses for
it (Dewan Bahasa dan Pustaka's spelling, the field's established term where there is one) and what it
means, in English and marked for the catalogue, so the Malay page explains it in Malay. The table is
sorted by the reader's own language.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from app.http.language import N_, _, current
from app.pages import web

router = APIRouter(tags=["pages"], include_in_schema=False)


@dataclass(frozen=True)
class Term:
    en: str
    ms: str
    meaning: str  # English, marked for the catalogue


TERMS = [
    Term(
        "attention",
        "perhatian",
        N_("How much each token draws on every other token: a row of weights per token, mixing the tokens' values."),
    ),
    Term("query", "kueri", N_("A token's vector saying what it is looking for (q = x W_Q).")),
    Term("key", "kunci", N_("A token's vector saying what it offers to be found by (k = x W_K).")),
    Term("value", "nilai", N_("A token's vector saying what it hands over when attended to (v = x W_V).")),
    Term("score", "skor", N_("A query's dot product with a key, before the softmax.")),
    Term(
        "weight",
        "pemberat",
        N_(
            "An attention weight: a score after the softmax, between 0 and 1, each row "
            "summing to 1. Also a learned number of the model (its weights)."
        ),
    ),
    Term(
        "softmax",
        "softmax",
        N_("Exponentiates a row of scores and divides by their sum, so they become weights that sum to 1."),
    ),
    Term("mask", "topeng", N_("Sets scores to −∞ before the softmax, so their weights are exactly 0.")),
    Term(
        "causal mask",
        "topeng kausal",
        N_("The mask that hides every later token: a token sees only itself and the tokens before it."),
    ),
    Term("head", "kepala", N_("One attention of several side by side in a layer, each with its own projections.")),
    Term(
        "multi-head attention",
        "perhatian berbilang kepala",
        N_("Several heads run side by side and their outputs concatenated."),
    ),
    Term("layer", "lapisan", N_("One block of the model: attention, then the MLP, each added to the residual stream.")),
    Term("block", "blok", N_("A layer: attention and an MLP with their norms.")),
    Term("token", "token", N_("The unit a model reads: a word, a piece of a word or a character.")),
    Term("tokeniser", "pentoken", N_("What splits a text into tokens and numbers them.")),
    Term("embedding", "pembenaman", N_("The vector a token (or a position) is turned into: a row of a learned table.")),
    Term(
        "unembedding",
        "nyahpembenaman",
        N_("The last matrix, turning the stream into a score (logit) for every token of the vocabulary."),
    ),
    Term("vector", "vektor", N_("A list of numbers; a token is one vector of d_model numbers.")),
    Term("matrix", "matriks", N_("A table of numbers: rows and columns.")),
    Term("dimension", "dimensi", N_("One of the numbers of a vector; a width (d_model, d_head) counts them.")),
    Term("width", "lebar", N_("How many numbers a vector has: d_model, d_head, d_mlp.")),
    Term("position", "kedudukan", N_("Where a token stands in the text, counted from 0.")),
    Term(
        "positional encoding",
        "pengekodan kedudukan",
        N_("What tells the model where each token stands: a vector added to the embedding, or a rotation."),
    ),
    Term("residual stream", "aliran baki", N_("The running sum every attention and MLP adds its output to.")),
    Term(
        "layer norm",
        "penormalan lapisan",
        N_("Rescales a vector to mean 0 and variance 1, then applies a learned gain and shift."),
    ),
    Term("MLP", "MLP", N_("The multilayer perceptron of a block: widen, a non-linearity such as ReLU, narrow again.")),
    Term("bias", "pincang", N_("A learned number added after a matrix product.")),
    Term("parameter", "parameter", N_("A number the model learns; a model is counted by its parameters.")),
    Term("logit", "logit", N_("A score for a next token, before the softmax turns the scores into probabilities.")),
    Term("logit lens", "kanta logit", N_("Reads the residual stream after each layer as if it were the last.")),
    Term("probability", "kebarangkalian", N_("A number between 0 and 1; a prediction's probabilities sum to 1.")),
    Term("prediction", "ramalan", N_("What the model expects next: the token with the highest probability.")),
    Term("vocabulary", "kosa kata", N_("Every token a model knows.")),
    Term("character", "aksara", N_("A letter, digit, space or sign: the token of a character-level model.")),
    Term("seed", "benih", N_("The number that fixes the random draws, so a run can be repeated exactly.")),
    Term("training", "latihan", N_("Adjusting the weights, step by step, so the loss falls.")),
    Term(
        "loss", "kehilangan", N_("How wrong the predictions are: the cross-entropy of the next token, lower is better.")
    ),
    Term("step", "langkah", N_("One update of the weights during training.")),
    Term("learning rate", "kadar pembelajaran", N_("How far one step moves the weights.")),
    Term("batch", "kelompok", N_("The texts a step learns from, or a model runs on, at once.")),
    Term("checkpoint", "titik semak", N_("Saved weights that a model can be loaded from.")),
    Term(
        "KV cache",
        "tembolok KV",
        N_("The keys and values of earlier tokens, kept so generating a token does not recompute them."),
    ),
    Term("ablation", "ablasi", N_("Switching a head off (zero or its mean output) to see what it did.")),
    Term(
        "induction head",
        "kepala induksi",
        N_(
            "A head that finds an earlier copy of the current token and "
            "looks at the token after it, to repeat what came next."
        ),
    ),
    Term("previous-token head", "kepala token sebelumnya", N_("A head that looks at the token just before.")),
    Term(
        "attention rollout",
        "gulungan perhatian",
        N_("The layers' attention multiplied through, to trace which input tokens reach a position."),
    ),
    Term("heatmap", "peta haba", N_("A figure of a matrix, one coloured cell per number.")),
    Term("encoder", "pengekod", N_("A model without the causal mask: every token sees every token (BERT).")),
    Term("decoder", "penyahkod", N_("A model with the causal mask that predicts the next token (GPT).")),
    Term("forward pass", "hantaran ke depan", N_("One run of the model over a text, from tokens to logits.")),
    Term("scaling", "penskalaan", N_("Dividing the scores by √d_head, so the softmax does not saturate.")),
    Term("dot product", "hasil darab titik", N_("Multiply two vectors number by number and add up.")),
    Term("gradient", "kecerunan", N_("How the loss changes with each weight: what a training step follows.")),
    Term("preset", "praset", N_("A ready-made set of sizes, such as GPT-2 small's.")),
    Term("context", "konteks", N_("The tokens a model can see at once: at most n_ctx.")),
    Term("generation", "penjanaan", N_("Writing with a model: predict the next token, draw one, append it, repeat.")),
    Term("prompt", "gesaan", N_("The text a model continues.")),
    Term("sampling", "pensampelan", N_("Drawing the next token at random from the model's probabilities.")),
    Term(
        "temperature",
        "suhu",
        N_(
            "Divides the logits before the softmax: below 1 sharpens the probabilities, above 1 "
            "flattens them; 0 is greedy."
        ),
    ),
    Term("greedy", "tamak", N_("Always taking the most likely token: nothing is drawn.")),
    Term("distribution", "taburan", N_("The probabilities of every possible next token.")),
    Term(
        "attention sink",
        "sinki perhatian",
        N_("A head that puts most of its weight on the first token when it has nothing better to attend to."),
    ),
    Term("circuit", "litar", N_("The heads and paths through the model that together do one task.")),
    Term(
        "activation patching",
        "penampalan pengaktifan",
        N_(
            "Running the model again with one activation taken "
            "from another run, to see how much of the answer it "
            "carries."
        ),
    ),
    Term("clean run", "larian bersih", N_("The run on the text where the model predicts the answer.")),
    Term("corrupted run", "larian rosak", N_("The run on a text of the same length where it cannot.")),
    Term(
        "composition",
        "komposisi",
        N_("A later head reading an earlier head's output through its queries, keys or values."),
    ),
    Term(
        "copying score",
        "skor penyalinan",
        N_("How much a head raises the logit of the very token it attends to: 1 copies, −1 suppresses."),
    ),
]


@router.get("/glossary", response_class=HTMLResponse, summary="The terms in English and Bahasa Melayu")
def glossary(request: Request) -> Response:
    malay = current() == "ms"
    rows = [
        {
            "term": t.ms if malay else t.en,
            "other": t.en if malay else t.ms,
            "meaning": _(t.meaning),
            "lang": "en" if malay else "ms",
        }
        for t in TERMS
    ]
    rows.sort(key=lambda r: r["term"].casefold())
    context = {
        "rows": rows,
        "nav": "glossary",
        "classroom": web.is_on(request.query_params, "classroom"),
        "form_id": None,
    }
    return web.render(request, "glossary.html", context)
