"""Training data, by its names of 0.2: one import for the four modules it became.

- `glassllm.training.batches`: the `Batches` protocol, `ArrayBatches`, `data_identity` and
  `check_same_data`;
- `glassllm.formats.token_file`: the token files on disk (`TokenFile`, `TokenWriter`, the
  format's constants) and `token_fingerprint`;
- `glassllm.training.prepare`: `prepare`, text files -> train.bin / val.bin, in named steps
  with an all-or-nothing publish;
- `glassllm.training.corpus`: `load_corpus`, what `glassllm train --data` reads, as a `Corpus`;
- `glassllm.training.text`: UTF-8 text files read in chunks (`list_text_files`).

Each name below is the very object of its module (a monkeypatch of `TokenWriter.append`
through this module acts on the class); a module-level setting (`FINGERPRINT_CHUNK`,
`CHUNK_BYTES`) is read where it lives, so set it there.
"""
from ..formats.token_file import (FINGERPRINT_CHUNK, TOKEN_FILE_FORMAT, TOKEN_FILE_VERSION,
                                  TokenFile, TokenWriter, sidecar_path, token_dtype,
                                  token_fingerprint)
from ..train import get_batch
from .batches import ArrayBatches, Batches, check_same_data, data_identity
from .corpus import (STDLIB_CORPUS_BYTES, VAL_FRACTION, Corpus, is_prepared_dir, load_corpus,
                     stdlib_corpus)
from .prepare import (BPE_MAX_VOCAB, CHUNK_BYTES, PREPARE_OUTPUTS, Progress, bpe_vocab_size,
                      prepare, publish_together)
from .text import NoInputFiles, list_text_files

__all__ = ["ArrayBatches", "BPE_MAX_VOCAB", "Batches", "CHUNK_BYTES", "Corpus",
           "FINGERPRINT_CHUNK", "NoInputFiles", "PREPARE_OUTPUTS", "Progress",
           "STDLIB_CORPUS_BYTES", "TOKEN_FILE_FORMAT", "TOKEN_FILE_VERSION", "TokenFile",
           "TokenWriter", "VAL_FRACTION", "bpe_vocab_size", "check_same_data", "data_identity",
           "get_batch", "is_prepared_dir", "list_text_files", "load_corpus", "prepare",
           "publish_together", "sidecar_path", "stdlib_corpus", "token_dtype",
           "token_fingerprint"]
