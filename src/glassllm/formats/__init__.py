"""The formats: everything glassllm reads from and writes to disk (the tokenizers, which these
files hold, are their own package below: `glassllm.tokenizers`).

- `lm`: `glassllm.load`: a model and its tokenizer from any of the sources below, with
  `generate` / `stream` of text as `glassllm generate` gives it;
- `files`: a model file (safetensors + config + tokenizer), float16 export;
- `checkpoint`: a training run's resumable state;
- `token_file`: the token files `glassllm prepare` writes and training reads (TokenFile,
  TokenWriter), and the fingerprint of a token stream;
- `hf`: Hugging Face checkpoints in and out (their tokenizer.json: `glassllm.tokenizers.hf`);
  `llama2c`: llama2.c checkpoints and tokenizers;
- `gguf_read`: llama.cpp's GGUF files in (dequantized to float32), with `gguf_names` (GGUF
  names and layouts <-> glassllm's), `gguf_quants` (the dequantizers as glass), `gguf_vocab`
  (their tokenizers) and `gguf_compare` (what quantization did);
- `safetensors_io`: the one safetensors reader (and signed writer) under files and checkpoints;
- `integrity`: SHA-256 digests of tensors and metadata; `atomic`: files written atomically;
- `paths`: output paths checked before a long computation writes them;
- `inline_json`: JSON inlined in an HTML page (the report's and the server's), escaped.
"""
