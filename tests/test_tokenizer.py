"""glassllm.tokenizers: ByteTokenizer round trips, decode never raising, and StreamDecoder
releasing only complete characters whose concatenation equals the one-shot decode; the
package's name leaves `import tokenizers` to Hugging Face's library."""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import shared_data_path
from glassllm.tokenizers import ByteTokenizer, StreamDecoder, tokenizer_from_json

TOK = ByteTokenizer()


def data_text(name: str) -> str:
    """A text file of ../shared/data (skipped with the reason if absent; CI=true: fails)."""
    return shared_data_path(name).read_text(encoding="utf-8")


def stream(ids) -> list[str]:
    """Chunks StreamDecoder returns for each id, then the flush."""
    decoder = StreamDecoder(TOK)
    return [decoder.push(i) for i in ids] + [decoder.flush()]


# --------------------------------------------------------------------------- ByteTokenizer
def test_protocol_values():
    assert TOK.vocab_size == 257 and TOK.eot_id == 256
    ids = TOK.encode("Aé€😀")
    assert ids.dtype == np.uint16 and ids.ndim == 1
    # 1 + 2 + 3 + 4 UTF-8 bytes, each byte its own id.
    assert ids.tolist() == [0x41, 0xC3, 0xA9, 0xE2, 0x82, 0xAC, 0xF0, 0x9F, 0x98, 0x80]
    assert TOK.encode("").tolist() == []


@pytest.mark.parametrize("name", ["utf8-sample.txt", "utf8-emoji-cjk.txt"])
def test_round_trip_on_real_utf8_files(name):
    text = data_text(name)
    ids = TOK.encode(text)
    assert len(ids) == len(text.encode("utf-8")) > len(text)  # multi-byte characters present
    assert TOK.decode(ids) == text
    assert TOK.decode_bytes(ids) == text.encode("utf-8")


@settings(deadline=None)  # shared 2-core machine: timing is not what is tested
@given(st.text())
def test_round_trip_any_text(text):
    assert TOK.decode(TOK.encode(text)) == text


def test_eot_contributes_no_bytes():
    ids = np.concatenate([TOK.encode("a"), [TOK.eot_id], TOK.encode("b")])
    assert TOK.decode(ids) == "ab"
    assert TOK.decode([TOK.eot_id]) == ""


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 256), max_size=64))
def test_decode_never_raises_on_any_byte_ids(ids):
    text = TOK.decode(ids)
    assert isinstance(text, str)
    # Invalid sequences become U+FFFD exactly as Python's own replace-decoder does.
    raw = bytes(i for i in ids if i != 256)
    assert text == raw.decode("utf-8", errors="replace")


def test_decode_invalid_utf8_becomes_replacement_character():
    assert TOK.decode([0xFF, 0x41]) == "\ufffdA"
    assert TOK.decode([0xE2, 0x82]) == "\ufffd"  # truncated 3-byte character


@pytest.mark.parametrize("ids", [[257], [-1], [65, 1000]])
def test_decode_rejects_ids_out_of_range(ids):
    with pytest.raises(ValueError, match=r"\[0, 257\)"):
        TOK.decode(ids)


def test_json_round_trip():
    assert json.loads(TOK.to_json()) == {"type": "byte"}
    assert isinstance(tokenizer_from_json(TOK.to_json()), ByteTokenizer)
    for bad in ("{not json", '{"kind": "byte"}', '{"type": "sentencepiece"}', "[]"):
        with pytest.raises(ValueError):
            tokenizer_from_json(bad)


# --------------------------------------------------------------------------- StreamDecoder
@pytest.mark.parametrize("name", ["utf8-sample.txt", "utf8-emoji-cjk.txt"])
def test_stream_releases_each_character_when_its_last_byte_arrives(name):
    text = data_text(name)
    raw = text.encode("utf-8")
    chunks = stream(TOK.encode(text))
    assert "".join(chunks) == text
    assert chunks[-1] == ""  # valid text: nothing left over for flush
    # After byte i, the text released so far is exactly the longest complete-character prefix.
    released = ""
    for i, chunk in enumerate(chunks[:-1]):
        released += chunk
        assert released == raw[:i + 1].decode("utf-8", errors="ignore")
        if chunk:
            assert chunk.encode("utf-8") == raw[i + 1 - len(chunk.encode("utf-8")):i + 1]


def test_stream_never_splits_a_character():
    chunks = stream(TOK.encode("é€😀"))
    assert chunks == ["", "é", "", "", "€", "", "", "", "😀", ""]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 256), max_size=48))
def test_stream_chunks_join_to_decode_for_any_ids(ids):
    assert "".join(stream(ids)) == TOK.decode(ids)


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=40), st.data())
def test_stream_every_split_of_a_sequence(text, data):
    """Any split point: chunks of the first part + chunks of the rest == decode of the whole,
    and the first part's chunks hold only complete characters (a prefix of the text)."""
    ids = TOK.encode(text).tolist()
    cut = data.draw(st.integers(0, len(ids)))
    decoder = StreamDecoder(TOK)
    first = "".join(decoder.push(i) for i in ids[:cut])
    rest = "".join(decoder.push(i) for i in ids[cut:]) + decoder.flush()
    assert text.startswith(first)
    assert first + rest == text


def test_flush_releases_an_incomplete_tail_as_replacement():
    decoder = StreamDecoder(TOK)
    assert decoder.push(0x41) == "A"
    assert decoder.push(0xF0) == "" and decoder.push(0x9F) == ""
    assert decoder.flush() == "\ufffd"
    assert TOK.decode([0x41, 0xF0, 0x9F]) == "A\ufffd"


def test_stream_eot_in_the_middle_of_a_character_is_ignored_like_decode():
    ids = [0xC3, TOK.eot_id, 0xA9]
    assert stream(ids) == ["", "", "é", ""]
    assert TOK.decode(ids) == "é"


def test_import_tokenizers_is_still_hugging_faces_library():
    """glassllm.tokenizers shares its last name with the PyPI `tokenizers` the BPE and
    tokenizer.json readers use: in a fresh interpreter, after glassllm is imported, and from
    inside the package's modules, `tokenizers` is the library (absolute imports, PEP 328)."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    src = Path(__file__).resolve().parents[1] / "src"
    code = """
import glassllm, glassllm.tokenizers, glassllm.tokenizers.bpe as bpe, tokenizers
import glassllm.tokenizers.tokenizer_json as tj
assert tokenizers is not glassllm.tokenizers and hasattr(tokenizers, "Tokenizer"), tokenizers
assert "site-packages" in tokenizers.__file__ or "dist-packages" in tokenizers.__file__
tok = bpe.BPETokenizer.train(["to be or not to be"] * 20, 270)  # imports `tokenizers` inside
assert type(tok._tok).__module__.startswith("tokenizers"), type(tok._tok)
print(tokenizers.__name__, glassllm.tokenizers.__name__)
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(src)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["tokenizers", "glassllm.tokenizers"]
