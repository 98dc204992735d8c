"""Tokenizers: text <-> integer ids, and a streaming decoder for printing as tokens arrive.

Every tokenizer here has the same small surface, so the model file, the CLI and the generator
do not care which one they hold:

    vocab_size: int                     number of ids
    eot_id: int                         the end-of-text id
    bos_id: int | None                  the begin-of-sequence id (SentencePiece/Llama: 1), or
                                        None when the tokenizer has none (GPT-2, byte)
    encode(text: str) -> np.ndarray     1-D ids (uint16 when vocab_size <= 65536, else uint32);
                                        ValueError for text that is not valid Unicode
    decode(ids) -> str                  never raises; invalid UTF-8 becomes U+FFFD
    decode_bytes(ids) -> bytes          the raw bytes the ids stand for
    to_json() -> str                    enough to rebuild it with `tokenizer_from_json`
    stop_ids (optional)                 the ids that end a generation; default (eot_id,)

Three kinds: `ByteTokenizer` (one id per byte), `BPETokenizer` (GPT-2's byte-level BPE) and
`SentencePieceTokenizer` (Llama's SentencePiece BPE as llama2.c stores it, with `bos_id` 1:
its contexts start with BOS).

`start_id(tokenizer)` is the id an unconditional sample starts from: `bos_id`, or `eot_id`
when there is no begin-of-sequence token (GPT-2 and nanoGPT start from <|endoftext|>).
"""
from __future__ import annotations

import codecs
import json
import os

import numpy as np

from .atomic import atomic_write
from ..checks import check_int, is_real


class ByteTokenizer:
    """One id per UTF-8 byte (0-255) plus end-of-text (256): vocab_size 257.

    No training, no unknown tokens, any text round-trips. The price is length: a token per
    byte, so a model spends context spelling words (the reason GPT-2 uses byte-level BPE
    instead: Radford et al. 2019, "Language Models are Unsupervised Multitask Learners",
    section 2.2).
    """

    vocab_size = 257
    eot_id = 256
    bos_id = None  # no begin-of-sequence token: unconditional samples start from eot_id

    def encode(self, text: str) -> np.ndarray:
        """str -> uint16 ids of its UTF-8 bytes (no end-of-text added).

        Raises:
            ValueError: text is not a str, or is not valid Unicode (a lone surrogate such as
                "\\udcff", which is what `errors="surrogateescape"` makes of undecodable
                bytes: it has no UTF-8 encoding). The message gives its position.
        """
        _check_text(text, "ByteTokenizer.encode")
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise _not_unicode("ByteTokenizer.encode", text, e) from None
        return np.frombuffer(data, dtype=np.uint8).astype(np.uint16)

    def decode_bytes(self, ids) -> bytes:
        """Ids -> bytes; the end-of-text id contributes nothing.

        Raises:
            ValueError: an id outside [0, 257).
        """
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise ValueError(f"ByteTokenizer: ids must be in [0, {self.vocab_size}), got "
                             f"range [{ids.min()}, {ids.max()}]")
        return ids[ids != self.eot_id].astype(np.uint8).tobytes()

    def decode(self, ids) -> str:
        """Ids -> text. Never raises for ids in range: bytes that are not valid UTF-8 (a model
        can emit any byte sequence) become U+FFFD."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def to_json(self) -> str:
        return json.dumps({"type": "byte"})


def start_id(tokenizer) -> int:
    """The id an unconditional sample starts from (an empty prompt): the tokenizer's
    begin-of-sequence id (`bos_id`; SentencePiece/Llama: BOS, as llama2.c starts), or its
    end-of-text id when it has none (`bos_id` None: GPT-2 and the byte tokenizer, as nanoGPT's
    and transformers' GPT-2 `generate` start from <|endoftext|>). Tokenizers without a
    `bos_id` attribute count as having none."""
    bos = getattr(tokenizer, "bos_id", None)
    return int(tokenizer.eot_id if bos is None else bos)


def _check_text(text, who: str) -> None:
    if not isinstance(text, str):
        raise ValueError(f"{who}: expected str, got {type(text).__name__}")


def _not_unicode(who: str, text: str, e: UnicodeEncodeError | None = None) -> ValueError:
    """The ValueError for a str that has no UTF-8 encoding (a lone surrogate)."""
    if e is None:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as found:
            e = found
    where = f" {text[e.start]!r} at character {e.start}" if e is not None else ""
    return ValueError(f"{who}: text is not valid Unicode: lone surrogate{where} (undecodable "
                      f"bytes read with errors='surrogateescape'?); decode the input as UTF-8, "
                      f"e.g. with errors='replace'")


class StreamDecoder:
    """Turns ids into text one at a time, releasing only complete UTF-8 characters.

    A multi-byte character can be split across tokens (always, with ByteTokenizer); printing
    each token's bytes at once would show broken characters. `push(id)` returns the text
    completed so far (possibly ""), `flush()` the rest. ''.join of all chunks followed by
    flush() equals `tok.decode(all ids)`, because both use the same UTF-8 decoder with
    errors="replace", one incrementally.

    Some tokenizers print a token differently after some others: SentencePiece drops the
    leading space of the piece after BOS (`SentencePieceTokenizer.piece_bytes`). For those the
    decoder remembers the previous id; `prev_id` is the id before the first pushed one (the
    last prompt token, or BOS for an unconditional sample), None for the start of a sequence.
    """

    def __init__(self, tokenizer, prev_id: int | None = None):
        self.tokenizer = tokenizer
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._piece_bytes = getattr(tokenizer, "piece_bytes", None)
        self._prev = None if prev_id is None else int(prev_id)

    def push(self, token_id: int) -> str:
        token_id = int(token_id)
        if self._piece_bytes is not None:
            data = self._piece_bytes(token_id, self._prev)
        else:
            data = self.tokenizer.decode_bytes([token_id])
        self._prev = token_id
        return self._utf8.decode(data)

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


def tokenizer_from_json(text: str):
    """Rebuild a tokenizer from its `to_json()` string.

    Raises:
        ValueError: not JSON, or an unknown tokenizer type.
    """
    try:
        spec = json.loads(text)
        kind = spec["type"]
    except (json.JSONDecodeError, TypeError, KeyError) as e:
        raise ValueError(f"tokenizer description is not valid: {e}") from None
    if kind == "byte":
        return ByteTokenizer()
    if kind == "bpe":
        return BPETokenizer.from_json(text)  # noqa: F821 -- defined below by the BPE section
    if kind == "sentencepiece":
        return SentencePieceTokenizer.from_json(text)  # noqa: F821 -- defined below
    if kind == "hf":  # any other tokenizer.json (Gemma's SentencePiece-style BPE, ...)
        from .tokenizer_json import HFTokenizer
        return HFTokenizer.from_json(text)
    raise ValueError(f"unknown tokenizer type {kind!r}")


# --- Byte-level BPE, GPT-2's (openai/gpt-2 src/encoder.py) -------------------------------------

EOT_TOKEN = "<|endoftext|>"


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table from the 256 byte values to 256 printable characters.

    Byte-level BPE works on text where each byte is replaced by one visible character, so
    merges never see control bytes or spaces: printable Latin-1 bytes stand for themselves and
    the other 68 bytes map to U+0100.. in order. Source: openai/gpt-2 src/encoder.py
    `bytes_to_unicode` (the same table HF `tokenizers` ByteLevel uses).
    """
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


_UNICODE_TO_BYTE = {c: b for b, c in _bytes_to_unicode().items()}


class BPETokenizer:
    """Byte-level BPE (GPT-2 style) on top of Hugging Face `tokenizers`.

    Text is split by GPT-2's regex pre-tokenizer, each piece's UTF-8 bytes are mapped to
    printable characters (`_bytes_to_unicode`) and merged by the learned merge list (Sennrich
    et al. 2016, "Neural Machine Translation of Rare Words with Subword Units"; byte-level
    variant: Radford et al. 2019, GPT-2). Any text encodes, no unknown tokens.

    `eot_id` is the id of the special token "<|endoftext|>". `encode(text)` treats that string
    in text as ordinary characters (like tiktoken's `encode_ordinary`, and like ByteTokenizer)
    unless `allowed_special="all"`. `decode_bytes` drops special tokens (end-of-text stands for
    no bytes, as in ByteTokenizer).

    `bos_id` is None: GPT-2's byte-level BPE has no begin-of-sequence token, so an
    unconditional sample starts from `eot_id` (see `start_id`).

    Build one with `BPETokenizer.train(...)`, `from_gpt2_files(vocab.json, merges.txt)`,
    `load(path)` or `from_json(text)`.
    """

    bos_id = None

    def __init__(self, hf_tokenizer, eot_token: str = EOT_TOKEN):
        """Wrap a `tokenizers.Tokenizer` whose model is byte-level BPE.

        Raises:
            ValueError: not a BPE model, the end-of-text token missing, or a vocabulary entry
                that is not made of byte-level characters (so its bytes would be unknown).
        """
        from tokenizers import models
        self._tok = hf_tokenizer
        self._json = None
        if not isinstance(hf_tokenizer.model, models.BPE):
            raise ValueError(f"BPETokenizer: expected a BPE model, got "
                             f"{type(hf_tokenizer.model).__name__}")
        eot = hf_tokenizer.token_to_id(eot_token)
        if eot is None:
            raise ValueError(f"BPETokenizer: the vocabulary has no {eot_token!r} token")
        self.eot_token = eot_token
        self.eot_id = int(eot)
        self.vocab_size = int(hf_tokenizer.get_vocab_size(with_added_tokens=True))
        self._id_dtype = np.uint16 if self.vocab_size <= 65536 else np.uint32
        # Table id -> raw bytes, built once: decode_bytes is then a join, and StreamDecoder
        # can push one id at a time without going through the Rust decoder.
        special = {t.content for t in hf_tokenizer.get_added_tokens_decoder().values()
                   if t.special}
        self._id_bytes: list[bytes] = [b""] * self.vocab_size
        for token, i in hf_tokenizer.get_vocab(with_added_tokens=True).items():
            if token in special:
                continue  # special tokens stand for no bytes
            try:
                self._id_bytes[i] = bytes(_UNICODE_TO_BYTE[c] for c in token)
            except KeyError:
                raise ValueError(f"BPETokenizer: token {token!r} (id {i}) is not byte-level; "
                                 "only byte-level BPE tokenizers are supported") from None

    # -- building ----------------------------------------------------------------------------

    @staticmethod
    def _byte_level(hf_tokenizer):
        from tokenizers import decoders, pre_tokenizers
        hf_tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        hf_tokenizer.decoder = decoders.ByteLevel()
        return hf_tokenizer

    @classmethod
    def train(cls, texts, vocab_size: int, min_frequency: int = 2) -> "BPETokenizer":
        """Learn a byte-level BPE of `vocab_size` ids from text.

        Args:
            texts: one str (the whole text), an iterable of str (text chunks of a corpus,
                streamed; split them at newlines so no word is cut), or a list of
                pathlib.Path files (read as UTF-8 by `tokenizers`). A plain str is always
                text, never a file name, and never iterated character by character.
            vocab_size: total ids, >= 257: id 0 is "<|endoftext|>", ids 1..256 the 256 bytes,
                the rest merges (fewer if the corpus runs out of pairs seen `min_frequency`
                times).

        Raises:
            ValueError: vocab_size < 257. FileNotFoundError: a Path that is not a file.
        """
        from tokenizers import Tokenizer, models, pre_tokenizers, trainers
        if vocab_size < 257:
            raise ValueError(f"BPETokenizer.train: vocab_size must be >= 257 (256 bytes + "
                             f"end-of-text), got {vocab_size}")
        tok = cls._byte_level(Tokenizer(models.BPE()))
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                      special_tokens=[EOT_TOKEN], show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        if isinstance(texts, str):  # one text; iterating it would give single characters
            texts = [texts]
        if isinstance(texts, (list, tuple)) and texts and all(
                isinstance(t, os.PathLike) for t in texts):
            for t in texts:
                if not os.path.isfile(t):
                    raise FileNotFoundError(f"BPETokenizer.train: no such file {t}")
            tok.train([os.fspath(t) for t in texts], trainer)
        else:
            tok.train_from_iterator(texts, trainer)
        return cls(tok)

    @classmethod
    def from_gpt2_files(cls, vocab_json, merges_txt) -> "BPETokenizer":
        """GPT-2's tokenizer from its `vocab.json` (token -> id) and `merges.txt`; ids equal
        GPT-2's (OpenAI's `encoder.json`/`vocab.bpe` are the same files). vocab_size 50257,
        eot_id 50256.

        Raises:
            FileNotFoundError: a file is missing.
            ValueError: the files cannot be parsed as a BPE vocabulary and merge list.
        """
        from tokenizers import Tokenizer, models
        for path in (vocab_json, merges_txt):
            if not os.path.isfile(path):
                raise FileNotFoundError(f"GPT-2 tokenizer file not found: {path}")
        try:
            model = models.BPE.from_file(os.fspath(vocab_json), os.fspath(merges_txt))
        except Exception as e:  # tokenizers raises plain Exception for a bad file
            if type(e) is not Exception:  # MemoryError, OSError...: not about the content
                raise
            raise ValueError(f"cannot read GPT-2 tokenizer files {vocab_json}, {merges_txt}: "
                             f"{e}") from None
        tok = cls._byte_level(Tokenizer(model))
        tok.add_special_tokens([EOT_TOKEN])
        return cls(tok)

    # -- the tokenizer protocol --------------------------------------------------------------

    def encode(self, text: str, allowed_special: str = "none") -> np.ndarray:
        """str -> 1-D ids (uint16 when vocab_size <= 65536, else uint32); no end-of-text added.

        allowed_special: "none" encodes "<|endoftext|>" in text as ordinary characters;
            "all" turns it into `eot_id`.

        Raises:
            ValueError: allowed_special not "none" or "all"; text not a str, or not valid
                Unicode (a lone surrogate such as "\\udcff", as ByteTokenizer.encode).
        """
        if allowed_special not in ("none", "all"):
            raise ValueError(f"allowed_special must be 'none' or 'all', got {allowed_special!r}")
        _check_text(text, "BPETokenizer.encode")
        self._tok.encode_special_tokens = allowed_special == "none"
        try:
            ids = self._tok.encode(text, add_special_tokens=False).ids
        except TypeError:  # the Rust side cannot take a str with lone surrogates
            raise _not_unicode("BPETokenizer.encode", text) from None
        return np.asarray(ids, dtype=self._id_dtype)

    def decode_bytes(self, ids) -> bytes:
        """Ids -> the exact bytes they stand for (special tokens give none).

        Raises:
            ValueError: an id outside [0, vocab_size).
        """
        ids = _ids_below(ids, self.vocab_size, "BPETokenizer")
        table = self._id_bytes
        return b"".join([table[i] for i in ids.tolist()])

    def decode(self, ids) -> str:
        """Ids -> text; invalid UTF-8 (tokens can end mid-character) becomes U+FFFD.

        Raises:
            ValueError: an id outside [0, vocab_size).
        """
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary string of an id (byte-level characters, e.g. 'Ġthe'), or None."""
        return self._tok.id_to_token(int(token_id))

    # -- files -------------------------------------------------------------------------------

    def to_json(self) -> str:
        """{"type": "bpe", "eot_token": ..., "tokenizer": <the HF tokenizer.json object>}."""
        if self._json is None:  # cached: the tokenizer never changes, GPT-2's is 1.7 MB
            self._json = json.dumps({"type": "bpe", "eot_token": self.eot_token,
                                     "tokenizer": json.loads(self._tok.to_str())},
                                    ensure_ascii=False)
        return self._json

    @classmethod
    def from_json(cls, text: str) -> "BPETokenizer":
        """Rebuild from `to_json()`; also accepts a plain HF `tokenizer.json` of a byte-level
        BPE with an "<|endoftext|>" token.

        Raises:
            ValueError: not JSON, or not a byte-level BPE description.
        """
        from tokenizers import Tokenizer
        try:
            spec = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"BPE tokenizer JSON is not valid: {e}") from None
        if not isinstance(spec, dict):
            raise ValueError("BPE tokenizer JSON must be an object")
        inner, eot_token = spec, EOT_TOKEN
        if spec.get("type") == "bpe":
            inner, eot_token = spec.get("tokenizer"), spec.get("eot_token", EOT_TOKEN)
        if not isinstance(inner, dict) or "model" not in inner:
            raise ValueError("BPE tokenizer JSON has no tokenizer model")
        try:
            tok = Tokenizer.from_str(json.dumps(inner))
        except Exception as e:  # tokenizers raises plain Exception for a bad description
            if type(e) is not Exception:  # MemoryError...: not about the content
                raise
            raise ValueError(f"BPE tokenizer JSON cannot be loaded: {e}") from None
        return cls(tok, eot_token)

    def save(self, path) -> None:
        """Write `to_json()` to `path` atomically (temp file + os.replace)."""
        text = self.to_json()
        with atomic_write(path, "w") as f:
            f.write(text)

    @classmethod
    def load(cls, path) -> "BPETokenizer":
        """Read a file written by `save` (or a HF tokenizer.json).

        Raises:
            FileNotFoundError: no such file. ValueError: see `from_json`.
        """
        with open(path, encoding="utf-8") as f:
            return cls.from_json(f.read())


def load_tokenizer(path):
    """A tokenizer from disk: a JSON file written by any tokenizer's `to_json()` / `save`
    (byte or bpe), a HF `tokenizer.json` (a byte-level BPE, or the byte or SentencePiece
    layouts `glassllm.formats.hf.to_hf` writes: `glassllm.formats.hf_tokenizer`), or a
    directory holding GPT-2's `vocab.json` + `merges.txt` (or a `tokenizer.json`).

    Raises:
        FileNotFoundError: path missing, or a directory without those files.
        ValueError: the file is not a tokenizer description.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        vocab, merges = os.path.join(path, "vocab.json"), os.path.join(path, "merges.txt")
        if os.path.isfile(vocab) and os.path.isfile(merges):
            return BPETokenizer.from_gpt2_files(vocab, merges)
        if os.path.isfile(os.path.join(path, "tokenizer.json")):
            return load_tokenizer(os.path.join(path, "tokenizer.json"))
        raise FileNotFoundError(f"{path}: no vocab.json + merges.txt or tokenizer.json in it")
    if not os.path.exists(path):
        raise FileNotFoundError(f"no such tokenizer file or directory: {path}")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a tokenizer JSON file (not UTF-8 text)") from None
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not a tokenizer JSON file: {e}") from None
    if isinstance(spec, dict) and "type" in spec:
        return tokenizer_from_json(text)
    from .hf_tokenizer import from_hf_json  # the byte and SentencePiece layouts `to_hf` writes
    try:
        return from_hf_json(text) or BPETokenizer.from_json(text)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


# --- SentencePiece BPE, as llama2.c stores it (its tokenizer.py export, run.c's encode) --------

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
        ids = _ids_below(ids, self.vocab_size, "SentencePieceTokenizer")
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


def _ids_below(ids, vocab_size: int, who: str) -> np.ndarray:
    """ids as a flat int64 array, checked to lie in [0, vocab_size).

    Raises:
        ValueError: "<who>: ids must be in [0, V), got range [lo, hi]".
    """
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(f"{who}: ids must be in [0, {vocab_size}), got range "
                         f"[{ids.min()}, {ids.max()}]")
    return ids
