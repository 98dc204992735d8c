"""`glassllm convert`: import and export Hugging Face and llama2.c checkpoints."""
from __future__ import annotations

import json
import os
import sys

from .common import UsageError, one_line

CONVERT_USAGE = ("give either --from-hf DIR --out FILE [--tokenizer PATH] [--max-len T], "
                 "--from-llama2c CKPT.bin [--tokenizer TOK.bin] --out FILE [--max-len T], "
                 "--model FILE --to-hf DIR [--force] [--max-shard-size SIZE], --model FILE "
                 "--to-llama2c OUT.bin, --model FILE --to-gguf OUT.gguf "
                 "[--type f32|f16|q8_0|q4_0], or --from-gguf FILE.gguf --out FILE")


def add_convert(sub) -> None:
    p = sub.add_parser(
        "convert", help="import/export Hugging Face and llama2.c checkpoints",
        description="--from-hf DIR --out FILE: a transformers checkpoint directory (config.json "
                    "+ model.safetensors or shards, any class docs/architectures.md lists: "
                    "GPT-2, Llama, Mistral, Qwen2/3, GPT-NeoX, GPT-Neo, Phi, Gemma 1/2/3, "
                    "OLMo-2) to a glassllm "
                    "model file, with the directory's tokenizer. --model FILE --to-hf DIR: the "
                    "reverse; transformers' from_pretrained(DIR) then gives the same logits. "
                    "--from-llama2c CKPT.bin --out FILE: a llama2.c checkpoint (legacy "
                    "version 0, float32) to a glassllm model file, with llama2.c's "
                    "tokenizer.bin given by --tokenizer. --model FILE --to-llama2c OUT.bin: "
                    "the reverse, a file llama2.c's run.c runs. --from-gguf FILE.gguf --out "
                    "FILE: a llama.cpp GGUF file (float or quantized tensors, dequantized to "
                    "float32) to a glassllm model file, with its tokenizer. --model FILE "
                    "--to-gguf OUT.gguf [--type T]: the reverse, a GGUF file llama.cpp runs "
                    "(with the tokenizer).")
    p.add_argument("--from-hf", metavar="DIR", help="Hugging Face checkpoint directory to read")
    p.add_argument("--from-llama2c", metavar="CKPT.bin",
                   help="llama2.c checkpoint to read (legacy version 0, e.g. stories260K.bin)")
    p.add_argument("--from-gguf", metavar="FILE.gguf",
                   help="GGUF file to read (llama.cpp's format; docs/files-and-formats.md)")
    p.add_argument("--out", metavar="FILE",
                   help="glassllm model file to write (with --from-hf / --from-llama2c / "
                        "--from-gguf)")
    p.add_argument("--model", metavar="FILE",
                   help="glassllm model file, or GGUF file, to read (with --to-hf / --to-llama2c "
                        "/ --to-gguf)")
    p.add_argument("--to-hf", metavar="DIR", help="Hugging Face directory to write (with --model)")
    p.add_argument("--to-llama2c", metavar="OUT.bin",
                   help="llama2.c checkpoint (version 0) to write (with --model)")
    p.add_argument("--to-gguf", metavar="OUT.gguf",
                   help="GGUF file llama.cpp runs, to write (with --model; docs/gguf.md)")
    p.add_argument("--type", choices=("f32", "f16", "q8_0", "q4_0"),
                   help="with --to-gguf: the matrices' type (default f32; norms, biases and "
                        "position tables stay f32)")
    p.add_argument("--tokenizer", metavar="PATH",
                   help="with --from-hf: tokenizer to store when DIR has none (tokenizer JSON, "
                        "or a directory with vocab.json + merges.txt); with --from-llama2c: "
                        "llama2.c's tokenizer.bin (e.g. tok512.bin); without it the file "
                        "holds the weights only")
    p.add_argument("--max-len", type=int, metavar="T",
                   help="with --from-hf / --from-llama2c: a shorter context than the "
                        "checkpoint's")
    p.add_argument("--max-shard-size", metavar="SIZE",
                   help="with --to-hf: the largest weights file, e.g. 5GB, 100MB, 500KB "
                        "(decimal units, as transformers' save_pretrained) or bytes; larger "
                        "models are written as model-0000i-of-0000n.safetensors shards with "
                        "model.safetensors.index.json (default 50GB)")
    p.add_argument("--force", action="store_true",
                   help="with --to-hf: replace a checkpoint already in DIR (never the source "
                        "model file itself)")
    p.set_defaults(func=run_convert)


def run_convert(args) -> int:
    sources = [flag for flag in ("from_hf", "from_llama2c", "from_gguf", "model")
               if getattr(args, flag) is not None]
    targets = [flag for flag in ("out", "to_hf", "to_llama2c", "to_gguf")
               if getattr(args, flag) is not None]
    extras = {flag for flag in ("tokenizer", "max_len", "max_shard_size", "type")
              if getattr(args, flag) is not None}
    if args.force:
        extras.add("force")
    allowed = {("from_hf", "out"): {"tokenizer", "max_len"},
               ("from_llama2c", "out"): {"tokenizer", "max_len"}, ("from_gguf", "out"): set(),
               ("model", "to_hf"): {"force", "max_shard_size"}, ("model", "to_llama2c"): set(),
               ("model", "to_gguf"): {"type"}}
    mode = (sources[0], targets[0]) if len(sources) == len(targets) == 1 else None
    if mode not in allowed or not extras <= allowed[mode]:
        raise UsageError(CONVERT_USAGE)
    if mode == ("from_hf", "out"):
        model, tokenizer = _convert_from_hf(args)
    elif mode == ("from_llama2c", "out"):
        model, tokenizer = _convert_from_llama2c(args)
    elif mode == ("from_gguf", "out"):
        model, tokenizer = _convert_from_gguf(args)
    elif mode == ("model", "to_hf"):
        model, tokenizer = _convert_to_hf(args)
    elif mode == ("model", "to_gguf"):
        model, tokenizer = _convert_to_gguf(args)
    else:
        model, tokenizer = _convert_to_llama2c(args)
    src, dst = getattr(args, mode[0]), getattr(args, mode[1])
    cfg = model.cfg
    kind = json.loads(tokenizer.to_json())["type"] if tokenizer is not None else "none"
    print(f"{src} -> {dst}: {cfg.family} model, d_model {cfg.d_model}, {cfg.n_layers} layers, "
          f"{cfg.n_heads} heads ({cfg.n_kv_heads} kv), vocab {cfg.vocab_size}, "
          f"{sum(p.size for p in model.parameters()):,} parameters; tokenizer {kind}",
          flush=True)
    return 0


def _check_out_file(out: str, source: str, what: str, flag: str = "--out") -> None:
    """`flag`'s path must be a file path other than the input (which it would replace)."""
    if os.path.isdir(out):
        raise UsageError(f"{flag} {out} is a directory; give a file path")
    if os.path.exists(out) and os.path.exists(source) and os.path.samefile(out, source):
        raise UsageError(f"{flag} {out} is the {what} being converted; write the result "
                         f"elsewhere")


def _convert_from_hf(args):
    from ..formats import hf
    from ..tokenizers import load_tokenizer

    _check_out_file(args.out, args.from_hf, "--from-hf checkpoint")
    # Writing into the checkpoint's own directory could replace its model.safetensors
    # (or a shard) with a glassllm file: refuse any output that is one of its files.
    if os.path.isdir(args.from_hf) and os.path.exists(args.out) and any(
            os.path.samefile(args.out, os.path.join(args.from_hf, name))
            for name in os.listdir(args.from_hf)):
        raise UsageError(f"--out {args.out} is a file of the --from-hf checkpoint "
                         f"{args.from_hf}; write the glassllm model elsewhere")
    model = hf.from_hf(args.from_hf, max_len=args.max_len)
    if args.tokenizer:
        tokenizer = load_tokenizer(args.tokenizer)
    else:
        tokenizer = hf.tokenizer_from_hf(args.from_hf, model.cfg.vocab_size)
    return _save_converted(model, tokenizer, args.out, (
        f"{args.from_hf} has no tokenizer files (vocab.json + merges.txt or tokenizer.json)",
        "give --tokenizer PATH here or to `glassllm generate`"))


def _convert_from_llama2c(args):
    from ..formats import llama2c

    _check_out_file(args.out, args.from_llama2c, "--from-llama2c checkpoint")
    if args.tokenizer is not None:
        _check_out_file(args.out, args.tokenizer, "--tokenizer")
    model = llama2c.from_llama2c(args.from_llama2c, max_len=args.max_len)
    tokenizer = None  # a llama2.c checkpoint holds no tokenizer: weights-only unless given
    if args.tokenizer is not None:
        tokenizer = llama2c.tokenizer_from_llama2c(args.tokenizer)
        if tokenizer.vocab_size != model.cfg.vocab_size:
            raise UsageError(f"--tokenizer {args.tokenizer} has {tokenizer.vocab_size} pieces "
                             f"but {args.from_llama2c} has vocab_size {model.cfg.vocab_size}; "
                             f"give the checkpoint's own tokenizer.bin")
    return _save_converted(model, tokenizer, args.out, (
        "no --tokenizer", "give llama2.c's tokenizer.bin (e.g. tok512.bin for stories260K.bin) "
        "here, or a tokenizer to `glassllm generate --tokenizer`"))


def _convert_from_gguf(args):
    from ..formats import gguf_read

    _check_out_file(args.out, args.from_gguf, "--from-gguf file")
    model, tokenizer = gguf_read.read_gguf(args.from_gguf)
    return _save_converted(model, tokenizer, args.out, (
        f"{args.from_gguf} has no tokenizer.ggml.model", "give a tokenizer to `glassllm "
        "generate --tokenizer`"))


def _save_converted(model, tokenizer, out: str, without: tuple[str, str]):
    """Save a converted model; without a tokenizer, say why (without[0]) and what to give
    (without[1]) on stderr: the file then holds the weights only."""
    from ..formats import files
    files.save(model, out, tokenizer)
    if tokenizer is None:
        why, what = without
        print(f"note: {why}: {out} holds the weights only; {what}", file=sys.stderr,
              flush=True)
    return model, tokenizer


def _convert_to_hf(args):
    from ..formats import hf

    size = hf.DEFAULT_MAX_SHARD_SIZE if args.max_shard_size is None else (
        int(args.max_shard_size) if args.max_shard_size.strip().isdigit() else args.max_shard_size)
    try:
        hf.shard_size_bytes(size)
    except ValueError as e:
        raise UsageError(f"--max-shard-size: {e}") from None
    model, tokenizer = _convert_source(args.model)
    try:
        hf.to_hf(model, args.to_hf, tokenizer, overwrite=args.force, source=args.model,
                 max_shard_size=size)
    except FileExistsError as e:
        raise UsageError(f"--to-hf: {e}") from None
    if tokenizer is not None and not hf.stores_tokenizer(tokenizer, model.cfg.vocab_size):
        kind = json.loads(tokenizer.to_json())["type"]
        print(f"note: {args.to_hf} holds no tokenizer: glassllm writes its byte, BPE and "
              f"SentencePiece tokenizers (tokenizer.json), not this {kind} tokenizer (it "
              f"stays in {args.model}); give its file to `glassllm generate --tokenizer`",
              file=sys.stderr, flush=True)
        tokenizer = None
    return model, tokenizer


def _convert_source(path: str):
    """(model, tokenizer or None) of `convert --model`: a glassllm model file or a GGUF file
    (`formats.gguf_read`, dequantized). A llama2.c checkpoint given there (glassllm.load and
    generate take one) is told how to convert it.

    Raises:
        ValueError: as `files.load`, with the way from a llama2.c `.bin` added.
    """
    from ..formats import files, lm
    if lm.is_gguf(path):  # requantizing (f16 -> q4_0) or exporting a GGUF model
        return lm.load_model_and_tokenizer(path)
    try:
        return files.load(path), files.load_tokenizer(path)
    except ValueError as e:
        if not path.endswith(".bin"):
            raise
        raise ValueError(f"{one_line(e)}; --model takes a glassllm model file: for a "
                         f"llama2.c checkpoint, first `glassllm convert --from-llama2c {path} "
                         f"--tokenizer TOKENIZER.bin --out MODEL.safetensors`") from None


def _convert_to_llama2c(args):
    from ..formats import llama2c

    _check_out_file(args.to_llama2c, args.model, "model", "--to-llama2c")
    model, tokenizer = _convert_source(args.model)
    llama2c.to_llama2c(model, args.to_llama2c)
    if tokenizer is not None:  # the format has no place for one: run.c takes it with -z
        kind = json.loads(tokenizer.to_json())["type"]
        print(f"note: {args.to_llama2c} holds the weights only (a llama2.c checkpoint has no "
              f"tokenizer; run.c reads a tokenizer.bin given with -z); the {kind} tokenizer "
              f"stays in {args.model}", file=sys.stderr, flush=True)
    return model, None


def _convert_to_gguf(args):
    from ..formats import gguf_write

    _check_out_file(args.to_gguf, args.model, "model", "--to-gguf")
    model, tokenizer = _convert_source(args.model)
    own = tokenizer
    if tokenizer is not None and not gguf_write.stores_tokenizer(tokenizer):
        tokenizer = None  # as --to-hf does: the weights written, the tokenizer said to stay
    gguf_write.write_gguf(model, args.to_gguf, tokenizer, type=args.type or "f32")
    if own is None:
        print(f"note: {args.model} holds no tokenizer: {args.to_gguf} has tokenizer model "
              f"\"none\" (llama.cpp runs it on token ids only)", file=sys.stderr, flush=True)
    elif tokenizer is None:
        kind = json.loads(own.to_json())["type"]
        print(f"note: {args.to_gguf} has tokenizer model \"none\" (llama.cpp runs it on token "
              f"ids only): GGUF holds SentencePiece and GPT-2 BPE tokenizers, not this {kind} "
              f"tokenizer (it stays in {args.model})", file=sys.stderr, flush=True)
    return model, tokenizer
