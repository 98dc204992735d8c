"""The models a server answers about: the one given with --model, and the saved models of the
training run given with --run (model files and checkpoints), each with its tokenizer and a lock.

A request names a model by `model`: "" (or absent) for the --model one, else a file name
inside the run directory. That name is confined to the run directory (`run_file`): no
absolute path, no "..", no link leading out, only a regular `.safetensors` file there.

Analyses of one model are serialised: every piece of work on a `Loaded` waits for its turn
(`Loaded.turn`, a first-come first-served queue of the server's event loop, so no worker
thread is held while waiting) and then runs under its lock (`Loaded.lock`, taken in the worker
thread), so two tabs and a script at once each get the answer they would get alone. (A
generation takes one turn per token: other requests run between its tokens, never inside one.)
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import os
import threading

from ..lens.report import TokenTexts
from ..lens.report import fit_prompt as cut_prompt
from ..model import Config, GlassLM
from .fields import RequestError

MAX_NAME = 255
_CACHED = 3  # run models kept loaded at once (the newest requests win)


@dataclasses.dataclass
class Loaded:
    """A model ready to analyse: `name` as requests give it ("" for --model), `label` for
    people, its tokenizer (never None) and token texts, the queue its work waits in (`turn`:
    an asyncio.Lock, fair, bound to the server's loop at first use) and the lock it runs under."""
    name: str
    label: str
    model: GlassLM
    tokenizer: object
    texts: TokenTexts = None
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    turn: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)

    def __post_init__(self):
        if self.texts is None:
            self.texts = TokenTexts(self.tokenizer)

    def describe(self) -> dict:
        cfg = self.model.cfg
        return dict(name=self.name, label=self.label, config=cfg.to_dict(),
                    tokenizer=type(self.tokenizer).__name__,
                    tokenizer_vocab=int(self.tokenizer.vocab_size),
                    parameters=int(sum(p.size for p in self.model.parameters())))


def encode_prompt(tokenizer, text: str) -> list[int]:
    """The ids of a prompt as `glassllm generate` and `glassllm inspect` make them: the
    tokenizer's ids, after its begin-of-sequence id when it has one (SentencePiece/Llama)."""
    ids = [int(i) for i in tokenizer.encode(text)]
    bos = getattr(tokenizer, "bos_id", None)
    return [int(bos)] + ids if bos is not None else ids


def fit_prompt(loaded: Loaded, text: str) -> tuple[list[int], str | None]:
    """The prompt's ids (`encode_prompt`) cut to the model's max_len, and a note when cut
    (`glassllm.lens.report.fit_prompt`: its first max_len ids, as `glassllm inspect`): a
    model of a short context opens on any prompt, the page's own default included."""
    return cut_prompt(encode_prompt(loaded.tokenizer, text), loaded.model.cfg.max_len)


def run_file(run_dir: str, name) -> str:
    """The real path of `name`, a .safetensors file inside `run_dir`.

    Raises:
        RequestError: not a string, too long, absolute, a "..", a NUL, not .safetensors,
            outside the directory once links are followed (403), or no such regular file (404).
    """
    if not isinstance(name, str) or not name or len(name) > MAX_NAME or "\x00" in name:
        raise RequestError(f"model must be a file name in the run directory (at most "
                           f"{MAX_NAME} characters), got {str(name)[:60]!r}")
    parts = name.replace("\\", "/").split("/")
    if os.path.isabs(name) or name.startswith(("/", "\\")) or ".." in parts or \
            (len(name) > 1 and name[1] == ":"):
        raise RequestError(f"model {name[:60]!r}: only files inside the run directory can be "
                           f"opened", status=403)
    if not name.endswith(".safetensors"):
        raise RequestError(f"model {name[:60]!r}: not a .safetensors file")
    root = os.path.realpath(run_dir)
    path = os.path.realpath(os.path.join(root, name))
    if os.path.commonpath([root, path]) != root:
        raise RequestError(f"model {name[:60]!r} leads outside the run directory",
                           status=403)
    if not os.path.isfile(path):
        raise RequestError(f"model {name[:60]!r}: no such file in the run directory",
                           status=404)
    return path


def load_run_file(path: str, name: str) -> Loaded:
    """A model file (`glassllm.formats.files`) or a training checkpoint
    (`glassllm.formats.checkpoint`: its weights and stored tokenizer) as a Loaded.

    Raises:
        RequestError: the file cannot be read as either, or holds no tokenizer.
    """
    from ..formats import checkpoint, files
    from ..tokenizers import tokenizer_from_json
    try:
        try:
            model, tokenizer = files.load(path), files.load_tokenizer(path)
        except ValueError as model_error:
            try:
                ckpt = checkpoint.load_checkpoint(path)
            except ValueError:
                raise model_error from None
            model = GlassLM(Config.from_dict(ckpt.config))
            model.load_state_dict(ckpt.weights)
            text = ckpt.extra.get("tokenizer")
            tokenizer = tokenizer_from_json(text) if isinstance(text, str) else None
    except (OSError, ValueError) as e:
        raise RequestError(f"model {name!r}: cannot be loaded: "
                           f"{' '.join(str(e).split())[:300]}") from None
    if tokenizer is None:
        raise RequestError(f"model {name!r} holds no tokenizer (a weights-only file)")
    return Loaded(name, name, model, tokenizer)


class ModelStore:
    """The --model (`main`, may be None) and the run directory's models, loaded on demand and
    reloaded when their file changes (kept by path, modification time and size)."""

    def __init__(self, main: Loaded | None, run_dir: str | None = None):
        self.main, self.run_dir = main, run_dir
        self._cache: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, name) -> Loaded:
        """The model a request names ("" or None: the --model one, else the run's newest model
        file). Blocking (reads files): call it from a worker thread."""
        if name in (None, ""):
            if self.main is not None:
                return self.main
            newest = self.newest_model()
            if newest is None:
                raise RequestError("no model yet: this server has no --model and the run "
                                   "directory holds no model file", status=404)
            name = newest
        if self.run_dir is None:
            raise RequestError("model: this server has no run directory (--run); only the "
                               "--model one (model \"\") can be used", status=404)
        path = run_file(self.run_dir, name)
        st = os.stat(path)
        key = (path, st.st_mtime_ns, st.st_size)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        loaded = load_run_file(path, name)
        with self._lock:
            self._cache[key] = loaded
            while len(self._cache) > _CACHED:
                self._cache.popitem(last=False)
        return loaded

    def run_models(self) -> list[dict]:
        """The .safetensors files of the run directory, newest first: name, kind ("checkpoint"
        by its name, else "model"), size and modification time (s since the epoch)."""
        if self.run_dir is None or not os.path.isdir(self.run_dir):
            return []
        found = []
        for entry in os.scandir(self.run_dir):
            # regular files only: a link could lead out of the directory (`run_file`)
            if entry.name.endswith(".safetensors") and not entry.name.startswith(".") and \
                    entry.is_file(follow_symlinks=False):
                st = entry.stat()
                found.append(dict(name=entry.name, size=st.st_size, mtime=st.st_mtime,
                                  kind="checkpoint" if "checkpoint" in entry.name
                                  else "model"))
        return sorted(found, key=lambda f: (-f["mtime"], f["name"]))

    def newest_model(self) -> str | None:
        """The run's most recently written model file (not a checkpoint): its best so far."""
        models = [m["name"] for m in self.run_models() if m["kind"] == "model"]
        return models[0] if models else None
