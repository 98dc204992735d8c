"""glassllm.lens.features.browse: each view of a feature against a computation by hand (a
brute-force argmax over the dense activations, W_dec @ W_U sorted, a steered value minus the
clean one)."""
from __future__ import annotations

import numpy as np
import pytest

from glassllm.generate import Sampling, generate
from glassllm.lens.features import browse
from glassllm.lens.interpret import unembedding_matrix
from glassllm.lens.trace import Trace, run_with_cache, run_with_hooks
from glassllm.model import Config, GlassLM

HOOK = "blocks.1.residual_out"


def small_sae(d_in: int, d_sae: int = 48, k: int = 4, hook: str = HOOK, seed: int = 3):
    """A TopK dictionary of random weights (`glassllm.lens.features.SAE`)."""
    from glassllm.lens.features import SAE
    return SAE(d_in, d_sae, kind="topk", hook_name=hook, k=k, seed=seed)


def dense_acts(model, sae, windows):
    """(N, T, d_sae): the dictionary on the traced value, all at once."""
    _, cache = run_with_cache(model, windows, names=[sae.hook_name])
    return np.asarray(sae.encode(cache[sae.hook_name]))


@pytest.fixture(scope="module")
def setup():
    model = GlassLM(Config(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_len=64,
                           vocab_size=80), seed=0)
    sae = small_sae(32)
    windows = np.random.default_rng(1).integers(0, 80, (10, 16))
    return model, sae, windows, browse.scan_features(model, sae, windows, batch=3)


def test_scan_holds_every_nonzero_activation(setup):
    model, sae, windows, scan = setup
    acts = dense_acts(model, sae, windows)
    for f in (0, 5, 17):
        np.testing.assert_allclose(scan.dense(f), acts[..., f], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(scan.density, (acts > 0).mean(axis=(0, 1)))
    np.testing.assert_allclose(scan.max_activation, acts.max(axis=(0, 1)).clip(0), rtol=1e-6)


def test_top_contexts_are_the_brute_force_argmax(setup):
    model, sae, windows, scan = setup
    acts = dense_acts(model, sae, windows)
    f = int(np.argmax((acts > 0).sum(axis=(0, 1))))  # a feature with many contexts
    tops = scan.top_contexts(f, n=5, before=4, after=2)
    flat = acts[..., f].ravel()
    expected = np.argsort(-flat, kind="stable")[:5]
    assert [(t["row"], t["position"]) for t in tops] == \
        [divmod(int(i), windows.shape[1]) for i in expected]
    np.testing.assert_allclose([t["value"] for t in tops], flat[expected], rtol=1e-6)
    first = tops[0]
    r, c = first["row"], first["position"]
    lo = max(0, c - 4)
    assert first["ids"] == windows[r, lo:c + 3].tolist()
    np.testing.assert_allclose(first["activations"], acts[r, lo:c + 3, f], rtol=1e-6, atol=1e-7)
    assert first["activations"][first["at"]] == pytest.approx(first["value"])


def test_histogram_and_token_means_by_hand(setup):
    model, sae, windows, scan = setup
    acts = dense_acts(model, sae, windows)
    f = 7
    v = acts[..., f][acts[..., f] > 0]
    counts, edges = scan.histogram(f, bins=6)
    assert counts.sum() == v.size
    np.testing.assert_allclose(edges[-1], v.max(), rtol=1e-6)
    token = int(windows[0, 3])
    np.testing.assert_allclose(scan.token_means(token), acts[windows == token].mean(axis=0),
                               rtol=1e-5, atol=1e-7)


def test_promoted_tokens_are_w_dec_through_w_u_sorted(setup):
    model, sae, _, _ = setup
    logits = browse.feature_logits(model, sae)
    g = model.final_norm.weight.data.astype(np.float64)
    by_hand = (browse.array(sae.W_dec).astype(np.float64) * g) @ unembedding_matrix(model)
    np.testing.assert_allclose(logits, by_hand, rtol=1e-12)
    up, down = browse.top_logits(logits[3], k=6)
    assert up.tolist() == np.argsort(-by_hand[3], kind="stable")[:6].tolist()
    assert down.tolist() == np.argsort(by_hand[3], kind="stable")[:6].tolist()


def test_an_mlp_hidden_dictionary_writes_through_the_mlp_s_down_projection(setup):
    # down.weight is (F, C), input-major: it was transposed, a matmul error whenever d_ff is
    # not d_model (`features show --feature` on a dictionary of mlp.hidden_post)
    model, _, windows, _ = setup
    d_ff = model.cfg.d_ff
    assert d_ff != model.cfg.d_model
    sae = small_sae(d_ff, hook="blocks.1.mlp.hidden_post")
    down = model.blocks[1].mlp.down.weight.data.astype(np.float64)          # (F, C)
    g = model.final_norm.weight.data.astype(np.float64)
    by_hand = ((browse.array(sae.W_dec).astype(np.float64) @ down) * g) @ \
        unembedding_matrix(model)
    np.testing.assert_allclose(browse.feature_logits(model, sae), by_hand, rtol=1e-12)
    # the same direction the forward writes: steering hidden_post by W_dec[5] moves the
    # residual by W_dec[5] @ down
    _, clean = run_with_cache(model, windows[:1], names=["blocks.1.mlp.output"])
    with Trace(model, names=["blocks.1.mlp.output"],
               hooks=browse.steering_hooks(sae, 5, 1.0)) as tr:
        model(windows[:1])
    moved = tr.cache["blocks.1.mlp.output"] - clean["blocks.1.mlp.output"]
    np.testing.assert_allclose(moved[0, 0], browse.decoder_residual(model, sae)[5], rtol=1e-4,
                               atol=1e-5)


def test_padding_ids_are_never_listed(setup):
    model, sae, _, _ = setup
    row = browse.feature_logits(model, sae)[2].copy()
    row[75], row[76] = 1e9, -1e9  # ids a tokenizer of 70 tokens does not have
    up, down = browse.top_logits(row, k=10, vocab_limit=70)
    assert 75 not in up and 76 not in down and max(up.max(), down.max()) < 70


def test_layer_norm_logit_weights_are_centred():
    model = GlassLM(Config.preset("gpt2", d_model=32, n_layers=2, n_heads=4, max_len=32,
                                  vocab_size=50), seed=0)
    model.final_norm.weight.data[:] = np.linspace(0.5, 1.5, 32, dtype=np.float32)
    sae = small_sae(32)
    w = browse.array(sae.W_dec).astype(np.float64)
    w = w - w.mean(axis=1, keepdims=True)
    by_hand = (w * model.final_norm.weight.data) @ unembedding_matrix(model)
    np.testing.assert_allclose(browse.feature_logits(model, sae), by_hand, rtol=1e-10)


def test_prompt_features_are_the_largest_activations_per_token(setup):
    model, sae, windows, _ = setup
    feats, vals = browse.prompt_features(model, sae, windows[2], k=3)
    acts = dense_acts(model, sae, windows[2:3])[0]
    for t in range(windows.shape[1]):
        expected = np.argsort(-acts[t], kind="stable")[:3]
        on = acts[t, expected] > 0
        assert feats[t][on].tolist() == expected[on].tolist()
        np.testing.assert_allclose(vals[t][on], acts[t, expected][on], rtol=1e-6)
        assert (feats[t][~on] == -1).all()


def test_steering_adds_exactly_alpha_times_the_decoder_row(setup):
    model, sae, windows, _ = setup
    _, clean = run_with_cache(model, windows[:2], names=[HOOK])
    with Trace(model, names=[HOOK], hooks=browse.steering_hooks(sae, 5, 2.5)) as tr:
        model(windows[:2])
    vector = np.float32(2.5) * browse.array(sae.W_dec)[5].astype(np.float32)
    np.testing.assert_array_equal(tr.cache[HOOK], clean[HOOK] + vector)
    assert not np.allclose(run_with_hooks(model, windows[:2], browse.steering_hooks(sae, 5, 2.5)),
                           run_with_hooks(model, windows[:2]))


def test_ablation_removes_the_feature_and_nothing_else(setup):
    model, sae, windows, _ = setup
    acts = dense_acts(model, sae, windows[:1])
    f = int(np.argmax(acts[0, -1]))
    _, clean = run_with_cache(model, windows[:1], names=[HOOK])
    with Trace(model, names=[HOOK], hooks=browse.ablation_hooks(sae, f)) as tr:
        model(windows[:1])
    by_hand = clean[HOOK] - acts[..., f:f + 1] * browse.array(sae.W_dec)[f]
    np.testing.assert_allclose(tr.cache[HOOK], by_hand, rtol=1e-6, atol=1e-6)
    assert acts[0, -1, f] > 0


def test_generation_with_hooks(setup):
    model, sae, windows, _ = setup
    prompt = windows[0, :5].tolist()
    clean = generate(model, prompt, 8, Sampling(temperature=0.0))
    assert browse.generate_with_hooks(model, prompt, 8, browse.steering_hooks(sae, 1, 0.0)) == clean
    loud = browse.generate_with_hooks(model, prompt, 8, browse.steering_hooks(sae, 1, 400.0))
    assert loud != clean
    logits = browse.feature_logits(model, sae)[1]
    assert loud[-1] == int(np.argmax(logits))  # a huge push: its top promoted token wins


def test_transcoder_features_write_at_their_output(setup):
    model, _, windows, _ = setup
    from glassllm.lens.features import Transcoder
    tc = Transcoder(32, 40, 32, kind="topk", k=4, hook_name="blocks.0.mlp.input",
                    out_name="blocks.0.mlp.output", seed=1)
    _, clean = run_with_cache(model, windows[:1], names=["blocks.0.mlp.input",
                                                         "blocks.0.mlp.output"])
    f = int(np.argmax(np.asarray(tc.encode(clean["blocks.0.mlp.input"]))[0, -1]))
    with Trace(model, names=["blocks.0.mlp.output"], hooks=browse.ablation_hooks(tc, f)) as tr:
        model(windows[:1])
    a = np.asarray(tc.encode(clean["blocks.0.mlp.input"]))[..., f:f + 1]
    np.testing.assert_allclose(tr.cache["blocks.0.mlp.output"],
                               clean["blocks.0.mlp.output"] - a * browse.array(tc.W_dec)[f],
                               rtol=1e-6, atol=1e-6)


def test_a_dictionary_of_another_model_is_refused(setup):
    model, _, windows, _ = setup
    with pytest.raises(ValueError, match="width 16"):
        browse.scan_features(model, small_sae(16), windows)
    with pytest.raises(ValueError, match="3 layers|2 layers"):
        browse.scan_features(model, small_sae(32, hook="blocks.5.residual_out"), windows)


def test_a_saelens_dictionary_named_by_its_transformerlens_hook_opens(setup):
    # SAELens saves hook names as TransformerLens spells them: check_fits refused them as
    # "not a value of this model", and evaluate_dictionary failed with a KeyError
    from glassllm.lens.features import evaluate_dictionary
    model, sae, windows, scan = setup
    theirs = small_sae(32, hook="blocks.1.hook_resid_post")
    browse.check_fits(model, theirs)
    assert theirs.hook_name == HOOK
    again = browse.scan_features(model, theirs, windows, batch=3)
    np.testing.assert_array_equal(again.density, scan.density)
    report = evaluate_dictionary(model, small_sae(32, hook="blocks.1.hook_resid_post"),
                                 np.random.default_rng(2).integers(0, 80, 400), tokens=64,
                                 seq_len=16)
    assert report.hook_name == HOOK and report.tokens == 64
    with pytest.raises(ValueError, match="hook_nonsense"):
        browse.check_fits(model, small_sae(32, hook="blocks.1.hook_nonsense"))


def test_a_per_head_dictionary_is_refused_by_the_views_in_one_line(setup):
    # attention.q is (B, T, H, d): scan_features failed with a NumPy broadcast error and
    # `inspect --features` with "The truth value of an array ... is ambiguous"
    model, _, windows, _ = setup
    with pytest.raises(ValueError, match="several rows per token"):
        browse.check_fits(model, small_sae(8, d_sae=16, hook="blocks.1.attention.q"))


def test_corpus_windows_fewer_than_one_window_names_max_tokens(tmp_path):
    # `features show --max-tokens 3` blamed the corpus: "st.txt: 14 tokens, fewer than one
    # window of 64"
    from glassllm.tokenizers import ByteTokenizer
    (tmp_path / "c.txt").write_text("Once upon a time. " * 100)
    with pytest.raises(ValueError, match=r"^max_tokens 3 is fewer than one window of 64"):
        browse.corpus_windows(ByteTokenizer(), tmp_path / "c.txt", 64, 3)
    assert browse.corpus_windows(ByteTokenizer(), tmp_path / "c.txt", 64, 64).shape == (1, 64)


def test_corpus_windows_of_one_token_leave_the_bos_out(tmp_path):
    # a model of max_len 1 with a BOS tokenizer: width seq_len - 1 = 0, a ZeroDivisionError
    # (`features show`, serve's Features view)
    from glassllm.tokenizers import ByteTokenizer

    class WithBos(ByteTokenizer):
        bos_id = 256
    (tmp_path / "c.txt").write_text("abc")
    windows = browse.corpus_windows(WithBos(), tmp_path / "c.txt", 1, 16)
    np.testing.assert_array_equal(windows, [[97], [98], [99]])
    assert browse.corpus_windows(WithBos(), tmp_path / "c.txt", 2, 16).tolist() == \
        [[256, 97], [256, 98], [256, 99]]


def test_corpus_windows_of_a_huge_max_tokens_read_the_whole_file(tmp_path):
    # `features show --max-tokens 99999999999999999999`: read() of 16 x that, an OverflowError
    from glassllm.tokenizers import ByteTokenizer
    (tmp_path / "c.txt").write_text("abcd" * 40)
    windows = browse.corpus_windows(ByteTokenizer(), tmp_path / "c.txt", 16, 10 ** 20)
    assert windows.shape == (10, 16) and bytes(windows.reshape(-1).tolist()) == b"abcd" * 40


@pytest.mark.parametrize("out, d_out, says", [
    ("blocks.1.mlp.output", 16, "writes 'blocks.1.mlp.output' of width 16"),
    ("blocks.1.mlp.hidden_post", 32, "writes 'blocks.1.mlp.hidden_post' of width 32"),
    ("blocks.0.mlp.output", 32, "which the forward computes before it"),
    ("blocks.7.mlp.output", 32, "writes 'blocks.7.mlp.output' but the model has 2 layers")])
def test_a_transcoder_s_output_is_checked_like_its_input(setup, out, d_out, says):
    # only hook_name was checked: a wrong out_name failed later as a NumPy broadcast or
    # matmul error, or (written before it is read) a KeyError traceback from evaluate
    from glassllm.lens.features import Transcoder, evaluate_dictionary
    model, _, windows, _ = setup
    tc = Transcoder(32, 16, d_out, hook_name="blocks.1.mlp.input", out_name=out)
    with pytest.raises(ValueError, match=says):
        browse.check_fits(model, tc)
    with pytest.raises(ValueError, match=says):
        evaluate_dictionary(model, tc, windows.reshape(-1), tokens=16, seq_len=8)


def test_corpus_windows_of_a_text_file(tmp_path):
    from glassllm.tokenizers import ByteTokenizer
    path = tmp_path / "c.txt"
    path.write_text("abcdefghij" * 20)
    w = browse.corpus_windows(ByteTokenizer(), path, seq_len=16, max_tokens=64)
    assert w.shape == (4, 16) and bytes(w[0].tolist()) == b"abcdefghijabcdef"
    with pytest.raises(ValueError, match="fewer than one window"):
        browse.corpus_windows(ByteTokenizer(), path, seq_len=1000)


def test_ignored_tokens_are_left_out_of_the_scan(setup):
    model, sae, windows, scan = setup
    bos = int(windows[0, 0])
    kept = browse.scan_features(model, sae, windows, ignore=(bos,))
    acts = dense_acts(model, sae, windows)
    acts[windows == bos] = 0
    for f in (0, 5):
        np.testing.assert_allclose(kept.dense(f), acts[..., f], rtol=1e-6, atol=1e-7)
    assert kept.tokens == windows.size - int((windows == bos).sum())
    np.testing.assert_allclose(kept.density, (acts > 0).sum(axis=(0, 1)) / kept.tokens)


def test_inspect_report_features_section(setup):
    from glassllm.lens.report import inspect_model, page_data, render_html, summary
    from glassllm.tokenizers import ByteTokenizer
    model, sae, windows, _ = setup
    ids = windows[4] % 70 + 1  # ids the byte tokenizer has; none is ignored
    ins = inspect_model(model, ids, ByteTokenizer(), dictionary=sae)
    data = page_data(ins)["features"]
    feats, values = browse.prompt_features(model, sae, ids, 5)
    assert [[f for f, _ in row] for row in data["per_token"]] == \
        [[int(f) for f in row if f >= 0] for row in feats]
    acts = dense_acts(model, sae, ids[None])[0]
    peak = acts.max(axis=0)
    assert [f["feature"] for f in data["features"] if f["listed"]] == \
        [int(f) for f in np.argsort(-peak, kind="stable")[:12] if peak[f] > 0]
    given = {f["feature"] for f in data["features"]}
    assert {f for row in data["per_token"] for f, _ in row} <= given
    first = data["features"][0]
    np.testing.assert_allclose(first["activations"], acts[:, first["feature"]], atol=1e-4)
    assert f"#{first['feature']}: max" in summary(ins)
    assert 'id="view-features"' in render_html(ins)
    assert page_data(inspect_model(model, ids, ByteTokenizer()))["features"] is None
