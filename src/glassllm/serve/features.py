"""The dictionaries of the Features view (`glassllm serve --features DIR`), and its answers.

Which files the page may open: only the dictionaries found in DIR, the one directory given on
the command line -- DIR itself when it holds a `cfg.json` (one SAELens directory), else each of
its direct sub-directories that holds one. A request names a dictionary by that listing's
name ("" for DIR itself, else a sub-directory's name), never by a path: a name not in the
listing is refused (404) before anything is opened, so no request can make the server read a
file outside DIR, nor any file there that is not a dictionary's. Links are not followed out of
DIR (a sub-directory that is a link leading elsewhere is not listed).

The corpus of the top contexts and the histograms is `--features-data D` (a text file or a
`glassllm prepare` token file/directory), its first `Limits.feature_tokens` tokens, scanned
once per dictionary and model and kept (`FeatureStore.scan`). Without it the view still shows
logit weights and the prompt's features.
"""
from __future__ import annotations

import collections
import os
import threading

import numpy as np

from ..lens.features import browse
from .fields import RequestError, get_choice, get_int, get_real, get_str

MAX_DICTIONARIES = 200
STEER_TOKENS = 64  # most tokens of one steered generation (two greedy runs of them)
_KEPT = 4  # dictionaries (and their scans) kept loaded at once


class FeatureStore:
    """The dictionaries of `root` (`names`), loaded and scanned on demand, with `data` the
    corpus path (or None). Blocking: call from worker threads."""

    def __init__(self, root: str, data: str | None = None, max_tokens: int = 16384,
                 seq_len: int = 64):
        self.root, self.data = os.path.realpath(root), data
        self.max_tokens, self.seq_len = max_tokens, seq_len
        self._lock = threading.Lock()
        self._kept: collections.OrderedDict = collections.OrderedDict()

    def describe(self) -> dict:
        """What /api/info says of the view: the dictionaries' names (never paths) and the
        corpus' file name (or None)."""
        return dict(dictionaries=self.names(), corpus=None if self.data is None else
                    os.path.basename(self.data.rstrip(os.sep)))

    def names(self) -> list[str]:
        """The dictionaries the page may open: the first MAX_DICTIONARIES of `all_names()`."""
        return self.all_names()[:MAX_DICTIONARIES]

    def all_names(self) -> list[str]:
        """"" (root itself) or its sub-directories' names, each holding a cfg.json (names
        that are not UTF-8 left out: no request can name them); sorted."""
        if _is_dictionary(self.root):
            return [""]
        if not os.path.isdir(self.root):
            return []
        return sorted(e.name for e in os.scandir(self.root)
                      if e.is_dir(follow_symlinks=False) and not e.name.startswith(".") and
                      _is_text(e.name) and _is_dictionary(os.path.join(self.root, e.name)))

    def path(self, name) -> str:
        """The directory of the dictionary `name`. Raises RequestError (404) for a name not
        in `names()` (any path, "..", a link out of root)."""
        if not isinstance(name, str) or name not in self.names():
            raise RequestError(f"dictionary {str(name)[:60]!r}: no such dictionary in the "
                               f"server's --features directory", status=404)
        return os.path.join(self.root, name) if name else self.root

    def get(self, name: str, loaded, should_stop=None) -> dict:
        """{"sae", "scan" (None without a corpus), "logits" (None: no residual direction),
        "evaluation" (evaluation.json's report, or None)} of dictionary `name` on `loaded`'s
        model, kept for the next request (by directory, its files' times and the model)."""
        from ..lens.features import load_saelens
        path = self.path(name)
        key = (path, _stamp(path), id(loaded.model))
        with self._lock:
            if key in self._kept:
                self._kept.move_to_end(key)
                return self._kept[key]
        try:
            sae = load_saelens(path)
        except (OSError, ValueError) as e:
            raise RequestError(f"dictionary {name!r}: cannot be loaded: "
                               f"{' '.join(str(e).split())[:300]}") from None
        try:
            browse.check_fits(loaded.model, sae)
        except ValueError as e:
            raise RequestError(f"dictionary {name!r} does not fit model {loaded.label!r}: {e}")
        held = dict(sae=sae, scan=self._scan(sae, loaded, should_stop),
                    logits=browse.feature_logits(loaded.model, sae),
                    evaluation=_evaluation(path))
        with self._lock:
            self._kept[key] = held
            while len(self._kept) > _KEPT:
                self._kept.popitem(last=False)
        return held

    def _scan(self, sae, loaded, should_stop):
        if self.data is None:
            return None
        seq_len = min(self.seq_len, loaded.model.cfg.max_len)
        try:
            windows = browse.corpus_windows(loaded.tokenizer, self.data, seq_len,
                                            self.max_tokens)
        except (OSError, ValueError) as e:
            raise RequestError(f"--features-data: {' '.join(str(e).split())[:300]}") from None
        bos = getattr(loaded.tokenizer, "bos_id", None)
        return browse.scan_features(loaded.model, sae, windows, should_stop=should_stop,
                                    ignore=() if bos is None else (int(bos),))


def _is_text(name: str) -> bool:
    """A directory name a request can name: not UTF-8 bytes (read by Python as lone
    surrogates, PEP 383), no JSON string the page sends can hold it."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _is_dictionary(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "cfg.json"))


def _stamp(path: str) -> tuple:
    return tuple((f, st.st_mtime_ns, st.st_size) for f in sorted(os.listdir(path))
                 if f.endswith((".json", ".safetensors"))
                 for st in [os.stat(os.path.join(path, f))])


def _evaluation(path: str):
    import json
    try:
        with open(os.path.join(path, "evaluation.json"), encoding="utf-8") as f:
            report = json.load(f)
    except (OSError, ValueError):
        return None
    return report if isinstance(report, dict) else None


# --------------------------------------------------------------------------- answers
def held(store: FeatureStore | None, body: dict, loaded, should_stop) -> tuple[str, dict]:
    """(name, `FeatureStore.get`) of the dictionary a request names (body's "dictionary")."""
    if store is None:
        raise RequestError("this server has no dictionaries (start it with --features DIR)",
                           status=404)
    name = get_str(body, "dictionary", 255, default="")
    return name, store.get(name, loaded, should_stop)


def index(body: dict, held: dict) -> int:
    """The request's "feature", checked against the dictionary's size."""
    return get_int(body, "feature", 0, int(held["sae"].d_sae) - 1)


def _numbers(report):
    """evaluation.json's numbers and short strings only (the page shows them as text)."""
    if report is None:
        return None
    return {str(k)[:60]: v for k, v in list(report.items())[:40]
            if isinstance(v, (int, float, str)) and not isinstance(v, bool) and
            (not isinstance(v, float) or np.isfinite(v)) and len(str(v)) <= 200}


def opened(held: dict, loaded, name: str, top: int = 20) -> dict:
    """POST /api/features/open: the dictionary's facts, its stored evaluation, and (with a
    corpus) its `top` most frequent features."""
    scan = held["scan"]
    frequent = None
    if scan is not None:
        density = scan.density
        order = np.argsort(-density, kind="stable")[:top]
        frequent = [[int(f), round(float(density[f]), 5)] for f in order if density[f] > 0]
    return dict(dictionary=name, facts=browse.dictionary_facts(held["sae"], scan),
                evaluation=_numbers(held["evaluation"]), frequent=frequent,
                logit_weights=held["logits"] is not None, corpus=scan is not None)


def feature(held: dict, loaded, index: int, k: int) -> dict:
    """POST /api/features/feature: one feature's view (`browse.feature_view`)."""
    return browse.feature_view(held["scan"], held["logits"], index, loaded.texts, k=k,
                               contexts=k, vocab_limit=int(loaded.tokenizer.vocab_size))


def search(held: dict, loaded, token_id: int, k: int) -> dict:
    """POST /api/features/search: the features that fire on / promote one token."""
    found = browse.search_by_token(held["scan"], held["logits"], token_id, k)
    return dict(found, token=int(token_id), token_text=loaded.texts(token_id))


def prompt(held: dict, loaded, ids: np.ndarray, k: int) -> dict:
    """POST /api/features/prompt: the active features at each token of the prompt."""
    feats, values = browse.prompt_features(loaded.model, held["sae"], ids, k)
    return dict(tokens=dict(ids=ids.tolist(), texts=[loaded.texts(i) for i in ids]),
                features=feats.tolist(), activations=np.round(values, 4).tolist())


def steer(held: dict, loaded, ids: np.ndarray, body: dict) -> dict:
    """POST /api/features/steer: greedy continuations of the prompt (body's max_new_tokens,
    at most STEER_TOKENS), clean and with the feature steered (how "steer": alpha W_dec[i]
    added at the value the decoder writes) or ablated (how "ablate")."""
    sae, limit = held["sae"], int(loaded.tokenizer.vocab_size)
    feature = index(body, held)
    how = get_choice(body, "how", ("steer", "ablate"), default="steer")
    alpha = get_real(body, "alpha", -1e4, 1e4, default=4.0)
    n = get_int(body, "max_new_tokens", 0, STEER_TOKENS, default=20)
    hooks = browse.steering_hooks(sae, feature, alpha) if how == "steer" else \
        browse.ablation_hooks(sae, feature)
    ids = [int(i) for i in ids]
    n = max(0, min(n, loaded.model.cfg.max_len - len(ids)))  # the context holds them all
    clean = browse.generate_with_hooks(loaded.model, ids, n, [], vocab_limit=limit)
    changed = browse.generate_with_hooks(loaded.model, ids, n, hooks, vocab_limit=limit)
    return dict(feature=feature, how=how, alpha=alpha if how == "steer" else None,
                clean=[loaded.texts(i) for i in clean], changed=[loaded.texts(i) for i in changed])
