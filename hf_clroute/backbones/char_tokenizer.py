"""A character-level tokenizer that is a real ``transformers`` slow tokenizer.

The char-LM benchmarks (APN on Shakespeare / Bible / Python source) need a
vocabulary of single characters. Building it as a ``PreTrainedTokenizer``
subclass gives us ``__call__``, padding, ``batch_decode``, ``save_pretrained``
and ``from_pretrained`` for free, so the LM path looks exactly like any other
Hugging Face model to the engine and to ``generate``.

transformers 5.x notes (checked against 5.24, ``tokenization_python.py``):

* ``PreTrainedTokenizer`` is an alias of ``PythonBackend``; a subclass must
  implement ``get_vocab``, ``_tokenize``, ``_convert_token_to_id``,
  ``_convert_id_to_token``; ``convert_tokens_to_string`` defaults to joining
  with spaces, so we override it; ``save_vocabulary`` has a default that only
  looks at ``self.encoder``/``self.vocab`` and would write non-ASCII
  characters escaped, so we write our own ``vocab.json``.
* The vocabulary must exist *before* ``super().__init__`` runs, because the
  base class then adds any special token missing from ``get_vocab()`` at the end.
* No special tokens are added around a sequence (``special_tokens_pattern`` is
  ``"none"``), so ``encode(text)`` is exactly one id per character.
* ``AutoTokenizer`` only resolves a ``tokenizer_class`` name that is either
  built into transformers or registered in this process. Importing this module
  registers ``CharTokenizer`` (under a string key, so no transformers config
  class is hijacked); ``hf_clroute.backbones.catalog.load_backbone`` also picks it
  directly from ``tokenizer_config.json``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable

from transformers import AutoTokenizer, PreTrainedTokenizer

VOCAB_FILE_NAME = "vocab.json"
PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<bos>", "<eos>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, UNK, BOS, EOS)
_SPECIAL_TOKEN_KWARGS = ("pad_token", "unk_token", "bos_token", "eos_token")


class CharTokenizer(PreTrainedTokenizer):
    """One token per character; ids 0-3 are ``<pad> <unk> <bos> <eos>``.

    Unknown characters map to ``<unk>``. Decoding the ids of a text whose
    characters are all in the vocabulary gives the text back exactly.
    """

    vocab_files_names = {"vocab_file": VOCAB_FILE_NAME}
    # GPT-2 would embed `token_type_ids` with its word embeddings: never emit them.
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(
        self,
        vocab_file: str | None = None,
        vocab: dict[str, int] | None = None,
        **kwargs,
    ) -> None:
        if vocab is None:
            if vocab_file is None:
                raise ValueError("CharTokenizer needs `vocab` or `vocab_file`")
            with open(vocab_file, encoding="utf-8") as f:
                vocab = json.load(f)
        self._vocab: dict[str, int] = dict(vocab)
        self._ids_to_tokens: dict[int, str] = {i: t for t, i in self._vocab.items()}
        for key, token in zip(_SPECIAL_TOKEN_KWARGS, SPECIAL_TOKENS):
            kwargs.setdefault(key, token)
        # Decoding must not "clean up" spaces before punctuation: exact round trip.
        kwargs.setdefault("clean_up_tokenization_spaces", False)
        kwargs.setdefault("special_tokens_pattern", "none")
        super().__init__(**kwargs)

    @classmethod
    def from_corpus(
        cls, texts: Iterable[str], extra_chars: Iterable[str] = "", **kwargs
    ) -> CharTokenizer:
        """Build the vocabulary from every character of ``texts`` (+ ``extra_chars``).

        Characters are sorted so the same corpus always gives the same ids.
        """
        chars: set[str] = set(extra_chars)
        for text in texts:
            chars.update(text)
        vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
        for ch in sorted(chars - set(SPECIAL_TOKENS)):
            vocab[ch] = len(vocab)
        return cls(vocab=vocab, **kwargs)

    @property
    def vocab_size(self) -> int:
        return len(self._vocab)

    def get_vocab(self) -> dict[str, int]:
        return {**self._vocab, **self._added_tokens_encoder}

    def _tokenize(self, text: str, **kwargs) -> list[str]:
        return list(text)

    def _convert_token_to_id(self, token: str) -> int:
        return self._vocab.get(token, self._vocab[str(self.unk_token)])

    def _convert_id_to_token(self, index: int) -> str:
        return self._ids_to_tokens.get(index, str(self.unk_token))

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return "".join(tokens)

    def save_vocabulary(
        self, save_directory: str, filename_prefix: str | None = None
    ) -> tuple[str]:
        prefix = f"{filename_prefix}-" if filename_prefix else ""
        path = os.path.join(save_directory, prefix + VOCAB_FILE_NAME)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self._vocab, f, ensure_ascii=False, indent=0)
        return (path,)


# A string key: registers the class name for `AutoTokenizer` without mapping
# any transformers config class (e.g. GPT2Config) to this tokenizer.
AutoTokenizer.register("hf_clroute_char", tokenizer_class=CharTokenizer, exist_ok=True)
