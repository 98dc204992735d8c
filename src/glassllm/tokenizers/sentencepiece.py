"""SentencePiece BPE, as llama2.c stores it (its tokenizer.py export, run.c's encode)."""
from __future__ import annotations

import json

import numpy as np

from ..checks import check_int, is_real
from .common import ids_below

SP_UNK_ID, SP_BOS_ID, SP_EOS_ID = 0, 1, 2  # fixed by llama2.c's run.c and Llama's SentencePiece
SP_BYTE_OFFSET = 3                          # ids 3..258 are the byte pieces <0x00>..<0xFF>
SP_NO_MERGE_SCORE = -1e10                   # run.c's initial best score: never merged at or below


class SentencePieceTokenizer:
    """SentencePiece BPE with byte fallback and a dummy-prefix space: Llama's tokenizer in the
    form llama2.c keeps it (`tokenizer.bin`, read by `glassllm.formats.llama2c.tokenizer_from_llama2c`).

    Vocabulary: `pieces[i]` (a str; a leading " " is SentencePiece's word marker "▁") with
    float32 score `scores[i]`. Ids fixed by the format: 0 <unk>, 1 BOS (`bos_id`), 2 EOS
    (`eot_id`), 3..258 the byte pieces "<0x00>".."<0xFF>"; the rest are characters and merged
    pieces (score = -merge rank, so earlier merges score higher).

    Encoding, exactly llama2.c run.c's `encode(text, bos=0, eos=0)` (and SentencePiece's BPE
    with add_dummy_prefix and byte_fallback; Kudo & Richardson 2018):
      1. a non-empty text gets a " " in front (the dummy prefix);
      2. each character becomes the piece equal to it, or, when there is none, one byte piece
         per UTF-8 byte (byte fallback: id = byte + 3);
      3. of the adjacent pairs whose concatenation is a piece, the one whose piece scores
         highest is merged (the leftmost among equal scores), again and again until no pair
         concatenates to a piece. Pieces scoring <= -1e10 never merge (run.c starts its
         search from that score).
    No BOS or EOS is added: `encode` gives the text's ids only, as `BPETokenizer` does.

    The merging runs in Hugging Face `tokenizers` (a `models.BPE` with byte_fallback, a
    Prepend(" ") normalizer and no pre-tokenizer: the whole text is one word, as in run.c).
    Its merge list holds every split (a, b) of every piece p = a + b, ranked by p's score.
    HF merges the lowest rank first (leftmost among equal ranks), run.c the highest score;
    the two agree because (i) two different pieces never share a score (checked when the
    tokenizer is built: ValueError otherwise, since HF cannot express run.c's "leftmost of
    equal scores" across different pieces), and (ii) the several splits of one piece (" the"
    = " t" + "he" = " th" + "e"), which HF ranks apart, never compete: the symbols covering a
    piece's characters only ever merged among themselves, in the order the rule dictates on
    that string alone, so every occurrence of a piece is reached through the same split.
    The tests compare it with an independent implementation of run.c's loop.

    Decoding, llama2.c run.c's `decode(prev, token)`: a byte piece "<0xXX>" stands for the
    raw byte XX; after BOS -- and at the start of a sequence, where the dummy prefix was --
    a leading space is dropped; BOS and EOS stand for no bytes (run.c prints neither: it
    stops at BOS and never meets EOS in a story). Unlike run.c's `safe_printf`, which skips
    single bytes that are not printable ASCII (so it never prints a character that came out
    as byte pieces), every byte is kept: decode(encode(text)) == text for any text.
    `StreamDecoder` works with it through `piece_bytes(id, prev_id)`.

    Generation: a context starts with BOS (`glassllm generate` puts it before the prompt's
    ids, as run.c's encode(prompt, bos=1) does; an empty prompt is BOS alone) and ends at
    `stop_ids`, EOS or BOS (run.c stops at BOS: the TinyStories models learnt it as the
    separator between stories and never saw EOS).

    Args:
        pieces: the vocabulary, id order; str, or UTF-8 bytes as tokenizer.bin stores them.
        scores: one finite float per piece (stored as float32).
        max_token_length: the longest piece in bytes, as tokenizer.bin's header records it
            (default: computed).

    Raises:
        ValueError: fewer than 259 pieces, ids 3..258 not the byte pieces, a piece that is
            not UTF-8 or appears twice, no " " piece (the dummy prefix), a score that is not
            finite, two mergeable pieces with the same score (see above), max_token_length
            shorter than a piece.
    """

    bos_id = SP_BOS_ID
    eot_id = SP_EOS_ID
    unk_id = SP_UNK_ID
    # Where generation ends: EOS, and BOS -- llama2.c run.c's rule, since models trained as
    # llama2.c trains (BOS before every story, no EOS) end a story by starting the next one.
    stop_ids = (SP_EOS_ID, SP_BOS_ID)

    def __init__(self, pieces, scores, max_token_length: int | None = None):
        self.pieces = [_sp_piece_text(p, i) for i, p in enumerate(pieces)]
        self.scores = np.asarray(scores, dtype=np.float32).reshape(-1)
        self.vocab_size = len(self.pieces)
        if self.scores.size != self.vocab_size:
            raise ValueError(f"SentencePieceTokenizer: {self.vocab_size} pieces but "
                             f"{self.scores.size} scores")
        encoded = [p.encode("utf-8") for p in self.pieces]
        longest = max((len(b) for b in encoded), default=0)
        self.max_token_length = longest if max_token_length is None else int(max_token_length)
        if self.max_token_length < longest:
            raise ValueError(f"SentencePieceTokenizer: max_token_length {self.max_token_length}"
                             f" is shorter than the longest piece ({longest} bytes)")
        self._check_vocabulary()
        self._id_dtype = np.uint16 if self.vocab_size <= 65536 else np.uint32
        # Bytes each id prints: byte pieces are their byte; BOS/EOS print nothing.
        self._bytes = [bytes([i - SP_BYTE_OFFSET]) if SP_BYTE_OFFSET <= i < SP_BYTE_OFFSET + 256
                       else b for i, b in enumerate(encoded)]
        self._bytes[SP_BOS_ID] = self._bytes[SP_EOS_ID] = b""
        # ... and after BOS (or at the start): without the dummy-prefix space.
        self._bytes_after_bos = [b[1:] if b.startswith(b" ") else b for b in self._bytes]
        self._tok = self._hf_tokenizer()

    def __repr__(self) -> str:
        return (f"SentencePieceTokenizer(vocab_size={self.vocab_size}, "
                f"bos_id={self.bos_id}, eot_id={self.eot_id})")

    def _check_vocabulary(self) -> None:
        if self.vocab_size < SP_BYTE_OFFSET + 256:
            raise ValueError(f"SentencePieceTokenizer: {self.vocab_size} pieces; at least 259 "
                             f"are needed (<unk>, BOS, EOS and the 256 byte pieces)")
        for b in range(256):
            piece = self.pieces[SP_BYTE_OFFSET + b]
            if piece != f"<0x{b:02X}>":
                raise ValueError(f"SentencePieceTokenizer: id {SP_BYTE_OFFSET + b} is {piece!r}, "
                                 f"expected the byte piece '<0x{b:02X}>' (byte fallback)")
        if not np.isfinite(self.scores).all():
            i = int(np.flatnonzero(~np.isfinite(self.scores))[0])
            raise ValueError(f"SentencePieceTokenizer: piece {i} ({self.pieces[i]!r}) has "
                             f"score {self.scores[i]}, not a finite number")
        self._ids = {}
        for i, piece in enumerate(self.pieces):
            if self._ids.setdefault(piece, i) != i:
                raise ValueError(f"SentencePieceTokenizer: piece {piece!r} appears twice (ids "
                                 f"{self._ids[piece]} and {i})")
        if " " not in self._ids:
            raise ValueError("SentencePieceTokenizer: no ' ' piece, which the dummy prefix needs")

    def _merges(self) -> list[tuple[str, str]]:
        """Every split (a, b) of every mergeable piece a + b, best score first."""
        ranked, owner = [], {}
        for i, piece in enumerate(self.pieces):
            score = float(self.scores[i])
            if score <= SP_NO_MERGE_SCORE:
                continue
            splits = [(piece[:k], piece[k:]) for k in range(1, len(piece))
                      if piece[:k] in self._ids and piece[k:] in self._ids]
            if not splits:
                continue
            other = owner.setdefault(score, i)
            if other != i:
                raise ValueError(
                    f"SentencePieceTokenizer: pieces {other} ({self.pieces[other]!r}) and {i} "
                    f"({piece!r}) can both be merged and have the same score {score}; "
                    f"llama2.c breaks that tie by position, which a ranked merge list "
                    f"cannot express")
            ranked += [(-score, i, split) for split in splits]
        ranked.sort(key=lambda r: (r[0], r[1]))
        return [split for _, _, split in ranked]

    def _hf_tokenizer(self):
        from tokenizers import Tokenizer, models, normalizers
        bpe = models.BPE(vocab=dict(self._ids), merges=self._merges(), byte_fallback=True,
                         unk_token=self.pieces[SP_UNK_ID], fuse_unk=False)
        tok = Tokenizer(bpe)
        tok.normalizer = normalizers.Prepend(" ")  # the dummy prefix (none for "")
        return tok

    # -- the tokenizer protocol --------------------------------------------------------------

    def encode(self, text: str) -> np.ndarray:
        """str -> 1-D ids (uint16 when vocab_size <= 65536), run.c's encode without BOS/EOS.

        A NUL character is encoded (as the byte piece <0x00>), where run.c, reading a C
        string, would stop.

        Raises:
            ValueError: text not a str, or not valid Unicode (a lone surrogate).
        """
        if not isinstance(text, str):
            raise ValueError(f"SentencePieceTokenizer.encode: expected str, got "
                             f"{type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"SentencePieceTokenizer.encode: text is not valid Unicode: lone "
                             f"surrogate {text[e.start]!r} at character {e.start}") from None
        ids = self._tok.encode(text, add_special_tokens=False).ids
        return np.asarray(ids, dtype=self._id_dtype)

    def piece_bytes(self, token_id: int, prev_id: int | None = None) -> bytes:
        """The bytes `token_id` prints after `prev_id` (run.c's `decode(prev, token)`): its
        piece, a byte piece as its byte, without the leading space after BOS; prev_id None is
        the start of a sequence, treated as after BOS. BOS and EOS give b"".

        Raises:
            ValueError: an id outside [0, vocab_size).
        """
        token_id = int(token_id)
        if not 0 <= token_id < self.vocab_size:
            raise ValueError(f"SentencePieceTokenizer: id {token_id} is outside "
                             f"[0, {self.vocab_size})")
        after_bos = prev_id is None or int(prev_id) == SP_BOS_ID
        return (self._bytes_after_bos if after_bos else self._bytes)[token_id]

    def decode_bytes(self, ids) -> bytes:
        """Ids -> bytes, each id through `piece_bytes` after the one before it (the first as
        at the start of a sequence, so the dummy-prefix space is dropped).

        Raises:
            ValueError: an id outside [0, vocab_size).
        """
        ids = ids_below(ids, self.vocab_size, "SentencePieceTokenizer")
        out, prev = [], SP_BOS_ID
        plain, after_bos = self._bytes, self._bytes_after_bos
        for i in ids.tolist():
            out.append((after_bos if prev == SP_BOS_ID else plain)[i])
            prev = i
        return b"".join(out)

    def decode(self, ids) -> str:
        """Ids -> text; invalid UTF-8 (byte pieces can end mid-character) becomes U+FFFD.

        Raises:
            ValueError: an id outside [0, vocab_size).
        """
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    # -- files -------------------------------------------------------------------------------

    def to_json(self) -> str:
        """{"type": "sentencepiece", "max_token_length", "pieces", "scores"} (scores are the
        float32 values, exactly)."""
        return json.dumps({"type": "sentencepiece", "max_token_length": self.max_token_length,
                           "pieces": self.pieces,
                           "scores": [float(s) for s in self.scores]}, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> "SentencePieceTokenizer":
        """Rebuild from `to_json()`.

        Raises:
            ValueError: not JSON, or not a valid description (see the constructor).
        """
        try:
            spec = json.loads(text)
            pieces, scores = spec["pieces"], spec["scores"]
            max_len = spec.get("max_token_length")
        except (json.JSONDecodeError, TypeError, KeyError) as e:
            raise ValueError(f"SentencePiece tokenizer JSON is not valid: {e!r}") from None
        if not (isinstance(pieces, list) and all(isinstance(p, str) for p in pieces)
                and isinstance(scores, list) and all(is_real(s) for s in scores)):
            raise ValueError("SentencePiece tokenizer JSON: pieces must be strings, scores "
                             "numbers")
        if max_len is not None:
            max_len = check_int(max_len, "SentencePiece tokenizer JSON: max_token_length",
                                low=0)
        return cls(pieces, scores, max_len)


def _sp_piece_text(piece, i: int) -> str:
    if isinstance(piece, str):
        return piece
    try:
        return bytes(piece).decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"SentencePieceTokenizer: piece {i} ({bytes(piece)!r}) is not UTF-8 "
                         f"text") from None
