"""The Features view's API of `glassllm serve` (glassllm/serve/features.py): each answer equals
the library's (glassllm.lens.features.browse) on the same model, dictionary and corpus, and
the page can name only the dictionaries of the --features directory."""
from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("aiohttp")

from glassllm.lens.features import SAE, browse, save_saelens  # noqa: E402
from glassllm.lens.report import TokenTexts  # noqa: E402
from glassllm.serve.features import FeatureStore  # noqa: E402
from glassllm.serve.models import Loaded, encode_prompt  # noqa: E402
from glassllm.tokenizers import ByteTokenizer  # noqa: E402

from serve_client import PROMPT, Running, tiny_model  # noqa: E402

CORPUS = ("Once upon a time there was a little cat. The cat liked to play in the sun. "
          "One day the cat met a dog, and they became friends. <b>&amp;</b> ") * 12


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("features")
    model = tiny_model()
    saes = {"a": SAE(32, 96, kind="topk", k=6, hook_name="blocks.1.residual_out", seed=1),
            "b": SAE(32, 64, kind="relu", hook_name="blocks.0.residual_out", seed=2)}
    for name, sae in saes.items():
        save_saelens(sae, root / "dicts" / name)
    (root / "corpus.txt").write_text(CORPUS)
    (root / "secret").mkdir()
    save_saelens(saes["a"], root / "secret" / "c")
    os.symlink(root / "secret" / "c", root / "dicts" / "link")  # leads out: never listed
    store = FeatureStore(str(root / "dicts"), str(root / "corpus.txt"), max_tokens=1024,
                         seq_len=32)
    running = Running(Loaded("", "tiny", model, ByteTokenizer()), features=store)
    windows = browse.corpus_windows(ByteTokenizer(), root / "corpus.txt", 32, 1024)
    scan = browse.scan_features(model, saes["a"], windows)
    yield dict(running=running, model=model, saes=saes, scan=scan, root=root)
    running.stop()


def call(world, path, **body):
    return world["running"].call("/api/features/" + path, dict({"dictionary": "a"}, **body))


def test_info_lists_dictionaries_by_name_only(world):
    status, info = world["running"].call("/api/info")
    assert status == 200
    assert info["features"] == {"dictionaries": ["a", "b"], "corpus": "corpus.txt"}


def test_open_equals_the_library(world):
    status, r = call(world, "open", request=7)
    assert status == 200 and r["request"] == 7 and r["model"] == ""
    assert r["facts"] == browse.dictionary_facts(world["saes"]["a"], world["scan"])
    density = world["scan"].density
    assert [f for f, _ in r["frequent"]] == \
        [int(f) for f in np.argsort(-density, kind="stable")[:20] if density[f] > 0]


def test_feature_equals_the_library(world):
    f = int(np.argmax(world["scan"].density))
    status, r = call(world, "feature", feature=f, k=5)
    assert status == 200
    texts = TokenTexts(ByteTokenizer())
    logits = browse.feature_logits(world["model"], world["saes"]["a"])
    expected = browse.feature_view(world["scan"], logits, f, texts, 5, 5, vocab_limit=256)
    assert r["contexts"] == expected["contexts"] and r["histogram"] == expected["histogram"]
    assert [row[2] for row in r["promoted"]] == \
        np.argsort(-logits[f], kind="stable")[:5].tolist()
    assert r["density"] == pytest.approx(float(world["scan"].density[f]))


def test_search_and_prompt_equal_the_library(world):
    status, r = call(world, "search", token="c", k=4)
    logits = browse.feature_logits(world["model"], world["saes"]["a"])
    assert status == 200 and r["token"] == ord("c")
    assert r == dict(browse.search_by_token(world["scan"], logits, ord("c"), 4),
                     token=ord("c"), token_text="c", model="", request=None)
    status, r = call(world, "prompt", prompt=PROMPT, k=3)
    ids = np.asarray(encode_prompt(ByteTokenizer(), PROMPT))
    feats, values = browse.prompt_features(world["model"], world["saes"]["a"], ids, 3)
    assert status == 200 and r["features"] == feats.tolist()
    np.testing.assert_allclose(r["activations"], values, atol=1e-4)


def test_steer_and_ablate(world):
    status, r = call(world, "steer", feature=3, how="steer", alpha=0.0, prompt="Once",
                     max_new_tokens=6)
    assert status == 200 and r["changed"] == r["clean"] and len(r["clean"]) == 6
    status, r = call(world, "steer", feature=3, how="steer", alpha=300.0, prompt="Once",
                     max_new_tokens=6)
    assert status == 200 and r["changed"] != r["clean"]
    status, r = call(world, "steer", feature=3, how="ablate", prompt="Once", max_new_tokens=3)
    assert status == 200 and r["alpha"] is None


@pytest.mark.parametrize("name", ["../secret/c", "/etc", "a/../b", "link", "secret", ".",
                                  "a/", "\x00", "c"])
def test_only_listed_dictionaries_open(world, name):
    status, r = call(world, "open", dictionary=name)
    assert status == 404 and "no such dictionary" in r["error"]


def test_refusals_are_one_line(world):
    status, r = call(world, "feature", feature=96)
    assert status == 400 and "feature" in r["error"]
    status, r = call(world, "open", dictionary="b", unknown=1)
    assert status == 400
    status, r = call(world, "search", token="two tokens")
    assert status == 400 and "tokens" in r["error"]


def test_a_directory_name_that_is_not_utf8_is_not_listed(tmp_path):
    # it was listed (as lone surrogates) and every request naming it refused: "dictionary is
    # not valid Unicode text"
    from glassllm.serve.features import FeatureStore
    sae = SAE(32, 16, kind="topk", k=2, hook_name="blocks.0.residual_out")
    save_saelens(sae, tmp_path / "ok")
    save_saelens(sae, os.fsdecode(os.fsencode(str(tmp_path)) + b"/bad\xff\xfe"))
    assert sorted(os.listdir(tmp_path)) == ["bad\udcff\udcfe", "ok"]
    assert FeatureStore(str(tmp_path)).names() == ["ok"]


def test_more_dictionaries_than_listed_are_said_at_start(tmp_path, monkeypatch, capsys):
    # the view listed the first 200 without a word about the others
    import argparse
    from glassllm.cli import serve as serve_cli
    from glassllm.serve import features
    monkeypatch.setattr(features, "MAX_DICTIONARIES", 2)
    for name in ("c", "a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "cfg.json").write_text("{}")
    store = serve_cli._feature_store(argparse.Namespace(features=str(tmp_path),
                                                        features_data=None))
    assert store.names() == ["a", "b"] and store.all_names() == ["a", "b", "c"]
    out = capsys.readouterr().out
    assert f"--features {tmp_path} holds 3 dictionaries; the Features view lists the first 2" \
        in out and out.count("\n") == 1


def test_a_dictionary_of_another_width_is_refused(world, tmp_path):
    save_saelens(SAE(16, 32, kind="topk", k=2, hook_name="blocks.0.residual_out"),
                 tmp_path / "narrow")
    running = Running(Loaded("", "tiny", world["model"], ByteTokenizer()),
                      features=FeatureStore(str(tmp_path)))
    try:
        status, r = running.call("/api/features/open", {"dictionary": "narrow"})
        assert status == 400 and "width 16" in r["error"]
    finally:
        running.stop()


def test_without_features_the_calls_say_how_to_start_them(world):
    running = Running(Loaded("", "tiny", world["model"], ByteTokenizer()))
    try:
        status, info = running.call("/api/info")
        assert info["features"] is None
        status, r = running.call("/api/features/open", {})
        assert status == 404 and "--features" in r["error"]
    finally:
        running.stop()
