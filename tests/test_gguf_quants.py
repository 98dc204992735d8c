"""The GGUF dequantizers (glassllm.formats.gguf_quants) against the `gguf` package's own NumPy
dequantizers, bit for bit, on random blocks and on data gguf's quantizers produce; against
hand-packed blocks whose values are worked out by hand; Q8_K (which gguf does not dequantize)
against ggml-quants.c's loop written out."""
from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from glassllm.formats import gguf_quants as gq  # noqa: E402
from gguf_files import random_blocks  # noqa: E402

QT = gguf.GGMLQuantizationType
QUANTIZED = [QT.Q8_0, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q4_K, QT.Q5_K, QT.Q6_K]
GGUF_QUANTIZES = [QT.F16, QT.BF16, QT.Q8_0, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1]


def _bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)


def test_block_structs_have_ggml_sizes():
    for qtype, dtype in gq.BLOCKS.items():
        assert (gq.block_size(qtype), dtype.itemsize) == gguf.GGML_QUANT_SIZES[qtype], qtype.name


@pytest.mark.parametrize("qtype", QUANTIZED, ids=lambda q: q.name)
def test_random_blocks_dequantize_as_gguf_does_bit_for_bit(qtype):
    raw = random_blocks(qtype, 64, seed=int(qtype))
    n = 64 * gq.block_size(qtype)
    ours = gq.dequantize(raw, qtype, (4, n // 4))
    theirs = gguf.quants.dequantize(raw.reshape(4, -1), qtype)
    assert ours.dtype == np.float32 and ours.shape == theirs.shape == (4, n // 4)
    assert np.array_equal(_bits(ours), _bits(theirs))


@pytest.mark.parametrize("qtype", GGUF_QUANTIZES, ids=lambda q: q.name)
def test_gguf_quantized_data_dequantizes_as_gguf_does(qtype):
    rng = np.random.default_rng(1)
    x = (rng.standard_t(4, size=(8, 256)) * 0.02).astype(np.float32)  # weight-like tails
    stored = gguf.quants.quantize(x, qtype)
    ours = gq.dequantize(stored, qtype, x.shape)
    assert np.array_equal(_bits(ours), _bits(gguf.quants.dequantize(stored, qtype)))
    # and it is x, up to each format's rounding: at most one step of the block's scale (half
    # a step, but Q4_0/Q5_0 clip the top level on the side opposite the block's largest |x|)
    step = {QT.F16: 1e-3, QT.BF16: 4e-3}.get(qtype)
    if step is not None:
        assert np.abs(ours - x).max() <= step * np.abs(x).max()
    else:
        levels = {QT.Q8_0: 127, QT.Q5_0: 16, QT.Q5_1: 31, QT.Q4_0: 8, QT.Q4_1: 15}[qtype]
        span = np.abs(x.reshape(-1, 32)).max(1) * (2 if qtype in (QT.Q4_1, QT.Q5_1) else 1)
        err = np.abs(ours - x).reshape(-1, 32).max(1)
        assert (err <= span / levels * 1.01).all()


def test_f32_and_bf16_and_f16_are_exact():
    x = np.array([1.0, -2.5, 3.140625, 0.0], dtype=np.float32)
    assert np.array_equal(gq.dequantize(x.view(np.uint8), QT.F32, (4,)), x)
    assert np.array_equal(gq.dequantize(x.astype(np.float16).view(np.uint8), QT.F16, (4,)), x)
    bf16 = (x.view(np.uint32) >> 16).astype(np.uint16)  # these x are bf16 values exactly
    assert np.array_equal(gq.dequantize(bf16.view(np.uint8), QT.BF16, (2, 2)), x.reshape(2, 2))


def test_a_q4_0_block_by_hand():
    """d = 0.5; byte j holds weight j in its low nibble and weight j + 16 in its high one;
    w = (nibble - 8) * d."""
    block = np.zeros(1, gq.BLOCKS[QT.Q4_0])
    block["d"] = 0.5
    block["qs"][0, :] = [(15 << 4) | 0, (8 << 4) | 9] + [0x88] * 14
    w = gq.dequantize(block.view(np.uint8), QT.Q4_0, (32,))
    assert w[0] == -4.0 and w[16] == 3.5 and w[1] == 0.5 and w[17] == 0.0
    assert (w[2:16] == 0).all() and (w[18:] == 0).all()


def test_a_q5_0_blocks_fifth_bits():
    """qh bit j is weight j's 5th bit, bit j + 16 weight (j + 16)'s: w = (q - 16) * d."""
    block = np.zeros(1, gq.BLOCKS[QT.Q5_0])
    block["d"] = 1.0
    block["qh"] = (1 << 0) | (1 << 17)  # weights 0 and 17 get 16 added
    w = gq.dequantize(block.view(np.uint8), QT.Q5_0, (32,))
    assert w[0] == 0.0 and w[17] == 0.0 and w[1] == -16.0 and w[16] == -16.0


def test_k_quant_scales_unpack_by_hand():
    """get_scale_min_k4: sub-blocks 0..3 in the low 6 bits of bytes j (scale) and j + 4
    (min); 4..7 in the nibbles of byte j + 4, their top 2 bits in bytes j - 4 and j."""
    q = np.zeros((1, 12), dtype=np.uint8)
    q[0, 1], q[0, 5] = 0b11_000011, 0b10_000101   # sub-block 1: scale 3, min 5
    q[0, 9] = (0b0110 << 4) | 0b1001              # sub-block 5: low nibbles 9 (sc), 6 (m)
    assert [int(v[0]) for v in gq.get_scale_min_k4(1, q)] == [3, 5]
    sc, m = gq.get_scale_min_k4(5, q)  # top bits: sc from byte 1 (0b11), m from byte 5 (0b10)
    assert (int(sc[0]), int(m[0])) == (0b11_1001, 0b10_0110)


def test_a_q4_k_block_by_hand():
    """Sub-block j of 32 weights: w = d * sc_j * q - dmin * m_j."""
    block = np.zeros(1, gq.BLOCKS[QT.Q4_K])
    block["d"], block["dmin"] = 0.25, 1.0
    block["scales"][0, 0], block["scales"][0, 4] = 2, 3   # sub-block 0: sc 2, m 3
    block["scales"][0, 1], block["scales"][0, 5] = 4, 1   # sub-block 1: sc 4, m 1
    block["qs"][0, :32] = (7 << 4) | 5                   # low nibbles 5, high nibbles 7
    w = gq.dequantize(block.view(np.uint8), QT.Q4_K, (256,))
    assert (w[:32] == 0.25 * 2 * 5 - 3).all() and (w[32:64] == 0.25 * 4 * 7 - 1).all()
    assert (w[64:] == 0).all()


def test_q8_k_is_ggml_quants_loop():
    """dequantize_row_q8_K: y[j] = x.d * x.qs[j] (gguf has no Q8_K dequantizer to compare
    with: the C loop, written out)."""
    raw = random_blocks(QT.Q8_K, 3, seed=8)
    blocks = raw.view(gq.BLOCKS[QT.Q8_K]).reshape(-1)
    expected = np.array([[np.float32(b["d"]) * np.float32(q) for q in b["qs"]] for b in blocks],
                        dtype=np.float32)
    assert np.array_equal(_bits(gq.dequantize(raw, QT.Q8_K, (3, 256))), _bits(expected))


def test_unsupported_type_and_wrong_size_are_one_line():
    with pytest.raises(ValueError, match=r"tensor type Q2_K is not supported"):
        gq.dequantize(np.zeros(84, np.uint8), QT.Q2_K, (256,))
    with pytest.raises(ValueError, match=r"Q8_0: 34 bytes hold 32 values, the shape \(64,\)"):
        gq.dequantize(np.zeros(34, np.uint8), QT.Q8_0, (64,))
    with pytest.raises(ValueError, match=r"not a whole number of 34-byte blocks"):
        gq.dequantize(np.zeros(35, np.uint8), QT.Q8_0, (32,))
