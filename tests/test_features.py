"""Sparse dictionaries (glassllm.lens.features): the activations and each architecture's loss
against float64 central differences and a torch twin written from the papers; the SAELens
format both ways with SAELens itself; the loss-recovered splice against a hand computation;
training on stories260K with a checkpoint resumed; the decoder constraint and the L1 weighting
held by tests that a planted fault breaks."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import shared_data_path, skip_or_fail
from glassllm import Tensor
from glassllm.lens.features import (SAE, Transcoder, evaluate_dictionary, load_saelens,
                                    save_saelens, train_dictionary)
from glassllm.lens.features import ops
from glassllm.lens.features.evaluate import mean_cross_entropy

rng = np.random.default_rng(0)
EPS = 0.3  # a wide kernel, so that some pre-activations fall inside it


def torch_module():
    try:
        import torch
    except ImportError:
        skip_or_fail("torch is not installed (pip install -e '.[test]')")
    return torch


# --------------------------------------------------------------------------- the activations
def test_relu_and_topk_gradients_match_central_differences(gradcheck):
    z = rng.standard_normal((4, 9))
    gradcheck(ops.relu, z)
    gradcheck(lambda t: ops.topk_relu(t, 3), z)
    gradcheck(lambda t: ops.jumprelu(t, Tensor(np.full(9, 0.2)), EPS), z)  # d/dz only


def test_topk_keeps_the_k_largest_positive_entries():
    z = np.array([[3.0, -1.0, 2.0, 5.0, 0.5], [-3.0, -2.0, -1.0, 0.1, -5.0]])
    y = ops.topk_relu(Tensor(z), 2).data
    np.testing.assert_array_equal(y, [[3.0, 0, 0, 5.0, 0], [0, 0, 0, 0.1, 0]])


def test_jumprelu_threshold_pseudo_gradient_is_the_rectangle_kernel():
    # Rajamanoharan et al. 2024 eq. 11-12 by hand: only z within eps/2 of theta count
    z = np.array([[0.5, 0.9, 1.2, 2.0]])
    theta = Tensor(np.full(4, 1.0), requires_grad=True)
    ops.jumprelu(Tensor(z), theta, 0.5).sum().backward()
    np.testing.assert_allclose(theta.grad, [0.0, -2.0, -2.0, 0.0])
    theta.grad = None
    ops.step(Tensor(z), theta, 0.5).sum().backward()
    np.testing.assert_allclose(theta.grad, [0.0, -2.0, -2.0, 0.0])


def torch_loss(torch, kind, params, x, dead=None, coef=0.7, k=3, eps=EPS, aux_k=2):
    """The loss of each architecture, in torch, from the papers (not glassllm's code)."""
    W_enc, b_enc, W_dec, b_dec = params[:4]
    pi = (x - b_dec) @ W_enc + b_enc
    if kind == "relu":
        f = torch.relu(pi)
    elif kind == "topk":
        values, index = pi.topk(k, dim=-1)
        f = torch.zeros_like(pi).scatter(-1, index, torch.relu(values))
    else:
        theta = params[4]

        class Jump(torch.autograd.Function):  # straight-through estimator, rectangle kernel
            @staticmethod
            def forward(ctx, z, t, heaviside):
                ctx.save_for_backward(z, t)
                ctx.heaviside = heaviside
                on = ((z > t) & (z > 0)).to(z.dtype)
                return (z > t).to(z.dtype) if heaviside else z * on

            @staticmethod
            def backward(ctx, g):
                z, t = ctx.saved_tensors
                kernel = (((z - t) / eps).abs() < 0.5).to(z.dtype) / eps
                if ctx.heaviside:
                    return None, (-kernel * g).sum(0), None
                return g * ((z > t) & (z > 0)).to(z.dtype), (-t * kernel * g).sum(0), None
        f = Jump.apply(pi, theta, False)
    x_hat = f @ W_dec + b_dec
    mse = ((x - x_hat) ** 2).sum(-1).mean()
    if kind == "relu":
        return mse + coef * (f * W_dec.norm(dim=-1)).sum(-1).mean()
    if kind == "jumprelu":
        return mse + coef * Jump.apply(pi, theta, True).sum(-1).mean()
    e = (x - x_hat).detach()
    masked = pi.masked_fill(~torch.tensor(dead), float("-inf"))
    values, index = masked.topk(aux_k, dim=-1)
    z_aux = torch.zeros_like(pi).scatter(-1, index, torch.relu(values))
    return mse + (1 / 32) * ((e - z_aux @ W_dec) ** 2).sum(-1).mean()


def _sae(kind):
    sae = SAE(5, 8, kind=kind, hook_name="blocks.0.residual_out", k=3 if kind == "topk" else None,
              seed=1, l1_coefficient=0.7, l0_coefficient=0.7, bandwidth=EPS, threshold=0.2,
              aux_k=2, dtype=np.float64)
    for p in sae.parameters():
        p.data[...] += 0.1 * rng.standard_normal(p.shape)
    return sae


@pytest.mark.parametrize("kind", ["relu", "topk", "jumprelu"])
def test_each_architecture_loss_and_gradients_equal_a_torch_twin(kind):
    torch = torch_module()
    sae, x = _sae(kind), rng.standard_normal((6, 5))
    dead = np.arange(8) % 2 == 0
    loss, _, _ = sae.loss(Tensor(x), dead=dead)
    loss.backward()
    leaves = [torch.tensor(p.data, requires_grad=True) for p in sae.parameters()]
    expected = torch_loss(torch, kind, leaves, torch.tensor(x), dead=dead)
    expected.backward()
    np.testing.assert_allclose(loss.item(), expected.item(), rtol=1e-10)
    for (name, p), leaf in zip(sae.named_parameters(), leaves):
        np.testing.assert_allclose(p.grad, leaf.grad.numpy(), rtol=1e-9, atol=1e-12,
                                   err_msg=name)


@pytest.mark.parametrize("kind", ["relu", "topk"])
def test_the_loss_gradients_match_central_differences(kind, gradcheck):
    # without AuxK: its error term is a constant (detached, Gao et al. 2024), which central
    # differences cannot know; the torch twin above checks it
    sae, x = _sae(kind), rng.standard_normal((4, 5))
    dead = None

    def loss(W_enc, b_enc, W_dec, b_dec):
        sae.W_enc, sae.b_enc, sae.W_dec, sae.b_dec = W_enc, b_enc, W_dec, b_dec
        return sae.loss(Tensor(x), dead=dead)[0]
    gradcheck(loss, *[p.data.copy() for p in sae.parameters()])


def test_the_l1_penalty_is_weighted_by_decoder_norms():
    # Anthropic's April 2024 update: scaling a feature's decoder row by c and its encoder
    # column by 1/c changes neither the reconstruction nor the loss
    sae, x = _sae("relu"), Tensor(rng.standard_normal((6, 5)))
    before = sae.loss(x)[0].item()
    c = np.array([3.0, 0.5, 1, 1, 2, 1, 1, 1])
    sae.W_dec.data *= c[:, None]
    sae.W_enc.data /= c
    sae.b_enc.data /= c
    np.testing.assert_allclose(sae.loss(x)[0].item(), before, rtol=1e-12)


def test_training_keeps_topk_decoder_rows_at_unit_norm():
    from glassllm.lens.features.train import update
    from glassllm.optim import AdamW
    sae = SAE(5, 8, kind="topk", k=2, hook_name="blocks.0.residual_out")
    opt = AdamW(sae.parameters(), lr=0.05, weight_decay=0.0)
    for _ in range(5):
        update(sae, opt, rng.standard_normal((16, 5)).astype(np.float32) * 4, None, 0.05,
               np.zeros(8, bool))
    np.testing.assert_allclose(np.linalg.norm(sae.W_dec.data, axis=-1), 1.0, rtol=1e-5)


# --------------------------------------------------------------------------- SAELens
def _saelens():
    try:
        import sae_lens
    except ImportError:
        skip_or_fail("sae-lens is not installed (pip install -e '.[test]')")
    return sae_lens


DICTS = {"standard": lambda: SAE(6, 16, kind="relu", hook_name="blocks.1.residual_out"),
         "topk": lambda: SAE(6, 16, kind="topk", k=4, hook_name="blocks.1.residual_out"),
         "jumprelu": lambda: SAE(6, 16, kind="jumprelu", hook_name="blocks.1.residual_out"),
         "transcoder": lambda: Transcoder(6, 16, 4, hook_name="blocks.0.mlp.input",
                                          out_name="blocks.0.mlp.output"),
         "jumprelu_transcoder": lambda: Transcoder(6, 16, 4, kind="jumprelu",
                                                   hook_name="blocks.0.mlp.input",
                                                   out_name="blocks.0.mlp.output")}


def _random_weights(sae):
    for p in sae.parameters():
        p.data = rng.standard_normal(p.shape).astype(np.float32) * 0.5
    if sae.kind == "jumprelu":
        sae.threshold.data = np.abs(sae.threshold.data)


def _close(a, b):
    assert np.max(np.abs(a - b)) <= 1e-5 * max(np.max(np.abs(b)), 1e-6)


@pytest.mark.parametrize("arch", sorted(DICTS))
def test_a_glassllm_dictionary_opens_in_saelens_with_equal_encode_decode(arch, tmp_path):
    torch = torch_module()
    sae_lens = _saelens()
    sae = DICTS[arch]()
    _random_weights(sae)
    save_saelens(sae, tmp_path / "d")
    theirs = sae_lens.SAE.load_from_disk(str(tmp_path / "d"))
    assert theirs.cfg.architecture() == arch
    x = rng.standard_normal((7, 6)).astype(np.float32)
    with torch.no_grad():
        f = theirs.encode(torch.tensor(x)).numpy()
        _close(sae.encode(x), f)
        _close(sae.decode(f), theirs.decode(torch.tensor(f)).numpy())
    _close(load_saelens(tmp_path / "d").encode(x), f)


@pytest.mark.parametrize("arch", sorted(DICTS))
def test_a_saelens_dictionary_opens_in_glassllm_with_equal_encode_decode(arch, tmp_path):
    torch = torch_module()
    sae_lens = _saelens()
    from sae_lens.registry import get_sae_class
    cls, cfg_cls = get_sae_class(arch)
    options = dict(d_in=6, d_sae=16)
    options.update({"k": 4} if arch == "topk" else {})
    options.update({"d_out": 4, "apply_b_dec_to_input": False} if "transcoder" in arch else {})
    theirs = cls(cfg_cls(**options))
    with torch.no_grad():
        for p in theirs.parameters():
            p.copy_(torch.randn(p.shape) * 0.5)
        if hasattr(theirs, "threshold"):
            theirs.threshold.abs_()
    theirs.save_model(str(tmp_path / "d"))
    ours = load_saelens(tmp_path / "d")
    assert ours.kind == {"standard": "relu", "transcoder": "relu"}.get(arch, arch.split("_")[0])
    x = rng.standard_normal((7, 6)).astype(np.float32)
    with torch.no_grad():
        f = theirs.encode(torch.tensor(x)).numpy()
        _close(ours.encode(x), f)
        _close(ours.decode(f), theirs.decode(torch.tensor(f)).numpy())
    del sae_lens


def test_a_field_that_changes_the_arithmetic_is_refused_by_name(tmp_path):
    import json
    save_saelens(DICTS["standard"](), tmp_path)
    cfg = json.loads((tmp_path / "cfg.json").read_text())
    cfg["normalize_activations"] = "expected_average_only_in"
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="'normalize_activations'"):
        load_saelens(tmp_path)


@pytest.mark.parametrize("edit, field", [
    (lambda c: c.__setitem__("metadata", [1]), "'metadata'"),
    (lambda c: c.__setitem__("metadata", "abc"), "'metadata'"),
    (lambda c: c["metadata"].__setitem__("glassllm", [1]), "'metadata.glassllm'"),
    (lambda c: c["metadata"]["glassllm"].__setitem__("l1_coefficient", "x"),
     "'metadata.glassllm.l1_coefficient'"),
    (lambda c: c["metadata"].__setitem__("hook_name", 5), "'hook_name'"),
    (lambda c: c.__setitem__("architecture", []), "'architecture'"),
    (lambda c: c.__setitem__("apply_b_dec_to_input", "false"), "'apply_b_dec_to_input'")])
def test_a_hand_edited_cfg_json_of_the_wrong_json_type_is_one_line_naming_the_field(
        edit, field, tmp_path):
    # each of these was an AttributeError or TypeError (a traceback from the command line),
    # or "false" read as true
    import json
    save_saelens(DICTS["standard"](), tmp_path)
    cfg = json.loads((tmp_path / "cfg.json").read_text())
    edit(cfg)
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=field) as info:
        load_saelens(tmp_path)
    assert "cfg.json" in str(info.value) and "\n" not in str(info.value)


def test_sizes_of_a_damaged_cfg_json_are_checked_against_the_weights_before_building(
        tmp_path):
    # d_sae 1e12 in cfg.json tried to allocate the dictionary first (a MemoryError, or the
    # machine's memory); k > d_sae was said without naming the file
    import json
    save_saelens(DICTS["topk"](), tmp_path)
    cfg = json.loads((tmp_path / "cfg.json").read_text())
    (tmp_path / "cfg.json").write_text(json.dumps({**cfg, "d_sae": 10 ** 12}))
    with pytest.raises(ValueError, match=r"sae_weights.safetensors: tensor 'W_enc' has shape "
                                         r"\(6, 16\); cfg.json's sizes give \(6, 1000000000000\)"):
        load_saelens(tmp_path)
    (tmp_path / "cfg.json").write_text(json.dumps({**cfg, "k": 99}))
    with pytest.raises(ValueError, match=r"cfg.json: SAE: kind 'topk' needs k in 1..d_sae=16"):
        load_saelens(tmp_path)


def test_sizes_are_integers_and_numpy_integers_are_saved_as_json(tmp_path):
    # k=2.5 and k=True were accepted (and failed later); NumPy integers made save_saelens a
    # TypeError ("Object of type int64 is not JSON serializable")
    for k in (2.5, True):
        with pytest.raises(ValueError, match="needs k in 1..d_sae"):
            SAE(8, 4, kind="topk", k=k, hook_name="x")
    with pytest.raises(ValueError, match="sizes must be positive integers"):
        SAE(8, 2.0, kind="relu", hook_name="x")
    sae = SAE(np.int64(8), np.int64(4), kind="topk", k=np.int64(2), aux_k=np.int64(3),
              hook_name="x")
    save_saelens(sae, tmp_path)
    back = load_saelens(tmp_path)
    assert (back.k, back.aux_k, back.d_sae) == (2, 3, 4) and type(back.k) is int


# --------------------------------------------------------------------------- on a model
@pytest.fixture(scope="module")
def stories():
    from glassllm.formats.llama2c import from_llama2c
    model = from_llama2c(shared_data_path("llama2c", "stories260K.bin"))
    from glassllm.generate import Sampling, generate
    ids = [1]
    for seed in range(4):
        ids += generate(model, [1], 160, Sampling(temperature=1.0), rng=seed) + [1]
    return model, np.array(ids)


def test_loss_recovered_equals_a_hand_computation(stories):
    from glassllm.lens.trace import run_with_cache
    model, ids = stories
    sae = SAE(64, 128, kind="topk", k=8, hook_name="blocks.2.residual_out", seed=3)
    report = evaluate_dictionary(model, sae, ids, tokens=64, seq_len=64, batch_windows=1, seed=5)
    begin = np.random.default_rng(5).integers(0, len(ids) - 64, size=1)[0]
    window = ids[begin:begin + 65][None]
    x_in, y = window[:, :-1], window[:, 1:]

    def loss_with(replacement):
        # the model run layer by layer by hand: blocks 0-2, the value replaced, blocks 3-4
        logits, cache = run_with_cache(model, x_in, names=["blocks.2.residual_out"])
        edited = replacement(cache["blocks.2.residual_out"])
        from glassllm.lens.trace import run_with_hooks
        out = run_with_hooks(model, x_in, [("blocks.2.residual_out", lambda v, n: edited)])
        return mean_cross_entropy(out, y), mean_cross_entropy(logits, y)
    spliced, clean = loss_with(lambda v: sae.decode(sae.encode(v)).astype(np.float32))
    zero, _ = loss_with(np.zeros_like)
    np.testing.assert_allclose([report.ce_clean, report.ce_spliced, report.ce_zero],
                               [clean, spliced, zero], rtol=1e-6)
    np.testing.assert_allclose(report.loss_recovered, (zero - spliced) / (zero - clean),
                               rtol=1e-6)
    assert report.tokens == 64 and report.l0 <= 8


def test_training_improves_the_dictionary_and_resumes_from_its_checkpoint(stories, tmp_path):
    model, ids = stories
    events = []
    options = dict(kind="topk", d_sae=128, k=8, batch_size=256, seq_len=32, buffer_tokens=1024,
                   checkpoint_every=10, on_event=events.append)
    first = train_dictionary(model, ids, "blocks.2.residual_out", steps=10, out=tmp_path, **options)
    steps = [e for e in events if type(e).__name__ == "DictionaryStep"]
    assert steps[-1].fvu < steps[0].fvu
    assert (tmp_path / "training.npz").exists() and (tmp_path / "cfg.json").exists()
    events.clear()
    again = train_dictionary(model, ids, "blocks.2.residual_out", steps=15, out=tmp_path,
                             **options)
    assert type(events[0]).__name__ == "DictionaryResumed" and events[0].step == 10
    assert [e.step for e in events if type(e).__name__ == "DictionaryStep"] == list(range(10, 15))
    assert not np.array_equal(first.W_dec.data, again.W_dec.data)
    with pytest.raises(ValueError, match="d_sae = 128, not 64"):
        train_dictionary(model, ids, "blocks.2.residual_out", steps=15, out=tmp_path,
                         **{**options, "d_sae": 64})


def test_cli_features_train_writes_a_saelens_directory_and_errors_in_one_line(stories, tmp_path,
                                                                               capsys):
    from glassllm.cli import main
    model, ids = stories
    np.save(tmp_path / "ids.npy", ids)
    from glassllm.formats.lm import read_tokenizer
    from glassllm.formats.token_file import TokenWriter
    writer = TokenWriter(tmp_path / "corpus.tokens",
                         read_tokenizer(str(shared_data_path("llama2c", "tok512.bin"))))
    writer.append(ids.astype(np.uint16))
    writer.close()
    base = ["features", "train", "--model", str(shared_data_path("llama2c", "stories260K.bin")),
            "--data", str(tmp_path / "corpus.tokens"), "--kind", "topk", "--d-sae", "128",
            "--k", "8", "--steps", "3", "--batch-size", "256", "--out", str(tmp_path / "d")]
    assert main(base + ["--name", "blocks.1.residual_out"]) == 0
    out = capsys.readouterr().out
    assert "loss recovered" in out
    assert f"evaluated on the last 10% of {tmp_path / 'corpus.tokens'}" in out
    assert load_saelens(tmp_path / "d").hook_name == "blocks.1.residual_out"
    assert (tmp_path / "d" / "evaluation.json").exists()
    assert main(base + ["--name", "blocks.9.residual_out", "--out", str(tmp_path / "e")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("glassllm features train: error:") and "blocks.9.residual_out" in err


@pytest.mark.parametrize("options, message", [
    (dict(hook_name="blocks.2.residual_out", lr=float("nan")), "lr must be a positive finite"),
    (dict(hook_name="blocks.2.residual_out", lr=-1.0), "lr must be a positive finite"),
    (dict(hook_name="blocks.2.attention.pattern"), "last axis is the key position"),
    (dict(hook_name="blocks.2.attention.scores"), "last axis is the key position"),
    (dict(hook_name="blocks.2.mlp.input", out_name="blocks.2.mlp.output"),
     "no topk transcoder")])
def test_train_dictionary_refuses_what_it_cannot_train_or_save_before_training(
        stories, tmp_path, options, message):
    # a NaN lr saved a NaN dictionary; a pattern failed with a NumPy broadcast message after
    # the model ran; a TopK transcoder trained first and failed when saving
    model, ids = stories
    events = []
    with pytest.raises(ValueError, match=message):
        train_dictionary(model, ids, kind="topk", d_sae=8, k=2, steps=3, batch_size=64,
                         seq_len=16, out=tmp_path / "d", on_event=events.append, **options)
    assert events == [] and not (tmp_path / "d").exists()


def test_a_per_head_dictionary_reports_cross_entropy_per_token_not_per_row(stories):
    # blocks.i.attention.q has n_heads rows per token: the clean loss was divided by 8 rows
    model, ids = stories
    options = dict(tokens=64, seq_len=64, batch_windows=1, seed=5)
    per_head = SAE(8, 16, kind="topk", k=2, hook_name="blocks.2.attention.q", seed=0)
    residual = SAE(64, 16, kind="topk", k=2, hook_name="blocks.2.residual_out", seed=0)
    a = evaluate_dictionary(model, per_head, ids, **options)
    b = evaluate_dictionary(model, residual, ids, **options)
    np.testing.assert_allclose(a.ce_clean, b.ce_clean, rtol=1e-6)
    assert 1.0 < a.ce_clean < 4.0 and a.tokens == 8 * 64


def test_cli_features_train_says_a_negative_size_must_be_at_least_one(capsys):
    from glassllm.cli import main
    with pytest.raises(SystemExit) as info:
        main(["features", "train", "--model", "m", "--data", "d", "--name", "n",
              "--d-sae", "-5", "--steps", "1", "--out", "o"])
    assert info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        "argument --d-sae: must be an integer >= 1, got -5")


def test_cli_features_train_refuses_an_out_another_run_is_writing(tmp_path, capsys):
    # two runs on one --out both wrote it: the weights of one beside the other's evaluation
    import os
    import subprocess
    import sys
    import textwrap
    import time
    from glassllm.cli import main
    (tmp_path / "corpus.txt").write_text("Once upon a time there was a cat. " * 20)
    ready, out = tmp_path / "ready", tmp_path / "d"
    code = textwrap.dedent(f"""
        import time
        from glassllm.training.lock import lock_outputs
        with lock_outputs([{str(out)!r}]):
            open({str(ready)!r}, "w").close()
            time.sleep(600)
    """)
    holder = subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ))
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert holder.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        code = main(["features", "train", "--model",
                     str(shared_data_path("llama2c", "stories260K.bin")), "--data",
                     str(tmp_path / "corpus.txt"), "--name", "blocks.1.residual_out", "--d-sae",
                     "16", "--k", "2", "--steps", "2", "--out", str(out)])
    finally:
        holder.kill()
        holder.wait()
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "in use by another glassllm run" in err[0]
    assert f"pid {holder.pid}" in err[0] and not out.exists()


def test_cli_features_train_stopped_before_a_checkpoint_says_none_is_kept(tmp_path, capsys,
                                                                          monkeypatch):
    # Ctrl-C while the first activations were read printed "checkpoint kept in DIR"; none was
    from glassllm.cli import main
    from glassllm.formats import files
    from glassllm.lens.features import train as train_module
    files.save(GlassLM_tiny(), tmp_path / "m.safetensors")
    (tmp_path / "corpus.txt").write_text("Once upon a time there was a cat. " * 20)

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(train_module, "train_dictionary", stopped)
    code = main(["features", "train", "--model", str(tmp_path / "m.safetensors"), "--data",
                 str(tmp_path / "corpus.txt"), "--tokenizer", "byte", "--name",
                 "blocks.0.residual_out", "--d-sae", "16", "--k", "2", "--steps", "2", "--out",
                 str(tmp_path / "d")])
    captured = capsys.readouterr()
    assert code == 130 and "checkpoint kept" not in captured.out
    assert not (tmp_path / "d").exists() and not (tmp_path / "d.lock").exists()


def test_cli_features_train_error_before_the_first_step_is_the_only_line(tmp_path, capsys):
    # the progress bar was drawn before the corpus was read: "0%| 0/2" above the error
    from glassllm.cli import main
    from glassllm.formats import files
    files.save(GlassLM_tiny(), tmp_path / "m.safetensors")
    (tmp_path / "one.txt").write_text("a")
    code = main(["features", "train", "--model", str(tmp_path / "m.safetensors"), "--tokenizer",
                 "byte", "--data", str(tmp_path / "one.txt"), "--name", "blocks.0.residual_out",
                 "--d-sae", "16", "--k", "2", "--steps", "2", "--out", str(tmp_path / "d")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == [f"glassllm features train: error: {tmp_path / 'one.txt'}: the "
                                 f"corpus holds 1 token(s); windows need at least 2"]


@pytest.mark.parametrize("damage, says", [
    (lambda z, path: path.write_bytes(path.read_bytes()[:100]), "not a readable training state"),
    (lambda z, path: z.pop("adam_t"), "entry 'adam_t' is missing"),
    (lambda z, path: z.__setitem__("m.W_enc", np.zeros((3, 3))), "entry 'm.W_enc' has shape"),
    (lambda z, path: z.__setitem__("settings", np.asarray("[1]")), "'settings' is missing or"),
    (lambda z, path: z.__setitem__("settings", np.asarray("{")), "'settings' is missing or"),
    (lambda z, path: z.__setitem__("since_fired", np.zeros(3)), "'since_fired' has shape"),
    (lambda z, path: z.__setitem__("m.W_enc", z["m.W_enc"] * np.nan), "'m.W_enc' holds"),
    (lambda z, path: z.__setitem__("step", np.int64(-5)), "'step' holds")])
def test_a_damaged_training_state_is_one_line_and_the_checkpoint_is_kept(damage, says, tmp_path):
    # these were a BadZipFile/KeyError/AttributeError/IndexError traceback, a NumPy message
    # naming no file, or (NaN moments) a NaN dictionary trained and saved over the checkpoint
    model, ids = GlassLM_tiny(), np.arange(400) % 260
    options = dict(kind="topk", d_sae=16, k=2, batch_size=32, seq_len=16, buffer_tokens=64)
    train_dictionary(model, ids, "blocks.0.residual_out", steps=2, out=tmp_path, **options)
    path = tmp_path / "training.npz"
    with np.load(path) as npz:
        z = {key: npz[key] for key in npz.files}
    damage(z, path)
    if "readable" not in says:  # the truncation damaged the file itself
        np.savez(path, **z)
    weights = (tmp_path / "sae_weights.safetensors").read_bytes()
    with pytest.raises(ValueError, match=says) as info:
        train_dictionary(model, ids, "blocks.0.residual_out", steps=4, out=tmp_path, **options)
    assert str(info.value).startswith(str(path)) and "\n" not in str(info.value)
    assert (tmp_path / "sae_weights.safetensors").read_bytes() == weights


def test_an_out_that_is_a_file_is_refused_before_training(tmp_path):
    # training ran to the end, then failed to save: "st.txt: File exists"
    (tmp_path / "f.txt").write_text("x")
    events = []
    for out, says in ((tmp_path / "f.txt", "f.txt: is a file"),
                      (tmp_path / "f.txt" / "d", "is inside .*f.txt, which is a file")):
        with pytest.raises(ValueError, match=says):
            train_dictionary(GlassLM_tiny(), np.arange(400) % 260, "blocks.0.residual_out",
                             d_sae=16, k=2, steps=2, batch_size=32, out=out,
                             on_event=events.append)
    assert events == [] and (tmp_path / "f.txt").read_text() == "x"
    with pytest.raises(ValueError, match="out is an empty path"):  # was ": No such file"
        train_dictionary(GlassLM_tiny(), np.arange(400) % 260, "blocks.0.residual_out",
                         d_sae=16, k=2, steps=2, batch_size=32, out="", on_event=events.append)
    assert events == []


def test_a_prepare_directory_trains_on_train_bin_and_evaluates_on_val_bin(tmp_path):
    # features train --data DIR said "DIR: no such corpus file" (features show reads one)
    from glassllm.formats.token_file import TokenWriter
    from glassllm.lens.features.train import corpus_ids
    from glassllm.tokenizers import ByteTokenizer
    (tmp_path / "prep").mkdir()
    for split, ids in (("train", np.arange(300) % 200), ("val", np.arange(100, 160))):
        writer = TokenWriter(tmp_path / "prep" / f"{split}.bin", ByteTokenizer())
        writer.append(ids.astype(np.uint16))
        writer.close()
    np.testing.assert_array_equal(corpus_ids(tmp_path / "prep"), np.arange(300) % 200)
    np.testing.assert_array_equal(corpus_ids(tmp_path / "prep", split="val"),
                                  np.arange(100, 160))
    sae = train_dictionary(GlassLM_tiny(), tmp_path / "prep", "blocks.0.residual_out",
                           d_sae=16, k=2, steps=2, batch_size=32, seq_len=16)
    report = evaluate_dictionary(GlassLM_tiny(), sae, tmp_path / "prep", tokens=32, seq_len=16)
    assert report.tokens == 32
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="empty: a directory without train.bin"):
        corpus_ids(tmp_path / "empty")


def test_one_corpus_is_split_so_the_evaluation_reads_text_never_trained_on(tmp_path):
    # features train evaluated the dictionary on the very text it was trained on
    from glassllm.lens.features.train import train_and_evaluation_corpora
    ids = np.arange(1000) % 250
    train_ids, eval_ids, words = train_and_evaluation_corpora(GlassLM_tiny(), ids)
    np.testing.assert_array_equal(train_ids, ids[:900])
    np.testing.assert_array_equal(eval_ids, ids[900:])
    assert words.startswith("the last 10% of the corpus (100 tokens")
    other = np.arange(50) % 7
    train_ids, eval_ids, words = train_and_evaluation_corpora(GlassLM_tiny(), ids,
                                                              eval_data=other)
    np.testing.assert_array_equal(train_ids, ids)  # a separate evaluation: trained on whole
    np.testing.assert_array_equal(eval_ids, other)
    with pytest.raises(ValueError, match="19 tokens are too few to hold out a tenth"):
        train_and_evaluation_corpora(GlassLM_tiny(), np.arange(19))


def test_cli_features_train_takes_an_evaluation_corpus(tmp_path, capsys):
    from glassllm.cli import main
    from glassllm.formats import files
    files.save(GlassLM_tiny(), tmp_path / "m.safetensors")
    (tmp_path / "train.txt").write_text("Once upon a time there was a cat. " * 20)
    (tmp_path / "eval.txt").write_text("The dog ran home. " * 10)
    code = main(["features", "train", "--model", str(tmp_path / "m.safetensors"), "--tokenizer",
                 "byte", "--data", str(tmp_path / "train.txt"), "--eval-data",
                 str(tmp_path / "eval.txt"), "--name", "blocks.0.residual_out", "--d-sae", "16",
                 "--k", "2", "--steps", "2", "--batch-size", "32", "--out", str(tmp_path / "d")])
    assert code == 0
    assert f"evaluated on {tmp_path / 'eval.txt'} (held out)" in capsys.readouterr().out


@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")  # the divergence itself
@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
@pytest.mark.parametrize("kind", ["relu", "topk"])
def test_a_diverging_dictionary_stops_and_keeps_the_last_checkpoint(kind, tmp_path):
    # lr 1e30 trained NaN weights and saved them (which load_saelens then refuses), over the
    # checkpoint a resumed run had
    model, ids = GlassLM_tiny(), np.arange(400) % 260
    options = dict(kind=kind, d_sae=16, k=2 if kind == "topk" else None, batch_size=32,
                   seq_len=16, buffer_tokens=64)
    train_dictionary(model, ids, "blocks.0.residual_out", steps=2, out=tmp_path, **options)
    files = {f: (tmp_path / f).read_bytes() for f in ("sae_weights.safetensors",
                                                       "training.npz", "cfg.json")}
    with pytest.raises(ValueError, match=r"diverged at step \d+ .* too high\?\); .* keeps"):
        train_dictionary(model, ids, "blocks.0.residual_out", steps=30, out=tmp_path,
                         lr=1e30, **options)
    assert {f: (tmp_path / f).read_bytes() for f in files} == files
    assert np.isfinite(load_saelens(tmp_path).W_enc.data).all()


def test_a_corpus_of_another_tokenizer_is_refused_naming_it(tmp_path):
    # "idx: token id 1402 at position (0, 2) is outside [0, 512)", naming no file, from the
    # model's forward (features train, features show, serve's Features view)
    from glassllm.formats.token_file import TokenWriter
    from glassllm.tokenizers import ByteTokenizer
    from glassllm.lens.features import browse

    class Wide(ByteTokenizer):
        vocab_size = 1000
    (tmp_path / "prep").mkdir()
    for split in ("train", "val"):
        writer = TokenWriter(tmp_path / "prep" / f"{split}.bin", Wide())
        writer.append((np.arange(300) * 3).astype(np.uint16))
        writer.close()
    with pytest.raises(ValueError, match=r"prep: token id 897 is outside the model's "
                                         r"vocabulary \[0, 260\)"):
        train_dictionary(GlassLM_tiny(), tmp_path / "prep", "blocks.0.residual_out",
                         d_sae=16, k=2, steps=2, batch_size=32)
    from glassllm.lens.features.train import train_and_evaluation_corpora
    with pytest.raises(ValueError, match="prep: token id 897 is outside the model's"):
        train_and_evaluation_corpora(GlassLM_tiny(), tmp_path / "prep")  # features train's
    sae = SAE(16, 16, kind="topk", k=2, hook_name="blocks.0.residual_out")
    with pytest.raises(ValueError, match="prep: token id 897 is outside the model's"):
        evaluate_dictionary(GlassLM_tiny(), sae, tmp_path / "prep")
    with pytest.raises(ValueError, match=r"val.bin: token id \d+ is outside the tokenizer's 257"):
        browse.corpus_windows(ByteTokenizer(), tmp_path / "prep", 16, 1000)


def test_a_second_ctrl_c_while_the_checkpoint_is_written_waits_for_it(tmp_path, monkeypatch):
    # the first Ctrl-C writes a checkpoint; a second one during it left the weights without
    # training.npz, and the same command then refused the directory ("nothing to resume")
    import signal
    from glassllm.lens.features import saelens
    from glassllm.lens.features.train import DictionaryCheckpointed, DictionaryStep
    save = saelens.save_saelens

    def save_then_ctrl_c(*args, **kwargs):
        path = save(*args, **kwargs)
        signal.raise_signal(signal.SIGINT)  # the second Ctrl-C, between the files
        return path
    monkeypatch.setattr(saelens, "save_saelens", save_then_ctrl_c)
    events = []

    def first_ctrl_c(event):
        events.append(event)
        if isinstance(event, DictionaryStep) and event.step == 1:
            raise KeyboardInterrupt
    model, ids = GlassLM_tiny(), np.arange(400) % 260
    options = dict(kind="topk", d_sae=16, k=2, batch_size=32, seq_len=16, buffer_tokens=64)
    with pytest.raises(KeyboardInterrupt):
        train_dictionary(model, ids, "blocks.0.residual_out", steps=50, out=tmp_path,
                         on_event=first_ctrl_c, **options)
    assert isinstance(events[-1], DictionaryCheckpointed) and events[-1].step == 2
    monkeypatch.setattr(saelens, "save_saelens", save)
    events.clear()
    train_dictionary(model, ids, "blocks.0.residual_out", steps=3, out=tmp_path,
                     on_event=events.append, **options)
    assert type(events[0]).__name__ == "DictionaryResumed" and events[0].step == 2


def GlassLM_tiny():
    from glassllm import Config, GlassLM
    return GlassLM(Config(vocab_size=260, d_model=16, n_layers=1, n_heads=2, max_len=32), seed=0)


@pytest.mark.slow
def test_stories260k_topk_dictionary_meets_the_field_targets():
    """examples/features_stories260k.py's run, smaller: d_sae 512 (8 x d_model), k 16, on the
    middle residual; measured 2026-12-05 at 2500 steps (176 s): FVU 0.065, loss recovered 97.5%,
    dead 0%."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    from features_stories260k import sample_corpus
    from glassllm.formats.llama2c import from_llama2c
    model = from_llama2c(shared_data_path("llama2c", "stories260K.bin"))
    sae = train_dictionary(model, sample_corpus(model, 200_000, seed=0), "blocks.2.residual_out",
                           kind="topk", d_sae=512, k=16, steps=1000)
    report = evaluate_dictionary(model, sae, sample_corpus(model, 20_000, seed=1))
    assert report.fvu <= 0.15 and report.loss_recovered >= 0.85
    assert report.dead_fraction <= 0.10


@pytest.mark.parametrize("argv, flag", [
    (["features", "train", "--model", "m", "--data", "", "--name", "n", "--d-sae", "4", "--k",
      "1", "--steps", "1", "--out", "o"], "--data"),
    (["features", "train", "--model", "m", "--data", "d", "--name", "n", "--d-sae", "4", "--k",
      "1", "--steps", "1", "--out", ""], "--out"),
    (["features", "show", "", "--model", "m", "--data", "d"], "F"),
    (["serve", "--features", ""], "--features"),
])
def test_an_empty_path_is_one_line_naming_its_flag(argv, flag, capsys):
    # --data "" said ": no such corpus file"; features show "" looked for cfg.json in the
    # current directory
    from glassllm.cli import main
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert info.value.code == 2 and f"argument {flag}: must be a path, got an empty string" in err


def test_integer_weights_in_a_dictionary_file_are_refused_naming_the_tensor(tmp_path):
    # an int32 W_enc loaded as numbers it never was: features show gave garbage activations
    from safetensors.numpy import load_file, save_file
    save_saelens(SAE(8, 4, kind="topk", k=2, hook_name="blocks.0.residual_out", seed=0), tmp_path)
    weights = tmp_path / "sae_weights.safetensors"
    tensors = load_file(str(weights))
    tensors["W_enc"] = np.ones((8, 4), np.int32)
    save_file(tensors, str(weights))
    with pytest.raises(ValueError) as info:
        load_saelens(tmp_path)
    assert str(info.value) == f"{weights}: tensor 'W_enc' holds int32, not floating point"


def test_a_bfloat16_dictionary_loads_as_its_float32_values(tmp_path):
    # SAELens saves dictionaries in bfloat16 too: load_saelens was "data type 'bfloat16' not
    # understood" (a TypeError traceback)
    import ml_dtypes
    from safetensors.numpy import load_file, save_file
    sae = SAE(8, 4, kind="topk", k=2, hook_name="blocks.0.residual_out", seed=0)
    save_saelens(sae, tmp_path)
    weights = str(tmp_path / "sae_weights.safetensors")
    save_file({k: v.astype(ml_dtypes.bfloat16) for k, v in load_file(weights).items()}, weights)
    loaded = load_saelens(tmp_path)
    expected = sae.W_enc.data.astype(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(loaded.W_enc.data, expected)
    assert loaded.W_enc.data.dtype == np.float32
