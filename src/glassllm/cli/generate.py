"""`glassllm generate`: continue a prompt with a saved model, printing text as it comes."""
from __future__ import annotations

import os
import sys

from .common import (UsageError, add_device_option, model_with_tokenizer, non_negative_int,
                     read_option_file)

def add_generate(sub) -> None:
    p = sub.add_parser(
        "generate", help="generate text from a saved model",
        description="Continue a prompt with a saved model, printing text as it is produced. "
                    "Stops after --max-new-tokens tokens or at the end-of-text token.")
    p.add_argument("--model", required=True, metavar="PATH",
                   help="model file written by `glassllm train` (glassllm safetensors), a "
                        "Hugging Face GPT-2/Llama directory (config.json + model.safetensors, "
                        "tokenizer from vocab.json + merges.txt or tokenizer.json), or a "
                        "llama2.c checkpoint (.bin, with --tokenizer); local files only")
    p.add_argument("--prompt", metavar="TEXT",
                   help="text to continue; none (or \"\") samples unconditionally, from the "
                        "tokenizer's start token: its begin-of-sequence token (SentencePiece/"
                        "Llama), else end-of-text (GPT-2 and byte tokenizers), never printed")
    p.add_argument("--prompt-file", metavar="PATH",
                   help="read the prompt from this UTF-8 text file (as it is, final newline "
                        "included), instead of --prompt")
    p.add_argument("--num-samples", type=int, default=1, metavar="N",
                   help="generate N samples of the prompt, one after the other from one "
                        "random stream, separated by a line of dashes (default 1)")
    p.add_argument("--tokenizer", metavar="PATH",
                   help="tokenizer to use instead of the model's (needed for a weights-only "
                        "model or a llama2.c checkpoint): a tokenizer JSON (BPETokenizer.save, "
                        "a Hugging Face tokenizer.json), a directory with GPT-2's vocab.json + "
                        "merges.txt, a llama2.c tokenizer.bin, or `byte`")
    p.add_argument("--max-new-tokens", type=int, default=200, metavar="N",
                   help="most tokens to generate (default 200)")
    p.add_argument("--temperature", type=float, default=0.8, metavar="T",
                   help="softmax temperature; 0 = greedy (default 0.8)")
    p.add_argument("--top-k", type=int, default=None, metavar="K",
                   help="sample only among the K most probable tokens (default: all)")
    p.add_argument("--top-p", type=float, default=None, metavar="P",
                   help="sample only among the most probable tokens whose probabilities "
                        "add up to P, 0 < P <= 1 (default: all)")
    p.add_argument("--seed", type=non_negative_int, default=None, metavar="S",
                   help="random seed >= 0, for a reproducible text (default: a fresh one)")
    add_device_option(p)  # tokens are drawn on the host: one seed, one text on every device
    p.set_defaults(func=run_generate)


def run_generate(args) -> int:
    import numpy as np

    from ..formats.lm import LM
    from ..generate import Sampling

    prompt = _generate_prompt(args)
    if args.max_new_tokens < 0:
        raise UsageError(f"--max-new-tokens must be >= 0, got {args.max_new_tokens}")
    if args.num_samples < 1:
        raise UsageError(f"--num-samples must be >= 1, got {args.num_samples}")
    try:
        Sampling(args.temperature, args.top_k, args.top_p)
    except ValueError as e:
        raise UsageError(f"bad --temperature/--top-k/--top-p: {e}") from None
    model, tokenizer = model_with_tokenizer(args)
    # The prompt is encoded as `LM.encode` does: BOS first where the tokenizer has one
    # (SentencePiece/Llama, as llama2.c's run.c), an empty prompt is the start token alone (an
    # unconditional sample; GPT-2 and byte: end-of-text, as nanoGPT and transformers). The
    # start token is never printed; generation stops at the tokenizer's stop ids.
    lm = LM(model, tokenizer)
    rng = np.random.default_rng(args.seed)  # one stream for all samples, as nanoGPT's sample.py
    try:
        for n in range(args.num_samples):
            # the first draw comes before any output, so an error (a model whose logits are
            # NaN) is a clean one-line error rather than a prompt followed by a message
            pieces = lm.stream(prompt, args.max_new_tokens, args.temperature, args.top_k,
                               args.top_p, seed=rng)
            if n:
                print(SAMPLE_SEPARATOR, flush=True)
            print(prompt, end="", flush=True)
            for piece in pieces:
                print(piece, end="", flush=True)
            print(flush=True)
    except BrokenPipeError:
        # The reader left (`glassllm generate ... | head`): stop quietly, as Unix tools do;
        # point stdout at devnull so the interpreter's final flush does not complain.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


SAMPLE_SEPARATOR = "---------------"  # between --num-samples samples, as nanoGPT's sample.py


def _generate_prompt(args) -> str:
    """The prompt of generate: --prompt, the text of --prompt-file, or "" (the start token)."""
    if args.prompt is not None and args.prompt_file is not None:
        raise UsageError("give --prompt or --prompt-file, not both")
    if args.prompt_file is not None:
        data = read_option_file(args.prompt_file, "--prompt-file")
        try:
            # universal newlines, as open(..., encoding="utf-8") reads a text file
            return data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
        except UnicodeDecodeError as e:
            raise UsageError(f"--prompt-file {args.prompt_file}: not UTF-8 text (byte "
                             f"{e.start})") from None
    prompt = "" if args.prompt is None else args.prompt
    try:  # argv bytes that are not UTF-8 arrive as lone surrogates (surrogateescape)
        prompt.encode("utf-8")
    except UnicodeEncodeError as e:
        raise UsageError(f"--prompt is not valid UTF-8 text (undecodable byte(s) at character "
                         f"{e.start}); give the prompt in UTF-8") from None
    return prompt
