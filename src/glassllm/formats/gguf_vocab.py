"""A GGUF file's tokenizer (`tokenizer.ggml.*` keys) as a glassllm tokenizer.

Two of llama.cpp's vocabulary kinds (`tokenizer.ggml.model`, llama.cpp src/llama-vocab.cpp):

- "llama": SentencePiece BPE with byte fallback, `tokens` (the word marker stored as
  U+2581), `scores`, `token_type`. llama.cpp's `llm_tokenizer_spm` merges the best-scoring
  adjacent pair first, as llama2.c's run.c does: this is `SentencePieceTokenizer` (ids fixed
  as Llama's: <unk> 0, BOS 1, EOS 2, the byte pieces at 3..258, a dummy-prefix space).
- "gpt2": byte-level BPE, `tokens` (GPT-2's printable stand-ins for bytes), `merges`
  ("a b", rank order), `token_type` (3: control tokens, which stand for no bytes; 4:
  user-defined tokens, which llama.cpp matches as whole strings before BPE). This is
  `BPETokenizer`, with the text split as `tokenizer.ggml.pre` says (llama.cpp's
  `llama_vocab::impl::load` regexes): "gpt-2" (or absent) GPT-2's own split; "llama-bpe" /
  "llama3" / "llama-v3" Llama 3's (digits in runs of at most 3, and a word found whole in the
  vocabulary taken whole: `ignore_merges`); "qwen2" Qwen2's (digits one by one). Checked
  against llama.cpp's tokenizer on GPT-2's vocabulary (tests/test_gguf_read.py).
  llama.cpp puts BOS first where `add_bos_token` says so; glassllm's BPE tokenizer starts a
  context without one.

Anything else -- another model kind or pre-tokenizer, special ids elsewhere than the
tokenizer class has them, no space prefix -- is refused in one line naming the file and key.
"""
from __future__ import annotations

from ..tokenizers import SentencePieceTokenizer
from ..tokenizers.bpe import BPETokenizer
from ..tokenizers.sentencepiece import SP_BOS_ID, SP_EOS_ID, SP_UNK_ID
from . import gguf_names as names

_TOK = "tokenizer.ggml."
# `tokenizer.ggml.pre` -> (split regex, ignore_merges); None: GPT-2's own ByteLevel split
_LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|"
           r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = _LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
PRE_TOKENIZERS = {"gpt-2": None, "llama-bpe": (_LLAMA3, True), "llama3": (_LLAMA3, True),
                  "llama-v3": (_LLAMA3, True), "qwen2": (_QWEN2, False)}


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
    if kind not in ("llama", "gpt2"):
        raise ValueError(f"{f.path}: tokenizer.ggml.model {kind!r} is not supported by "
                         f"glassllm (supported: 'llama' SentencePiece, 'gpt2' byte-level BPE)")
    tokens = f.get(_TOK + "tokens")
    if not isinstance(tokens, list) or not tokens:
        raise ValueError(f"{f.path}: key 'tokenizer.ggml.tokens' is missing or empty")
    tokens = tokens[:_used(f, len(tokens))]
    try:
        return _sentencepiece(f, tokens) if kind == "llama" else _byte_level_bpe(f, tokens)
    except ValueError as e:
        if str(e).startswith(f.path):
            raise
        raise ValueError(f"{f.path}: the {kind!r} vocabulary: {e}") from None

def _used(f, n: int) -> int:
    """Tokens before the trailing UNUSED ones: llama.cpp's converter pads a vocabulary to the
    model's size with "[PAD<i>]" tokens of that type (the model keeps the rows; the
    tokenizer, its own ids)."""
    types = f.get(_TOK + "token_type") or []
    while n > 0 and len(types) >= n and types[n - 1] == names.TOKEN_UNUSED:
        n -= 1
    return n


def _require_id(f, key: str, expected: int) -> None:
    value = f.get(_TOK + key)
    if value is not None and value != expected:
        raise ValueError(f"{f.path}: tokenizer.ggml.{key} = {value}; glassllm's SentencePiece "
                         f"tokenizer has it at {expected}")


def _sentencepiece(f, tokens: list) -> SentencePieceTokenizer:
    scores = f.get(_TOK + "scores")
    scores = scores[:len(tokens)] if isinstance(scores, list) else scores
    if not isinstance(scores, list) or len(scores) != len(tokens):
        raise ValueError(f"{f.path}: key 'tokenizer.ggml.scores' is missing or not one score "
                         f"per token")
    for key, expected in (("bos_token_id", SP_BOS_ID), ("eos_token_id", SP_EOS_ID),
                          ("unknown_token_id", SP_UNK_ID)):
        _require_id(f, key, expected)
    if f.get(_TOK + "add_space_prefix", True) is not True:
        raise ValueError(f"{f.path}: tokenizer.ggml.add_space_prefix is false; glassllm's "
                         f"SentencePiece tokenizer always adds the dummy-prefix space")
    user = sum(kind == names.TOKEN_USER_DEFINED for kind in f.get(_TOK + "token_type", []))
    if user:  # llama.cpp matches these as whole strings before SentencePiece runs
        raise ValueError(f"{f.path}: tokenizer.ggml.token_type marks {user} user-defined "
                         f"token(s), which glassllm's SentencePiece tokenizer does not match")
    return SentencePieceTokenizer([names.sp_piece_from_gguf(t) for t in tokens], scores)


def _byte_level_bpe(f, tokens: list) -> BPETokenizer:
    from tokenizers import AddedToken, Tokenizer, models
    pre = f.get(_TOK + "pre", "gpt-2")
    if pre not in PRE_TOKENIZERS:
        raise ValueError(f"{f.path}: tokenizer.ggml.pre {pre!r} is not supported by glassllm "
                         f"(supported: {sorted(PRE_TOKENIZERS)})")
    merges = f.get(_TOK + "merges", [])
    if not all(isinstance(m, str) and m.count(" ") == 1 for m in merges):
        raise ValueError(f"{f.path}: tokenizer.ggml.merges must be strings 'a b'")
    types = (f.get(_TOK + "token_type") or [names.TOKEN_NORMAL] * len(tokens))[:len(tokens)]
    if len(types) != len(tokens):
        raise ValueError(f"{f.path}: tokenizer.ggml.token_type has {len(types)} entries for "
                         f"{len(tokens)} tokens")
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise ValueError(f"{f.path}: tokenizer.ggml.tokens holds a token twice")
    split, ignore_merges = PRE_TOKENIZERS[pre] or (None, False)
    bpe = models.BPE(vocab=vocab, merges=[tuple(m.split(" ")) for m in merges],
                     ignore_merges=ignore_merges)
    hf = _split_by(BPETokenizer._byte_level(Tokenizer(bpe)), split)
    eot = _eot(f, tokens)
    hf.add_special_tokens([AddedToken(t, special=True) for t, kind in zip(tokens, types)
                           if kind == names.TOKEN_CONTROL or t == eot])
    hf.add_tokens([AddedToken(t, special=False) for t, kind in zip(tokens, types)
                   if kind == names.TOKEN_USER_DEFINED and t != eot])
    return BPETokenizer(hf, eot_token=eot)


def _split_by(hf, split: str | None):
    """The tokenizer splitting text by `split` (a regex; matches kept as pieces) before the
    byte-level mapping; None: as it is (GPT-2's split, inside ByteLevel)."""
    if split is None:
        return hf
    from tokenizers import Regex, pre_tokenizers
    hf.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    return hf


def _eot(f, tokens: list) -> str:
    """The end-of-text token: eos_token_id's, else GPT-2's "<|endoftext|>"."""
    eos = f.get(_TOK + "eos_token_id")
    if eos is None:
        return "<|endoftext|>"
    if isinstance(eos, int) and 0 <= eos < len(tokens):
        return tokens[eos]
    raise ValueError(f"{f.path}: tokenizer.ggml.eos_token_id {eos!r} is not a token id")
