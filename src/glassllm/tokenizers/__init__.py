"""Tokenizers: text <-> integer ids, and a streaming decoder for printing as tokens arrive.

Every tokenizer here has the same small surface (`common`'s docstring), so the model file, the
CLI and the generator do not care which one they hold. The modules, each importing only those
listed after it (import-linter's contract "tokenizers" in pyproject.toml: no import circle):

- `load`: `tokenizer_from_json` (a tokenizer from its `to_json()`) and `load_tokenizer` (from
  a file or directory, whatever kind);
- `hf`: every tokenizer below as a Hugging Face `tokenizer.json`, and back (`to_hf` and
  `load_tokenizer` use it);
- `tokenizer_json`: `HFTokenizer`, any other `tokenizer.json` (Qwen's, Gemma's, ...) through
  the `tokenizers` library;
- `byte`: `ByteTokenizer` (one id per byte); `bpe`: `BPETokenizer` (GPT-2's byte-level BPE);
  `sentencepiece`: `SentencePieceTokenizer` (Llama's, as llama2.c stores it, `bos_id` 1);
- `common`: `start_id`, `StreamDecoder` and the checks of text and ids they share.

`start_id(tokenizer)` is the id an unconditional sample starts from: `bos_id`, or `eot_id`
when there is no begin-of-sequence token (GPT-2 and nanoGPT start from <|endoftext|>).

Where the package sits (the layers contract in pyproject.toml): under `formats`, which reads
and writes tokenizers inside model files, token files and Hugging Face or llama2.c checkpoints,
and so under training, lens, serve and the CLI too; above the engine and the glass (it uses
`glassllm.checks`). It writes its tokenizer.json files through `glassllm.formats.atomic`, the
one atomic writer of the package: that module imports nothing from glassllm (its docstring;
import-linter's contract "atomic is a leaf" keeps it so), so this one import from the layer
above makes no cycle, and is the only one the layers contract lets through.

The name: `glassllm.tokenizers` is this package; `tokenizers` (what `import tokenizers` means
in every glassllm module, absolute imports being the only kind, PEP 328) is Hugging Face's
PyPI library, which `bpe`, `tokenizer_json` and `hf` use. tests/test_tokenizer.py checks it.

The import paths of 0.2, `glassllm.formats.tokenizer` (this package),
`glassllm.formats.tokenizer_json` and `glassllm.formats.hf_tokenizer`, still work
(`glassllm._moved`).
"""
from .bpe import EOT_TOKEN, BPETokenizer
from .byte import ByteTokenizer
from .common import StreamDecoder, start_id
from .load import load_tokenizer, tokenizer_from_json
from .sentencepiece import (SP_BOS_ID, SP_BYTE_OFFSET, SP_EOS_ID, SP_NO_MERGE_SCORE, SP_UNK_ID,
                            SentencePieceTokenizer)
from .tokenizer_json import HFTokenizer

__all__ = ["BPETokenizer", "ByteTokenizer", "EOT_TOKEN", "HFTokenizer", "SP_BOS_ID",
           "SP_BYTE_OFFSET", "SP_EOS_ID", "SP_NO_MERGE_SCORE", "SP_UNK_ID",
           "SentencePieceTokenizer", "StreamDecoder", "load_tokenizer", "start_id",
           "tokenizer_from_json"]
