"""Every glassllm tokenizer as a Hugging Face `tokenizer.json`, and back.

`to_hf` writes these files so that `transformers.AutoTokenizer.from_pretrained(dir)` gives the
ids glassllm gives; each is built with the `tokenizers` library (its `Tokenizer.to_str()` is
the file), never written by hand:

- `BPETokenizer` (GPT-2's byte-level BPE): its own `tokenizers.Tokenizer`, as it is.
- `ByteTokenizer`: a byte-level BPE with no merges: ids 0..255 are the bytes (as GPT-2's
  printable characters, `pre_tokenizers.ByteLevel` without its regex split), 256 the special
  "<|endoftext|>", so every byte is its own token, exactly as ByteTokenizer encodes.
- `HFTokenizer` (a tokenizer.json glassllm read: Qwen's, Gemma's, ...): its own
  `tokenizers.Tokenizer`, written back as it was read.
- `SentencePieceTokenizer` (Llama's, from llama2.c): its `models.BPE` with byte fallback and
  the Prepend(" ") normalizer (see its docstring), plus what transformers' Llama converter adds
  (transformers src/transformers/convert_slow_tokenizer.py, `LlamaConverter`): <unk>, BOS and
  EOS as special tokens, a post-processor that puts BOS first (the context `glassllm
  generate` builds), and a decoder from byte pieces back to text without the dummy-prefix
  space.

`tokenizer_config.json` names the generic fast tokenizer class and the special tokens, so
AutoTokenizer does not pick a model-specific class that would rebuild the pipeline, and sets
`split_special_tokens`: a special token's text inside a prompt ("<|endoftext|>", "<unk>") is
encoded as text, as glassllm's tokenizers encode it, never as the special id.

Reading back (`from_hf_json`, used by `load_tokenizer`): a file of the byte layout above is the
`ByteTokenizer`; one with byte fallback and the byte pieces at ids 3..258 a
`SentencePieceTokenizer`, whose scores are recovered from the merge order (the k-th piece the
merges make scores -k: the same encoding; run.c's scores of a llama2.c export are exactly
these); anything else is for `BPETokenizer.from_json`.
"""
from __future__ import annotations

import json

from .bpe import EOT_TOKEN, BPETokenizer, bytes_to_unicode
from .byte import ByteTokenizer
from .sentencepiece import (SP_BOS_ID, SP_BYTE_OFFSET, SP_EOS_ID, SP_NO_MERGE_SCORE, SP_UNK_ID,
                            SentencePieceTokenizer)
from .tokenizer_json import HFTokenizer

TOKENIZER_CLASS = "PreTrainedTokenizerFast"  # transformers' generic tokenizers-backed class


def writable(tokenizer) -> bool:
    """Whether `to_hf_tokenizer` knows this tokenizer's kind."""
    return isinstance(tokenizer, (ByteTokenizer, BPETokenizer, SentencePieceTokenizer,
                                  HFTokenizer))


def to_hf_tokenizer(tokenizer):
    """A `tokenizers.Tokenizer` that encodes text to the ids `tokenizer.encode` gives (plus BOS
    first for SentencePiece, with add_special_tokens, as Llama's).

    Raises:
        TypeError: a tokenizer of another kind.
    """
    from tokenizers import Tokenizer

    if isinstance(tokenizer, HFTokenizer):  # read from a tokenizer.json: written back as it was
        return Tokenizer.from_str(tokenizer._tok.to_str())
    if isinstance(tokenizer, ByteTokenizer):
        return _byte_tokenizer()
    if isinstance(tokenizer, BPETokenizer):
        return Tokenizer.from_str(json.dumps(json.loads(tokenizer.to_json())["tokenizer"]))
    if isinstance(tokenizer, SentencePieceTokenizer):
        return _sentencepiece_tokenizer(tokenizer)
    raise TypeError(f"no Hugging Face form for a {type(tokenizer).__name__}")


def tokenizer_config(tokenizer, max_len: int) -> dict:
    """The `tokenizer_config.json` that goes with `to_hf_tokenizer(tokenizer)`."""
    # split_special_tokens: "<|endoftext|>" or "<s>" typed in a text are that text's bytes, as
    # glassllm encodes them, not the special id (transformers' default matches them in text)
    config = {"tokenizer_class": TOKENIZER_CLASS, "model_max_length": int(max_len),
              "clean_up_tokenization_spaces": False, "split_special_tokens": True}
    if isinstance(tokenizer, HFTokenizer):
        named = {"eos_token": tokenizer.eot_id, "bos_token": tokenizer.bos_id}
        return {**config, **{k: tokenizer.id_to_token(i) for k, i in named.items()
                             if i is not None}}
    if isinstance(tokenizer, SentencePieceTokenizer):
        pieces = tokenizer.pieces
        return {**config, "bos_token": pieces[SP_BOS_ID], "eos_token": pieces[SP_EOS_ID],
                "unk_token": pieces[SP_UNK_ID], "add_bos_token": True}
    eot = getattr(tokenizer, "eot_token", EOT_TOKEN)
    return {**config, "bos_token": eot, "eos_token": eot}  # GPT-2's: bos = eos = end-of-text


def _byte_tokenizer():
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    table = bytes_to_unicode()
    tok = Tokenizer(models.BPE(vocab={table[b]: b for b in range(256)}, merges=[]))
    # no regex split: the words do not matter when nothing merges
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(EOT_TOKEN, special=True)])  # id 256
    return tok


def _sentencepiece_tokenizer(sp: SentencePieceTokenizer):
    from tokenizers import AddedToken, Tokenizer, decoders, processors
    tok = Tokenizer.from_str(sp._tok.to_str())  # a copy: the tokenizer's own stays as it is
    specials = [sp.pieces[i] for i in (SP_UNK_ID, SP_BOS_ID, SP_EOS_ID)]
    tok.add_special_tokens([AddedToken(p, special=True, normalized=False) for p in specials])
    bos = sp.pieces[SP_BOS_ID]
    tok.post_processor = processors.TemplateProcessing(
        single=[bos, "$A"], pair=[bos, "$A", bos, "$B"], special_tokens=[(bos, SP_BOS_ID)])
    # pieces hold " " (llama2.c's form of SentencePiece's "▁"): no Replace step is needed
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    return tok


def from_hf_json(text: str):
    """The glassllm tokenizer a `tokenizer.json` of one of the layouts `to_hf_tokenizer` writes
    stands for (ByteTokenizer or SentencePieceTokenizer), or None for any other file (a
    byte-level BPE: `BPETokenizer.from_json`).

    Raises:
        ValueError: a SentencePiece layout whose vocabulary SentencePieceTokenizer refuses.
    """
    try:
        spec = json.loads(text)
        model = spec["model"]
        vocab, merges = model["vocab"], model.get("merges") or []
    except (ValueError, TypeError, KeyError):
        return None
    if not isinstance(vocab, dict) or not isinstance(merges, list) or model.get("type") != "BPE":
        return None
    by_id = sorted(vocab, key=vocab.get)
    if not merges and _is_byte_layout(spec, by_id):
        return ByteTokenizer()
    if model.get("byte_fallback") and len(by_id) > SP_BYTE_OFFSET + 255 and \
            by_id[SP_BYTE_OFFSET] == "<0x00>":
        return SentencePieceTokenizer(by_id, _scores_from_merges(by_id, merges))
    return None


def _is_byte_layout(spec: dict, by_id: list[str]) -> bool:
    table = bytes_to_unicode()
    added = [(t.get("id"), t.get("content")) for t in spec.get("added_tokens") or []]
    return by_id == [table[b] for b in range(256)] and added == [(256, EOT_TOKEN)]


def _scores_from_merges(pieces: list[str], merges: list) -> list[float]:
    """Scores under which run.c's merge rule makes the merges in this order: the k-th distinct
    piece made scores -k; a piece that could be made but never is scores SP_NO_MERGE_SCORE
    (never merged); pieces no merge makes (characters, bytes, specials) 0."""
    score: dict[str, float] = {}
    for pair in merges:  # ["a", "b"] (tokenizers >= 0.20) or "a b" (older files)
        a, b = pair if isinstance(pair, list) else pair.split(" ", 1)
        score.setdefault(a + b, -float(len(score)))
    known = set(pieces)
    out = []
    for piece in pieces:
        if piece in score:
            out.append(score[piece])
        elif any(piece[:k] in known and piece[k:] in known for k in range(1, len(piece))):
            out.append(SP_NO_MERGE_SCORE)
        else:
            out.append(0.0)
    return out
