"""The spec's two tokenisers: words split on spaces, and characters of a fixed vocabulary."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

from .errors import InputError
from .i18n import _


class Encoding(NamedTuple):
    ids: list[int]  # token ids, one per token
    tokens: list[str]  # each token as a reader should see it (WordPiece "##", GPT-2 "Ġ" made readable)


class Tokenizer(Protocol):
    """What a runnable model needs from its tokeniser (the toys' and Hugging Face's alike)."""

    def encode(self, text: str) -> Encoding: ...

    def token_str(self, token_id: int) -> str: ...  # one vocabulary entry, readable (for top-k lists)


def word_tokens(text: str) -> list[str]:
    """Split on spaces, as the spec's "Ali makan nasi lemak" examples do."""
    tokens = text.split()
    if not tokens:
        raise InputError(_("the text is empty: type at least one word"))
    return tokens


@dataclass(frozen=True)
class CharTokenizer:
    """Character-level: the vocabulary is the sorted set of characters of a corpus."""

    vocab: tuple[str, ...]

    @classmethod
    def from_text(cls, corpus: str) -> CharTokenizer:
        if not corpus:
            raise InputError(_("a character vocabulary needs a non-empty corpus"))
        return cls(tuple(sorted(set(corpus))))

    @property
    def stoi(self) -> dict[str, int]:
        return {c: i for i, c in enumerate(self.vocab)}

    def encode(self, text: str) -> list[int]:
        if not text:
            raise InputError(_("the text is empty: type at least one character"))
        stoi = self.stoi
        unknown = sorted({c for c in text if c not in stoi})
        if unknown:
            raise InputError(
                _("characters {unknown!r} are not in the vocabulary {vocab!r}").format(
                    unknown="".join(unknown), vocab="".join(self.vocab)
                )
            )
        return [stoi[c] for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(self.vocab[i] for i in ids)


PRINTABLE_ASCII = tuple(chr(c) for c in range(32, 127))  # space .. "~": 95 characters
UNK = "[UNK]"


@dataclass(frozen=True)
class AsciiTokenizer:
    """The explorer toy's tokeniser: one id per printable ASCII character, plus one [UNK] id.

    Any other character (an accent, an emoji, another script, a combining mark, a newline)
    becomes [UNK], so every text runs; the token is still shown as the character typed.
    """

    vocab: tuple[str, ...] = PRINTABLE_ASCII + (UNK,)

    @property
    def unk_id(self) -> int:
        return len(self.vocab) - 1

    def encode(self, text: str) -> Encoding:
        if not text:
            raise InputError(_("the text is empty: type at least one character"))
        stoi = {c: i for i, c in enumerate(self.vocab[:-1])}
        return Encoding([stoi.get(c, self.unk_id) for c in text], list(text))

    def token_str(self, token_id: int) -> str:
        return self.vocab[token_id]
