"""Token counts with the encoder's own tokenizer, for the state renderer's token budget.

The encoder cuts every text at its token limit; a state rendered to fit in characters can still
lose its end there, and characters per token vary by a factor of three between prose, code and
JSON. Counting with the same tokenizer the encoder uses (loaded offline from the encoder's
folder, once per process) lets the renderer decide what is dropped: the oldest history.
"""

from __future__ import annotations

from functools import lru_cache

from harnessrl.errors import ConfigError


@lru_cache(maxsize=4)
def load_tokenizer(name: str):
    """The tokenizer of encoder `name` (a builtin name or a local sentence-transformers folder);
    only the tokenizer files are read, nothing is downloaded."""
    from harnessrl.encoders import resolve_model_path
    from harnessrl.settings import apply_offline_env

    apply_offline_env()
    from transformers import AutoTokenizer

    path = resolve_model_path(name)
    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"render.tokenizer {name!r}: no tokenizer in {path}: {exc}") from None


@lru_cache(maxsize=32768)
def count_pieces(name: str, text: str) -> int:
    """Tokens of a piece of a text, without the special tokens (cached: history lines recur in
    the states of the following steps)."""
    return len(load_tokenizer(name)(text, add_special_tokens=False)["input_ids"])


def count_text(name: str, text: str) -> int:
    """Tokens of a whole text as the encoder sees it, special tokens included."""
    return len(load_tokenizer(name)(text, add_special_tokens=True, truncation=False)["input_ids"])


@lru_cache(maxsize=4)
def splits_on_whitespace(name: str) -> bool:
    """True when the tokenizer splits words at whitespace before anything else (BERT's WordPiece):
    then the tokens of lines joined by newlines are exactly the sum of each line's tokens, and the
    renderer need not tokenize the whole text again to check its estimate."""
    backend = getattr(load_tokenizer(name), "backend_tokenizer", None)
    pre = getattr(backend, "pre_tokenizer", None)
    return type(pre).__name__ in {"BertPreTokenizer", "Whitespace", "WhitespaceSplit"}


@lru_cache(maxsize=4)
def special_tokens(name: str) -> int:
    """How many tokens the tokenizer adds to every text (2 for BERT: [CLS] and [SEP])."""
    return count_text(name, "") - count_pieces(name, "")
