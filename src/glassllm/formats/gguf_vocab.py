"""A GGUF file's tokenizer (`tokenizer.ggml.*` keys) as a glassllm tokenizer.

Two of llama.cpp's vocabulary kinds (`tokenizer.ggml.model`, llama.cpp src/llama-vocab.cpp):

- "llama": SentencePiece BPE with byte fallback, `tokens` (the word marker stored as
  U+2581), `scores`, `token_type`. llama.cpp's `llm_tokenizer_spm` merges the best-scoring
  adjacent pair first, as llama2.c's run.c does: this is `SentencePieceTokenizer` (ids fixed
  as Llama's: <unk> 0, BOS 1, EOS 2, the byte pieces at 3..258, a dummy-prefix space).
- "gpt2": byte-level BPE, `tokens` (GPT-2's printable stand-ins for bytes), `merges`
  ("a b", rank order), `token_type` (3: control tokens, which stand for no bytes). With
  `tokenizer.ggml.pre` "gpt-2" (or absent) the text is split by GPT-2's regex: this is
  `BPETokenizer`. Other pre-tokenizers (llama3's, qwen2's, ...) split differently and are
  refused.

Anything else -- another model kind or pre-tokenizer, special ids elsewhere than the
tokenizer class has them, no space prefix -- is refused in one line naming the file and key.
"""
from __future__ import annotations

from ..tokenizers import SentencePieceTokenizer
from ..tokenizers.bpe import BPETokenizer
from ..tokenizers.sentencepiece import SP_BOS_ID, SP_EOS_ID, SP_UNK_ID
from . import gguf_names as names

_TOK = "tokenizer.ggml."
GPT2_PRE = ("gpt-2",)


def tokenizer_from_gguf(f):
    """The tokenizer of a `GGUFFile`, or None when it has no `tokenizer.ggml.model`.

    Raises:
        ValueError: one line naming the file and the key: a vocabulary kind or pre-tokenizer
            glassllm does not implement, missing tokens/scores/merges, special ids other than
            the tokenizer's, a vocabulary the tokenizer class refuses.
    """
    kind = f.get(_TOK + "model")
    if kind is None or kind in ("none", "no_vocab"):  # llama.cpp's names for "ids only"
        return None
    tokens = f.get(_TOK + "tokens")
    if not isinstance(tokens, list) or not tokens:
        raise ValueError(f"{f.path}: key 'tokenizer.ggml.tokens' is missing or empty")
    try:
        if kind == "llama":
            return _sentencepiece(f, tokens)
        if kind == "gpt2":
            return _byte_level_bpe(f, tokens)
    except ValueError as e:
        if str(e).startswith(f.path):
            raise
        raise ValueError(f"{f.path}: the {kind!r} vocabulary: {e}") from None
    raise ValueError(f"{f.path}: tokenizer.ggml.model {kind!r} is not supported by glassllm "
                     f"(supported: 'llama' SentencePiece, 'gpt2' byte-level BPE)")


def _require_id(f, key: str, expected: int) -> None:
    value = f.get(_TOK + key)
    if value is not None and value != expected:
        raise ValueError(f"{f.path}: tokenizer.ggml.{key} = {value}; glassllm's SentencePiece "
                         f"tokenizer has it at {expected}")


def _sentencepiece(f, tokens: list) -> SentencePieceTokenizer:
    scores = f.get(_TOK + "scores")
    if not isinstance(scores, list) or len(scores) != len(tokens):
        raise ValueError(f"{f.path}: key 'tokenizer.ggml.scores' is missing or not one score "
                         f"per token")
    for key, expected in (("bos_token_id", SP_BOS_ID), ("eos_token_id", SP_EOS_ID),
                          ("unknown_token_id", SP_UNK_ID)):
        _require_id(f, key, expected)
    if f.get(_TOK + "add_space_prefix", True) is not True:
        raise ValueError(f"{f.path}: tokenizer.ggml.add_space_prefix is false; glassllm's "
                         f"SentencePiece tokenizer always adds the dummy-prefix space")
    return SentencePieceTokenizer([names.sp_piece_from_gguf(t) for t in tokens], scores)


def _byte_level_bpe(f, tokens: list) -> BPETokenizer:
    from tokenizers import AddedToken, Tokenizer, models
    pre = f.get(_TOK + "pre")
    if pre is not None and pre not in GPT2_PRE:
        raise ValueError(f"{f.path}: tokenizer.ggml.pre {pre!r} is not supported by glassllm "
                         f"(only GPT-2's pre-tokenizer, {GPT2_PRE[0]!r})")
    merges = f.get(_TOK + "merges", [])
    if not all(isinstance(m, str) and m.count(" ") == 1 for m in merges):
        raise ValueError(f"{f.path}: tokenizer.ggml.merges must be strings 'a b'")
    types = f.get(_TOK + "token_type") or [names.TOKEN_NORMAL] * len(tokens)
    if len(types) != len(tokens):
        raise ValueError(f"{f.path}: tokenizer.ggml.token_type has {len(types)} entries for "
                         f"{len(tokens)} tokens")
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise ValueError(f"{f.path}: tokenizer.ggml.tokens holds a token twice")
    bpe = models.BPE(vocab=vocab, merges=[tuple(m.split(" ")) for m in merges])
    hf = BPETokenizer._byte_level(Tokenizer(bpe))
    eos = f.get(_TOK + "eos_token_id")
    if eos is None:
        eot = "<|endoftext|>"
    elif isinstance(eos, int) and 0 <= eos < len(tokens):
        eot = tokens[eos]
    else:
        raise ValueError(f"{f.path}: tokenizer.ggml.eos_token_id {eos!r} is not a token id")
    special = [t for t, kind in zip(tokens, types) if kind == names.TOKEN_CONTROL or t == eot]
    hf.add_special_tokens([AddedToken(t, special=True) for t in special])
    return BPETokenizer(hf, eot_token=eot)
