"""State save / restore: round trips are bit-identical; every corrupt blob is rejected with memory unchanged."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from llamactx import Batch, Context, ContextParams, DecodeError, StateError
from llamactx.state_io import StateReader
from tests.test_context import assert_same_memory, memory_image


@pytest.fixture(scope="module")
def tokens(smollm):
    return smollm.vocab.tokenize("Once upon a time, there was a little", add_special=False)


def decoded(model, tokens, n_ctx=256, **params) -> Context:
    ctx = Context(model, ContextParams(n_ctx=n_ctx, **params))
    assert ctx.decode(Batch.get_one(tokens)) == 0
    return ctx


def test_state_round_trip_is_bit_identical(smollm, tokens):
    src = decoded(smollm, tokens)
    blob = src.state_get_data()
    dst = Context(smollm, ContextParams(n_ctx=256))
    dst.state_set_data(blob)
    np.testing.assert_array_equal(dst.get_logits_ith(-1), src.get_logits_ith(-1))
    assert dst.memory.seq_pos_max(0) == len(tokens) - 1
    nxt = int(np.argmax(src.get_logits_ith(-1)))
    src.decode(Batch.get_one([nxt]))
    dst.decode(Batch.get_one([nxt]))
    np.testing.assert_array_equal(dst.get_logits_ith(-1), src.get_logits_ith(-1))


def test_sequence_state_moves_into_another_sequence(smollm, tokens):
    src = decoded(smollm, tokens)
    blob = src.state_seq_get_data(0)
    dst = Context(smollm, ContextParams(n_ctx=256, n_seq_max=3))
    dst.state_seq_set_data(blob, 2)
    assert dst.memory.seq_pos_max(2) == len(tokens) - 1 and dst.memory.seq_pos_max(0) == -1
    batch = Batch(1)
    batch.add(42, len(tokens), (2,), True)
    dst.decode(batch)
    src.decode(Batch.get_one([42]))
    np.testing.assert_array_equal(dst.get_logits_ith(-1), src.get_logits_ith(-1))


def test_session_file_round_trip(smollm, tokens, tmp_path):
    src = decoded(smollm, tokens)
    path = tmp_path / "session.bin"
    src.state_save_file(path, tokens)
    dst = Context(smollm, ContextParams(n_ctx=256))
    assert dst.state_load_file(path) == tokens
    np.testing.assert_array_equal(dst.get_logits_ith(-1), src.get_logits_ith(-1))
    with pytest.raises(StateError, match="more than the capacity 3"):
        dst.state_load_file(path, n_token_capacity=3)


def _corruptions(blob: bytes, gemma_blob: bytes, seq_blob: bytes):
    yield "wrong magic", b"XXXXXXXX" + blob[8:]
    yield "version 99 is not supported", blob[:8] + struct.pack("<I", 99) + blob[12:]
    yield "truncated", blob[: len(blob) // 2]
    yield "truncated", blob[:10]
    yield "trailing bytes", blob + b"\0"
    yield "another model", gemma_blob
    yield "expected a whole-context state", seq_blob
    yield "must be bytes", "not bytes"


def test_corrupt_blobs_rejected_with_memory_unchanged(smollm, gemma, tokens):
    blob = decoded(smollm, tokens).state_get_data()
    seq_blob = decoded(smollm, tokens).state_seq_get_data(0)
    gemma_blob = Context(gemma, ContextParams(n_ctx=256)).state_get_data()
    victim = decoded(smollm, tokens[:3])
    before = memory_image(victim)
    logits = np.array(victim.get_logits())
    for message, bad in _corruptions(blob, gemma_blob, seq_blob):
        with pytest.raises(StateError, match=message):
            victim.state_set_data(bad)
        assert_same_memory(before, memory_image(victim))
        np.testing.assert_array_equal(victim.get_logits(), logits)


def test_state_larger_than_context_rejected(smollm):
    big = decoded(smollm, [42] * 300, n_ctx=512)
    small = Context(smollm, ContextParams(n_ctx=256))
    with pytest.raises(StateError, match="300 cells, more than this context's n_ctx = 256"):
        small.state_set_data(big.state_get_data())
    assert small.memory.used == 0


def test_kv_type_mismatch_rejected(smollm, tokens):
    blob = decoded(smollm, tokens).state_get_data()
    q8 = Context(smollm, ContextParams(n_ctx=256, type_k="q8_0", type_v="q8_0"))
    with pytest.raises(StateError, match="KV types f16/f16 differ"):
        q8.state_set_data(blob)


def test_sequence_state_needs_free_cells(smollm, tokens):
    blob = decoded(smollm, tokens).state_seq_get_data(0)
    full = Context(smollm, ContextParams(n_ctx=256, n_seq_max=2, kv_unified=True))
    full.decode(Batch.get_one([42] * 250))
    before = memory_image(full)
    with pytest.raises(StateError, match="needs 9 cells, only 6 are free"):
        full.state_seq_set_data(blob, 1)
    assert_same_memory(before, memory_image(full))


# -- hostile state (issue 12) -----------------------------------------------------------------------------------


@pytest.mark.parametrize("bad, index", [(49152, 2), (-1, 0), (2**31 - 1, 8)])
def test_session_file_token_ids_are_checked(smollm, tokens, tmp_path, bad, index):
    # the token ids came back unchecked, to be decoded or detokenized later
    src = decoded(smollm, tokens)
    path = tmp_path / "session.bin"
    src.state_save_file(path, [bad if i == index else t for i, t in enumerate(tokens)])
    victim = decoded(smollm, tokens[:3])
    before = memory_image(victim)
    with pytest.raises(StateError, match=rf"session file token {index} = {bad} is outside the vocab \[0, 49152\)"):
        victim.state_load_file(path)
    assert_same_memory(before, memory_image(victim))


def test_output_ids_below_minus_one_rejected(smollm, tokens):
    blob = bytearray(decoded(smollm, tokens).state_get_data())
    n_ids = len(tokens)
    # outputs: u32 n_ids, i32 ids[n_ids], u32 n_logits (1), f32 logits[n_vocab], u32 n_embd (0)
    at = len(blob) - 4 - 49152 * 4 - 4 - 4 * n_ids
    assert struct.unpack_from("<I", blob, at - 4)[0] == n_ids
    blob[at : at + 4] = struct.pack("<i", -7)
    victim = decoded(smollm, tokens[:3])
    before = memory_image(victim)
    with pytest.raises(StateError, match="state output id -7 is neither -1 nor a row index"):
        victim.state_set_data(bytes(blob))
    assert_same_memory(before, memory_image(victim))


def test_state_over_n_ctx_seq_rejected(smollm):
    # kv_unified=False with 2 sequences in 512 cells: each may hold 256 (llama.cpp's per-sequence streams)
    unified = decoded(smollm, [42] * 300, n_ctx=512)
    split = Context(smollm, ContextParams(n_ctx=512, n_seq_max=2))
    assert (split.params.n_ctx, split.params.n_ctx_seq) == (512, 256)
    with pytest.raises(StateError, match="state gives seq_id 0 300 cells, more than this context's n_ctx_seq = 256"):
        split.state_set_data(unified.state_get_data())
    with pytest.raises(StateError, match="sequence state holds 300 cells, more than this context's n_ctx_seq = 256"):
        split.state_seq_set_data(unified.state_seq_get_data(0), 1)
    assert split.memory.used == 0


def test_state_of_an_empty_context_round_trips(smollm):
    # found by tests/fuzz/fuzz_state.py: zero cells made the K/V reshape fail with a bare ValueError
    empty = Context(smollm, ContextParams(n_ctx=256, n_seq_max=2))
    dst = decoded(smollm, [42] * 5, n_seq_max=2)
    dst.state_set_data(empty.state_get_data())
    assert dst.memory.used == 0
    dst.state_seq_set_data(empty.state_seq_get_data(1), 0)
    assert dst.memory.used == 0


def test_a_state_at_the_last_position_cannot_be_continued_past_int32(smollm, tokens):
    # a blob whose sequence ends at 2^31 - 1 loads; the next decode used to raise numpy's OverflowError
    blob = bytearray(decoded(smollm, tokens).state_get_data())
    r = StateReader(bytes(blob))
    for what, n in (("magic", 8), ("version", 5)):
        r.take(n, what)
    for what in ("arch", "fingerprint", "type_k", "type_v"):
        r.string(what)
    r.take(20, "dimensions")
    last = r.off + 4 * (len(tokens) - 1)
    blob[last : last + 4] = struct.pack("<i", 2**31 - 1)
    ctx = Context(smollm, ContextParams(n_ctx=256))
    ctx.state_set_data(bytes(blob))
    before = memory_image(ctx)
    with pytest.raises(DecodeError, match="seq_id 0 would continue at position 2147483648, past the largest"):
        ctx.decode(Batch.get_one([42]))
    assert_same_memory(before, memory_image(ctx))


def test_session_file_checksum_binds_tokens_to_their_kv(smollm, tokens, tmp_path):
    """A file whose token list was changed, whose KV was changed, or that was spliced from two files is refused
    before anything is loaded (the slot-file attack: text B's tokens over text A's KV)."""
    src = decoded(smollm, tokens)
    path, other = tmp_path / "a.bin", tmp_path / "b.bin"
    src.state_seq_save_file(path, 0, tokens)
    other_tokens = smollm.vocab.tokenize("A completely different text of the same length!", add_special=False)
    decoded(smollm, other_tokens).state_seq_save_file(other, 0, other_tokens)
    data, data_b = path.read_bytes(), other.read_bytes()
    n = len(tokens)
    head = 16 + 4 * n  # magic, version, count, tokens
    victim = decoded(smollm, tokens[:3], n_seq_max=2)
    before = memory_image(victim)
    cases = {
        "tokens changed": data[:16] + struct.pack("<i", 42) + data[20:],
        "kv changed": data[:-1] + bytes([data[-1] ^ 1]),
        "spliced": data_b[: 16 + 4 * len(other_tokens) + 32] + data[head + 32 :],
        "cut short": data[: len(data) - 100],
    }
    for name, bad in cases.items():
        path.write_bytes(bad)
        with pytest.raises(StateError, match="fails its checksum"):
            victim.state_seq_load_file(path, 1)
        assert_same_memory(memory_image(victim), before), name


@pytest.mark.parametrize("type_k", ["f16", "q8_0"])
def test_non_finite_kv_is_refused(smollm, tokens, tmp_path, type_k):
    """A state holding NaN/inf K or V values would poison every request sharing its cells: refused at load,
    whatever checksum the file carries."""
    src = decoded(smollm, tokens, type_k=type_k)
    if type_k == "f16":
        src.memory.k[3, 2, 7] = np.inf
    else:  # a q8_0 block's f16 scale is its first two bytes
        src.memory.k[3, 2, :2] = np.frombuffer(np.float16(np.nan).tobytes(), np.uint8)
    path = tmp_path / "nan.bin"
    src.state_seq_save_file(path, 0, tokens)
    victim = decoded(smollm, tokens[:3], n_seq_max=2, type_k=type_k)
    before = memory_image(victim)
    with pytest.raises(StateError, match=r"K rows hold a non-finite value \(layer 3, cell 2\)"):
        victim.state_seq_load_file(path, 1)
    assert_same_memory(memory_image(victim), before)
