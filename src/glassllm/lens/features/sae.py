"""A sparse dictionary of one named value: the sparse autoencoder (SAE) and the transcoder.

An SAE reads a model's value x (d_in,) at one name of the frozen table (`blocks.2.residual_out`,
`blocks.0.mlp.hidden_post`, ...) and writes it as a sparse sum of learned directions:

    pi    = (x - b_dec) @ W_enc + b_enc        (d_sae,)  pre-activations
    f     = sigma(pi)                          (d_sae,)  feature activations, mostly 0
    x_hat = f @ W_dec + b_dec                  (d_in,)   the reconstruction

(Bricken et al. 2023, "Towards Monosemanticity", whose encoder subtracts the decoder bias
first). sigma and the loss are the architecture's (`kind`):

- "relu": sigma = ReLU; L = ||x - x_hat||^2 + lambda sum_i f_i ||W_dec[i]||_2, the L1 penalty
  weighted by each decoder row's norm, with the decoder free (Anthropic, "Circuits Updates -
  April 2024", the training update of Conerly et al.);
- "topk": sigma = ReLU(TopK_k(.)); L = ||x - x_hat||^2 + alpha ||e - e_hat||^2, the AuxK loss
  that lets dead features reconstruct the error e = x - x_hat with their own top k_aux
  (Gao et al. 2024, "Scaling and evaluating sparse autoencoders", §2.3, §A.2; alpha = 1/32);
- "jumprelu": sigma = JumpReLU_theta, f_i = pi_i H(pi_i - theta_i); L = ||x - x_hat||^2 +
  lambda sum_i H(pi_i - theta_i), the L0 penalty, theta trained through the pseudo-derivative
  of `ops.jumprelu` and `ops.step` (Rajamanoharan et al. 2024, "Jumping Ahead").

Squared errors are summed over the d_in channels and averaged over tokens. With kind "topk" and
"jumprelu" the decoder rows are kept at unit norm (`constrain_decoder`: the gradient's part
along each row removed before the step, the rows renormalised after; Bricken et al. 2023), so
the sparsity of f cannot be bought by shrinking f and growing W_dec. With "relu" the penalty's
norm weighting makes that trade pointless instead, and the decoder stays free.

A transcoder (Dunefsky, Chlenski & Nanda 2024, "Transcoders Find Interpretable LLM Feature
Circuits") is the same arithmetic reading one name and predicting another, y_hat = f @ W_dec +
b_dec (d_out,) for y at `out_name` (`blocks.i.mlp.input` -> `blocks.i.mlp.output`); its input is
not shifted by b_dec (a different space).

The parameters carry SAELens' names and shapes (`W_enc` (d_in, d_sae), `b_enc` (d_sae,), `W_dec`
(d_sae, d_in), `b_dec` (d_in,), `threshold` (d_sae,)), so `saelens.save_saelens` writes them as
they are. `encode`/`decode` are plain NumPy (no graph, for analysis); `forward`/`loss` build the
autograd graph that `train.train_dictionary` differentiates.
"""
from __future__ import annotations

import numpy as np

from ... import functional as F
from ...checks import is_int
from ...nn import Module
from ...tensor import Tensor
from . import ops

KINDS = ("relu", "topk", "jumprelu")


def _unit_rows(a: np.ndarray) -> np.ndarray:
    return a / np.maximum(np.linalg.norm(a, axis=-1, keepdims=True), 1e-12)


class SAE(Module):
    """A sparse autoencoder of the value at `hook_name`.

    Args:
        d_in: width of the value read (d_model for a residual, d_ff for mlp.hidden_post).
        d_sae: the number of features S.
        kind: "relu", "topk" or "jumprelu" (module docstring).
        hook_name: the name of glassllm's table it reads (recorded; `train_dictionary` and the
            evaluation read that value).
        k: features kept per token, kind "topk" only (1 <= k <= d_sae).
        seed: the initialisation's random seed.
        l1_coefficient: lambda of the relu loss (norm-weighted L1).
        l0_coefficient: lambda of the jumprelu loss (L0).
        threshold: initial theta of every jumprelu feature.
        bandwidth: eps, the width of its kernel.
        aux_coefficient: alpha of the topk AuxK loss.
        aux_k: its k_aux (None: d_in // 2).
        apply_b_dec_to_input: subtract b_dec before encoding (SAELens' field of that name).
        dtype: the parameters' dtype (float64 for gradient checks).

    Initialisation: decoder rows random directions (norm 0.1 for relu, as Anthropic's April 2024
    update, else 1), encoder its transpose (Gao et al. 2024, §A.1), biases 0.

    Raises:
        ValueError: an unknown kind, k missing or out of range for topk (or given for another
            kind), or a non-positive size.
    """

    def __init__(self, d_in: int, d_sae: int, *, kind: str = "topk", hook_name: str,
                 k: int | None = None, seed: int = 0, l1_coefficient: float = 5.0,
                 l0_coefficient: float = 1.0, threshold: float = 0.001,
                 bandwidth: float = 0.001, aux_coefficient: float = 1 / 32,
                 aux_k: int | None = None, apply_b_dec_to_input: bool = True,
                 dtype=np.float32, _d_out: int | None = None):
        d_out = d_in if _d_out is None else _d_out
        _check_sizes(kind, d_in, d_sae, d_out, k)
        # Python ints: NumPy's (np.int64) are no JSON, and cfg.json / training.npz store them
        self.kind, self.hook_name, self.k = kind, hook_name, None if k is None else int(k)
        self.d_in, self.d_sae, self.d_out = int(d_in), int(d_sae), int(d_out)
        self.l1_coefficient, self.l0_coefficient = float(l1_coefficient), float(l0_coefficient)
        self.bandwidth, self.aux_coefficient = float(bandwidth), float(aux_coefficient)
        self.aux_k = int(aux_k) if is_int(aux_k) else aux_k
        self.apply_b_dec_to_input = bool(apply_b_dec_to_input)
        rng = np.random.default_rng(seed)
        w_dec = _unit_rows(rng.standard_normal((d_sae, d_out))) * (0.1 if kind == "relu" else 1.0)
        w_enc = w_dec.T if d_in == d_out else \
            _unit_rows(rng.standard_normal((d_sae, d_in))).T * (0.1 if kind == "relu" else 1.0)
        # definition order = SAELens' order of the tensors (Module walks attributes in order)
        self.W_enc = Tensor(np.array(w_enc, dtype=dtype), requires_grad=True)   # (d_in, d_sae)
        self.b_enc = Tensor(np.zeros(d_sae, dtype), requires_grad=True)          # (d_sae,)
        self.W_dec = Tensor(np.array(w_dec, dtype=dtype), requires_grad=True)   # (d_sae, d_out)
        self.b_dec = Tensor(np.zeros(d_out, dtype), requires_grad=True)          # (d_out,)
        if kind == "jumprelu":
            self.threshold = Tensor(np.full(d_sae, threshold, dtype), requires_grad=True)

    @property
    def constrain_decoder(self) -> bool:
        """Whether training keeps the decoder rows at unit norm (topk, jumprelu; module doc)."""
        return self.kind != "relu"

    # ------------------------------------------------------------------ NumPy, no graph
    def encode(self, x: np.ndarray) -> np.ndarray:
        """Feature activations f = sigma((x - b_dec) @ W_enc + b_enc): x (..., d_in) ->
        f (..., d_sae), in the parameters' dtype.

        Raises:
            ValueError: x's last axis is not d_in.
        """
        x = np.asarray(x, dtype=self.W_enc.dtype)
        if x.shape[-1:] != (self.d_in,):
            raise ValueError(f"encode: x has shape {x.shape}; its last axis must be d_in = "
                             f"{self.d_in}")
        if self.apply_b_dec_to_input:
            x = x - self.b_dec.data
        pi = x @ self.W_enc.data + self.b_enc.data                    # (..., d_sae)
        if self.kind == "relu":
            return ops.relu_forward(pi)[0]
        if self.kind == "topk":
            return ops.topk_relu_forward(pi, self.k)[0]
        return ops.jumprelu_forward(pi, self.threshold.data, self.bandwidth)[0]

    def decode(self, f: np.ndarray) -> np.ndarray:
        """The reconstruction f @ W_dec + b_dec: f (..., d_sae) -> (..., d_in) (d_out for a
        transcoder)."""
        f = np.asarray(f, dtype=self.W_dec.dtype)
        if f.shape[-1:] != (self.d_sae,):
            raise ValueError(f"decode: f has shape {f.shape}; its last axis must be d_sae = "
                             f"{self.d_sae}")
        return f @ self.W_dec.data + self.b_dec.data

    # ------------------------------------------------------------------ autograd, for training
    def pre_activations(self, x: Tensor) -> Tensor:
        """pi = (x - b_dec) @ W_enc + b_enc: x (N, d_in) -> (N, d_sae), on the graph."""
        if self.apply_b_dec_to_input:
            x = x - self.b_dec
        return F.linear(x, self.W_enc, self.b_enc)

    def activate(self, pi: Tensor) -> Tensor:
        """sigma(pi) of this kind: (N, d_sae) -> (N, d_sae)."""
        if self.kind == "relu":
            return ops.relu(pi)
        if self.kind == "topk":
            return ops.topk_relu(pi, self.k)
        return ops.jumprelu(pi, self.threshold, self.bandwidth)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(reconstruction x_hat (N, d_in), feature activations f (N, d_sae)) of x (N, d_in),
        both on the autograd graph."""
        f = self.activate(self.pre_activations(x))
        return F.linear(f, self.W_dec, self.b_dec), f

    __call__ = forward

    def loss(self, x: Tensor, target: Tensor | None = None, dead: np.ndarray | None = None
             ) -> tuple[Tensor, dict[str, float], np.ndarray]:
        """The training loss of this kind (module docstring) on a batch: x (N, d_in), target
        (N, d_out) (None: x itself, an SAE), dead (d_sae,) bool, the features the trainer counts
        as dead (for topk's AuxK; None or all False: no AuxK term).

        Returns (loss, parts, f): the scalar loss Tensor, its terms as floats ("mse", and "l1",
        "l0" or "auxk"), and the feature activations f (N, d_sae) as an array.
        """
        target = x if target is None else target
        pi = self.pre_activations(x)                                   # (N, S)
        f = self.activate(pi)
        x_hat = F.linear(f, self.W_dec, self.b_dec)                    # (N, d_out)
        error = target - x_hat
        mse = (error * error).sum(axis=-1).mean()
        if self.kind == "relu":
            norms = ((self.W_dec * self.W_dec).sum(axis=-1)) ** 0.5    # (S,) ||W_dec[i]||
            penalty = (f * norms).sum(axis=-1).mean()
            total, parts = mse + self.l1_coefficient * penalty, {"l1": penalty.item()}
        elif self.kind == "jumprelu":
            l0 = ops.step(pi, self.threshold, self.bandwidth).sum(axis=-1).mean()
            total, parts = mse + self.l0_coefficient * l0, {"l0": l0.item()}
        elif dead is None or not dead.any():
            total, parts = mse, {"auxk": 0.0}
        else:
            auxk = self.auxk_loss(pi, Tensor(error.data), dead)        # e: a constant
            total, parts = mse + self.aux_coefficient * auxk, {"auxk": auxk.item()}
        return total, {"mse": mse.item(), **parts}, f.data

    def auxk_loss(self, pi: Tensor, error: Tensor, dead: np.ndarray) -> Tensor:
        """Gao et al. 2024's AuxK: the top k_aux pre-activations among the dead features
        reconstruct the main loss's error e (N, d_out), a constant: ||e - z_aux @ W_dec||^2,
        summed over channels, averaged over tokens. pi (N, S); dead (S,) bool."""
        k_aux = min(self.aux_k or max(self.d_out // 2, 1), int(dead.sum()))
        hidden = np.where(dead, 0.0, -np.inf).astype(pi.dtype)         # alive: never picked
        z_aux = ops.topk_relu(pi + hidden, k_aux)                      # (N, S)
        miss = error - z_aux @ self.W_dec                              # (N, d_out)
        return (miss * miss).sum(axis=-1).mean()

    # ------------------------------------------------------------------ decoder constraint
    def remove_parallel_gradient(self) -> None:
        """W_dec.grad[i] -= (W_dec.grad[i] . u_i) u_i for unit rows u_i: the part of the step that
        would only change a row's norm, undone by the renormalisation anyway (Bricken et al.
        2023, "Training details")."""
        g = self.W_dec.grad
        if g is not None:
            u = _unit_rows(self.W_dec.data)
            g -= (g * u).sum(axis=-1, keepdims=True) * u

    def normalize_decoder(self) -> None:
        """Scale every decoder row to unit L2 norm, in place."""
        self.W_dec.data[...] = _unit_rows(self.W_dec.data)

    # ------------------------------------------------------------------ description
    def config(self) -> dict:
        """The constructor's arguments that define the arithmetic and the training, as JSON."""
        return {"kind": self.kind, "d_in": self.d_in, "d_sae": self.d_sae,
                "hook_name": self.hook_name, "k": self.k, "l1_coefficient": self.l1_coefficient,
                "l0_coefficient": self.l0_coefficient, "bandwidth": self.bandwidth,
                "aux_coefficient": self.aux_coefficient, "aux_k": self.aux_k,
                "apply_b_dec_to_input": self.apply_b_dec_to_input}

    def __repr__(self) -> str:
        k = f", k={self.k}" if self.kind == "topk" else ""
        return (f"{type(self).__name__}({self.d_in} -> {self.d_sae}, kind={self.kind!r}{k}, "
                f"hook_name={self.hook_name!r})")


class Transcoder(SAE):
    """A sparse dictionary that reads the value at `hook_name` (d_in,) and predicts the value at
    `out_name` (d_out,) (Dunefsky et al. 2024), e.g. `blocks.1.mlp.input` ->
    `blocks.1.mlp.output`: the MLP replaced by a sparse, wider layer. `W_dec` is (d_sae, d_out),
    `b_dec` (d_out,); the input is not shifted by b_dec. `forward(x)` returns (y_hat, f);
    `loss(x, y)` compares with y. Other arguments as `SAE`."""

    def __init__(self, d_in: int, d_sae: int, d_out: int, *, kind: str = "relu",
                 hook_name: str, out_name: str, **options):
        options["apply_b_dec_to_input"] = False
        super().__init__(d_in, d_sae, kind=kind, hook_name=hook_name, _d_out=d_out, **options)
        self.out_name = out_name

    def config(self) -> dict:
        return {**super().config(), "d_out": self.d_out, "out_name": self.out_name}

    def __repr__(self) -> str:
        return super().__repr__()[:-1] + f", out_name={self.out_name!r}, d_out={self.d_out})"


def _check_sizes(kind, d_in, d_sae, d_out, k) -> None:
    if kind not in KINDS:
        raise ValueError(f"SAE: kind {kind!r} is not one of {', '.join(KINDS)}")
    if not all(is_int(n) and n >= 1 for n in (d_in, d_sae, d_out)):
        raise ValueError(f"SAE: sizes must be positive integers (d_in={d_in!r}, "
                         f"d_sae={d_sae!r}, d_out={d_out!r})")
    if kind == "topk" and (not is_int(k) or not 1 <= k <= d_sae):  # not True, not 2.5
        raise ValueError(f"SAE: kind 'topk' needs k in 1..d_sae={d_sae}, got k={k}")
    if kind != "topk" and k is not None:
        raise ValueError(f"SAE: k is for kind 'topk' only (kind is {kind!r})")
