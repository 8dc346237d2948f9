"""Batch and BatchAllocator on their own (model-free): defaults, validation messages, ubatch splitting."""

from __future__ import annotations

import numpy as np
import pytest

from llamactx import Batch, DecodeError, LlamactxError
from llamactx.batch import BatchAllocator


def alloc(batch: Batch, last: dict[int, int] | None = None, output_all: bool = False):
    last = last or {}
    return BatchAllocator(n_vocab=100, n_embd=8, n_seq_max=4, n_batch=16).init(
        batch, lambda s: last.get(s, -1), output_all)


def test_get_one_continues_sequence_zero_and_outputs_the_last_token():
    a = alloc(Batch.get_one([5, 6, 7]), last={0: 9})
    assert a.pos.tolist() == [10, 11, 12] and a.seq_ids == [(0,)] * 3
    assert a.output.tolist() == [False, False, True] and a.n_outputs == 1


def test_explicit_batch_keeps_its_fields_and_splits_in_order():
    b = Batch(5, n_seq_max=2)
    for i in range(5):
        b.add(i, i, (0, 1) if i < 2 else (1,), logits=i % 2 == 0)
    a = alloc(b)
    ubs = a.split_simple(2)
    assert [u.n_tokens for u in ubs] == [2, 2, 1]
    assert ubs[1].batch_index.tolist() == [2, 3] and ubs[0].seq_ids == [(0, 1), (0, 1)]
    assert ubs[2].seq_id0.tolist() == [1] and a.output.tolist() == [True, False, True, False, True]


@pytest.mark.parametrize(("fill", "message"), [
    (lambda b: b.add(100, 0), "token 0: id 100 is outside the vocab"),
    (lambda b: b.add(1, -1), "position -1 is negative"),
    (lambda b: b.add(1, 0, (4,)), r"seq_id 4 is outside \[0, n_seq_max = 4\)"),
    (lambda b: (b.add(1, 0), b.add(2, 2)), "not continuous"),
    (lambda b: (b.add(1, 3), b.add(2, 1)), "lower than the previous"),
])
def test_invalid_batches_name_the_token_and_the_rule(fill, message):
    b = Batch(4)
    fill(b)
    with pytest.raises(DecodeError, match=message) as info:
        alloc(b)
    assert info.value.code == -1 and isinstance(info.value, LlamactxError)


def test_batch_limits_and_memory_continuity():
    with pytest.raises(DecodeError, match="more than n_batch = 16"):
        alloc(Batch.get_one(list(range(17))))
    b = Batch(1)
    b.add(1, 3)
    with pytest.raises(DecodeError, match="must continue at 6"):
        alloc(b, last={0: 5})
    with pytest.raises(DecodeError, match="every token to be an output"):
        alloc(Batch.get_one([1, 2]), output_all=False) and alloc(_all_but_last(), output_all=True)
    with pytest.raises(DecodeError, match="batch is full"):
        full = Batch(1)
        full.add(1, 0)
        full.add(2, 1)


def _all_but_last() -> Batch:
    b = Batch(2)
    b.add(1, 0, logits=False)
    b.add(2, 1, logits=True)
    return b


def test_embeddings_input_is_checked():
    b = Batch(2, embd=8)
    b.add(np.ones(8, np.float32), 0)
    b.add(np.full(8, np.nan, np.float32), 1)
    with pytest.raises(DecodeError, match="token 1: input embedding is not finite"):
        alloc(b)


def test_values_past_int32_are_decode_errors_not_overflows():
    b = Batch(2)
    with pytest.raises(DecodeError, match="pos 2147483648 does not fit"):
        b.add(1, 2**31)
    with pytest.raises(DecodeError, match="token 4294967296 does not fit"):
        b.add(2**32, 0)
    with pytest.raises(DecodeError, match="outside the vocab"):
        alloc(Batch.get_one(np.array([2**40], np.int64)))
