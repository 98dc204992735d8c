"""One call to load a model with its tokenizer, one call to generate text: `glassllm.load`.

    lm = glassllm.load("model.safetensors")            # a glassllm model file
    lm = glassllm.load("gpt2/")                        # a Hugging Face directory
    lm = glassllm.load("stories260K.bin", tokenizer="tok512.bin")   # llama2.c
    lm = glassllm.load("model.gguf")                   # llama.cpp's GGUF (dequantized)
    lm.generate("Once upon a time", max_new_tokens=50, seed=0)   # the continuation, a str
    for piece in lm.stream("Once upon a time", seed=0):         # the same text, piece by piece
        print(piece, end="", flush=True)

The path a transformers user knows (`AutoModelForCausalLM.from_pretrained` + `AutoTokenizer` +
`generate` + `decode`), kept to the files glassllm reads: it never downloads. Generation is
`glassllm generate`'s, to the token: the prompt is encoded as the command encodes it (the
tokenizer's begin-of-sequence id first, where it has one; an empty prompt starts from
`start_id`), the same sampler draws with `np.random.default_rng(seed)`, it stops at the same
ids, and text is released by the same `StreamDecoder`, so `glassllm generate --seed S` prints
the prompt followed by `lm.generate(prompt, seed=S)`.
"""
from __future__ import annotations

import os
import re
from typing import Iterator

import numpy as np

from ..checks import check_int
from ..generate import Generator, Sampling
from ..model import GlassLM
from . import files, hf, llama2c, safetensors_io
from ..tokenizers import ByteTokenizer, StreamDecoder, load_tokenizer, start_id

# `glassllm generate`'s defaults, so that the call and the command give the same text
MAX_NEW_TOKENS = 200
TEMPERATURE = 0.8
# What the Hugging Face Hub calls a model: "gpt2", "openai-community/gpt2" (owner/name)
_HUB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?")
_FILE_SUFFIXES = (".safetensors", ".bin", ".json", ".pt", ".pth", ".gguf", ".txt")


def load(path, tokenizer=None, device: str | None = None) -> "LM":
    """A model and its tokenizer, ready to generate, from local files.

    Args:
        path: a glassllm model file (`glassllm.formats.files`), a Hugging Face GPT-2/Llama
            directory (config.json + model.safetensors, tokenizer files beside them:
            `glassllm.formats.hf`), or a llama2.c checkpoint (a `.bin` file:
            `glassllm.formats.llama2c`, whose tokenizer must be given), or a GGUF file (a
            `.gguf` file: `glassllm.formats.gguf_read`, run on its dequantized weights).
        tokenizer: None (the model's own), a tokenizer object, or a path as `glassllm generate
            --tokenizer` takes it: a tokenizer JSON, a directory with GPT-2's vocab.json +
            merges.txt, a llama2.c `tokenizer.bin` (`.bin`), or "byte".
        device: where the model computes ("cpu", "cuda", "cuda:N", "strict"; None: the
            default, `glassllm.devices`): the file is read on the host, then moved.

    Returns:
        an `LM`.

    Raises:
        FileNotFoundError: no such file; a hub-style name ("gpt2", "owner/name") that is not a
            local path gets a message saying how to download it.
        ValueError: a corrupt or foreign file, no tokenizer (a weights-only file or a llama2.c
            checkpoint without `tokenizer=`), or a tokenizer with more ids than the model.
        TypeError: `tokenizer` neither None, a path nor a tokenizer object.
    """
    model, own = load_model_and_tokenizer(path)
    if device is not None:
        model.to(device)
    if tokenizer is None:
        tokenizer = own
    elif isinstance(tokenizer, (str, os.PathLike)):
        tokenizer = read_tokenizer(tokenizer)
    elif not (hasattr(tokenizer, "encode") and hasattr(tokenizer, "vocab_size")):
        raise TypeError(f"glassllm.load: tokenizer must be None, a path or a glassllm "
                        f"tokenizer, got {type(tokenizer).__name__}")
    where = os.fspath(path)
    if tokenizer is None:
        raise ValueError(f"{where} has no tokenizer (a weights-only model or a llama2.c "
                         f"checkpoint); give one: glassllm.load(path, tokenizer=PATH)")
    if tokenizer.vocab_size > model.cfg.vocab_size:
        raise ValueError(f"{where}: the tokenizer has {tokenizer.vocab_size} ids but the "
                         f"model's vocab_size is {model.cfg.vocab_size}")
    return LM(model, tokenizer)


def load_model_and_tokenizer(path) -> tuple[GlassLM, object]:
    """(GlassLM, tokenizer or None) from a glassllm model file, a Hugging Face directory (one
    holding config.json), a llama2.c checkpoint (a `.bin` file; its tokenizer is None: a
    llama2.c checkpoint holds none) or a GGUF file (`.gguf`: `gguf_read.read_gguf`). The tokenizer is also None for a weights-only file or a
    directory without tokenizer files.

    Raises:
        FileNotFoundError: as `files.load`, or `hub_name_error` for a hub-style name.
        IsADirectoryError / ValueError: as `files.load`, `hf.from_hf`, `llama2c.from_llama2c`.
    """
    where = os.fspath(path)
    if not os.path.lexists(where) and looks_like_hub_name(where):  # a broken link is local
        raise hub_name_error(where)
    if hf.is_hf_dir(where):
        model = hf.from_hf(where)
        return model, hf.tokenizer_from_hf(where, model.cfg.vocab_size)
    if where.endswith(".bin") and os.path.isfile(where):
        return llama2c.from_llama2c(where), None
    if is_gguf(where):
        from . import gguf_read  # the `gguf` package is imported only for GGUF files
        return gguf_read.read_gguf(where)
    return files.load(where), files.load_tokenizer(where)


def is_gguf(path) -> bool:
    """Whether `path` is to be read as GGUF: its name ends in `.gguf`, or it is a file that
    starts with GGUF's magic (Ollama keeps its models as GGUF blobs named by their digest,
    without the suffix)."""
    where = os.fspath(path)
    return where.lower().endswith(".gguf") or safetensors_io.starts_with_gguf_magic(where)


def read_tokenizer(path):
    """A tokenizer from a path as `glassllm generate --tokenizer` takes it: "byte", a llama2.c
    `tokenizer.bin` (a `.bin` file), else `glassllm.tokenizers.load_tokenizer`.

    Raises:
        FileNotFoundError / ValueError: as `load_tokenizer` and `tokenizer_from_llama2c`.
    """
    path = os.fspath(path)
    if path == "byte":
        return ByteTokenizer()
    if path.endswith(".bin") and os.path.isfile(path):
        return llama2c.tokenizer_from_llama2c(path)
    return load_tokenizer(path)


def looks_like_hub_name(text: str) -> bool:
    """True for what reads as a Hugging Face Hub model name ("gpt2", "openai-community/gpt2")
    rather than a path: at most one "/", not starting with "." or "/", no file suffix."""
    return bool(_HUB_NAME.fullmatch(text)) and not text.lower().endswith(_FILE_SUFFIXES)


def hub_name_error(name: str) -> FileNotFoundError:
    """The one-line answer to a hub model name: glassllm reads local files only, and how to
    get them (huggingface_hub's `huggingface-cli download`, or the model's page)."""
    local = name.rsplit("/", 1)[-1]
    return FileNotFoundError(
        f"{name}: no such local file or directory; glassllm reads local files only (it never "
        f"downloads). Get it with `huggingface-cli download {name} --local-dir {local}` "
        f"(or from https://huggingface.co/{name}), then give the directory {local}")


def _random_stream(seed) -> np.random.Generator:
    """`np.random.default_rng(seed)` for seed None or an int >= 0; a Generator as it is.

    Raises:
        ValueError: any other seed (a negative int, a float, a str), naming `seed`.
    """
    if seed is None or isinstance(seed, np.random.Generator):
        return np.random.default_rng(seed)
    return np.random.default_rng(check_int(seed, "seed", low=0))


class LM:
    """A model with its tokenizer: `generate` and `stream` text as `glassllm generate` does.

    Attributes:
        model: the `GlassLM` (float32).
        tokenizer: its tokenizer (byte, GPT-2 BPE or SentencePiece; never None).
    """

    def __init__(self, model: GlassLM, tokenizer):
        self.model = model
        self.tokenizer = tokenizer

    def __repr__(self) -> str:
        cfg = self.model.cfg
        return (f"LM({cfg.family}, d_model={cfg.d_model}, n_layers={cfg.n_layers}, "
                f"vocab_size={cfg.vocab_size}, tokenizer={type(self.tokenizer).__name__})")

    def encode(self, text: str) -> list[int]:
        """The context of a prompt as `glassllm generate` builds it: the tokenizer's
        begin-of-sequence id first where it has one (SentencePiece/Llama), then the text's ids;
        an empty context is [start_id] (BOS, else end-of-text: an unconditional sample).

        Raises:
            ValueError: text not a str, or not valid Unicode (a lone surrogate).
        """
        ids = [int(i) for i in self.tokenizer.encode(text)]
        bos = getattr(self.tokenizer, "bos_id", None)
        if bos is not None:
            ids = [int(bos)] + ids
        return ids or [start_id(self.tokenizer)]

    def generate(self, prompt: str | list[str] = "", max_new_tokens: int = MAX_NEW_TOKENS,
                 temperature: float = TEMPERATURE, top_k: int | None = None,
                 top_p: float | None = None, seed: int | None = None) -> str | list[str]:
        """The continuation of `prompt` (without the prompt), up to `max_new_tokens` tokens or
        the tokenizer's stop token (end-of-text; SentencePiece: EOS or BOS), not included.

        A list of prompts gives a list of texts, drawn one after the other from one random
        stream seeded once (as `glassllm generate --num-samples N` draws its N samples):
        `generate([p] * 3, seed=0)` gives three samples, not one three times.

        Args:
            prompt: text to continue; "" samples unconditionally (from `start_id`).
            max_new_tokens: most tokens to draw (>= 0).
            temperature: as `glassllm.generate.Sampling` (0: greedy).
            top_k: as `glassllm.generate.Sampling` (None: every token).
            top_p: as `glassllm.generate.Sampling` (None: no nucleus cut).
            seed: an int >= 0 for a reproducible text (`np.random.default_rng(seed)`), None for
                a fresh one, or a `np.random.Generator` to go on drawing from (not reseeded).

        Raises:
            ValueError: a bad sampling setting, max_new_tokens or seed, a prompt that is not
                valid Unicode, a model whose logits are not finite.
        """
        rng = _random_stream(seed)
        if isinstance(prompt, (list, tuple)):
            return ["".join(self._pieces(p, max_new_tokens, temperature, top_k, top_p, rng))
                    for p in prompt]
        return "".join(self._pieces(prompt, max_new_tokens, temperature, top_k, top_p, rng))

    def stream(self, prompt: str = "", max_new_tokens: int = MAX_NEW_TOKENS,
               temperature: float = TEMPERATURE, top_k: int | None = None,
               top_p: float | None = None, seed: int | None = None) -> Iterator[str]:
        """`generate`'s text in pieces, each yielded as soon as its token is drawn (a piece can
        be "" while a multi-byte character is incomplete); joined, the pieces equal
        `generate(prompt, ...)` with the same arguments. Arguments and errors as `generate`;
        errors are raised by this call (the first token is drawn before it returns), not in
        the middle of the loop."""
        rng = _random_stream(seed)
        return self._pieces(prompt, max_new_tokens, temperature, top_k, top_p, rng)

    def _pieces(self, prompt, max_new_tokens, temperature, top_k, top_p, rng) -> Iterator[str]:
        max_new_tokens = check_int(max_new_tokens, "max_new_tokens", low=0)
        sampling = Sampling(temperature, top_k, top_p)
        ids = self.encode(prompt)
        # A model whose vocabulary is bigger than its tokenizer's (padded) draws only ids the
        # tokenizer can decode.
        generator = Generator(self.model, ids, vocab_limit=self.tokenizer.vocab_size)
        first = generator.next_token(sampling, rng) if max_new_tokens > 0 else None
        return self._decoded(generator, first, ids[-1], max_new_tokens, sampling, rng)

    def _decoded(self, generator, first, last_prompt_id, max_new_tokens, sampling, rng):
        stop_ids = set(getattr(self.tokenizer, "stop_ids", (self.tokenizer.eot_id,)))
        # holds back bytes of a character not yet complete; knows the token before the first
        decoder = StreamDecoder(self.tokenizer, prev_id=last_prompt_id)
        for i in range(max_new_tokens):
            token = first if i == 0 else generator.next_token(sampling, rng)
            if token in stop_ids:
                break
            yield decoder.push(token)
        rest = decoder.flush()
        if rest:
            yield rest
