"""A Hugging Face tokenizer.json through the `tokenizers` package, with tokens shown readably.

Three ways of writing a token exist among the supported families, and each is shown as the text
it stands for, with whitespace made visible so a token's leading space stays visible on an axis:
  WordPiece (BERT)             "the", "##s": shown as they are ("##" marks a piece continuing a word)
  byte-level BPE (GPT-2, Qwen, SmolLM2, Pythia, TinyStories)
                               every byte written as a printable character: "Ġthe" -> "␣the", "Ċ" -> "↵"
  SentencePiece (TinyLlama, Llama 2, Mistral)
                               "▁the" -> "␣the", and byte-fallback pieces "<0x0A>" -> "↵"
A piece holding part of a multi-byte character shows those bytes as \\xNN escapes. Special tokens
([CLS], <|endoftext|>, <s>) are shown as they are.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ..errors import InputError
from ..i18n import _
from ..tokenizers import Encoding
from .tensors import TOKENIZER_FILE, CheckpointError

# How whitespace inside a token is shown: "Ġthe" is shown "␣the" and "Ċ" is shown "↵".
_VISIBLE_WHITESPACE = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"}
_METASPACE = "▁"  # U+2581, SentencePiece's mark for a space
_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE writes every byte as a printable character: bytes that already are
    printable (in ASCII or Latin-1) stand for themselves, the other 68 (controls, space, soft
    hyphen...) are moved, in byte order, to the characters from U+0100 on; so a space is "Ġ"
    (U+0120) and a newline "Ċ" (U+010A). Returns that character -> byte table."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {chr(b): b for b in printable}
    moved = (b for b in range(256) if b not in table.values())
    table |= {chr(256 + i): b for i, b in enumerate(moved)}
    return table


def _decoder_types(spec: dict | None) -> set[str]:
    """The decoder's type and, for a Sequence, its parts' types (from tokenizer.json)."""
    if not isinstance(spec, dict):
        return set()
    types = {str(spec.get("type"))}
    for part in spec.get("decoders") or []:
        types |= _decoder_types(part)
    return types


def _visible(text: str) -> str:
    return "".join(_VISIBLE_WHITESPACE.get(c, c) for c in text)


class HFTokenizer:
    """A tokenizer.json, as core's Tokenizer protocol: encode(text) -> Encoding, token_str(id).

    The ids are exactly what `tokenizers` (and so transformers' fast tokenizer) gives, special
    tokens included (a Llama tokenizer's <s> at the start); padding and truncation are off.
    """

    def __init__(self, path: str | Path):
        from tokenizers import Tokenizer  # lazily: `import core` needs NumPy only

        try:
            self._tok = Tokenizer.from_file(str(path))
            decoder = json.loads(Path(path).read_text(encoding="utf-8")).get("decoder")
        except Exception as e:
            raise CheckpointError(f"{TOKENIZER_FILE} cannot be read: {e}") from None
        # Sentence-transformers folders pad every text to a fixed length and silently truncate:
        # the explorer wants exactly the text's tokens, and a clear error when it is too long.
        self._tok.no_padding()
        self._tok.no_truncation()
        types = _decoder_types(decoder)
        self.byte_level = "ByteLevel" in types
        self.metaspace = not self.byte_level and bool(types & {"Metaspace", "Replace", "ByteFallback"})
        self._special = {t.content for t in self._tok.get_added_tokens_decoder().values() if t.special}
        self._alphabet = _byte_level_alphabet() if self.byte_level else {}
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> Encoding:
        if not text:
            raise InputError(_("the text is empty: type at least one word"))
        try:
            enc = self._tok.encode(text)
        except Exception as e:  # a vocabulary with no [UNK] (a character model's) meets a character it lacks
            unknown = sorted({c for c in text if self._tok.token_to_id(c) is None})
            raise InputError(
                _("characters {unknown!r} are not in this model's vocabulary").format(unknown="".join(unknown))
                if unknown
                else _("the tokenizer cannot encode this text: {error}").format(error=e)
            ) from None
        if not enc.ids:
            raise InputError(_("the tokenizer found no tokens in {text!r}").format(text=text))
        return Encoding(list(enc.ids), [self._readable(t) for t in enc.tokens])

    def token_str(self, token_id: int) -> str:
        token = self._tok.id_to_token(int(token_id))
        if token is None:
            raise InputError(
                _("token id {token_id} is not in the vocabulary of {vocab_size} tokens").format(
                    token_id=token_id, vocab_size=self.vocab_size
                )
            )
        return self._readable(token)

    def _readable(self, token: str) -> str:
        if token in self._special:
            return token
        if self.byte_level:
            if any(c not in self._alphabet for c in token):
                return token
            return _visible(bytes(self._alphabet[c] for c in token).decode("utf-8", errors="backslashreplace"))
        if self.metaspace:
            byte = _BYTE_FALLBACK.fullmatch(token)
            if byte:  # one raw byte: a control character, or part of a multi-byte one
                return _visible(bytes([int(byte[1], 16)]).decode("utf-8", errors="backslashreplace"))
            return _visible(token.replace(_METASPACE, " "))
        return token
