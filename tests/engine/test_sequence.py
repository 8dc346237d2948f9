"""Sequence on its own (model-free): pending tokens, EOG / stop string / max_tokens, tails, context shift."""

from __future__ import annotations

import pytest

from llamactx.engine import Limits, Sequence, SequenceStatus
from llamactx.sampling import SamplerChain

EOS = 0


class TinyVocab:
    """Token t is the character chr(t) (t < 128), or the 2-byte UTF-8 halves of "é" (200, 201); 0 is EOS."""

    def is_eog(self, token: int) -> bool:
        return token == EOS

    def token_to_piece(self, token: int) -> bytes:
        return {200: b"\xc3", 201: b"\xa9"}.get(token, bytes([token]))


def seq(prompt=(1, 2, 3), **limits) -> Sequence:
    return Sequence(list(prompt), SamplerChain(), Limits(**limits))


def feed(s: Sequence, text: str) -> list:
    chunks = []
    for tok in [ord(c) for c in text]:
        chunks += s.append(tok, TinyVocab())
    return chunks


def test_pending_is_the_unprocessed_prompt_then_the_last_token():
    s = seq()
    assert s.pending == [1, 2, 3] and s.status is SequenceStatus.WAITING
    s.n_past = 3
    assert s.pending == []
    s.append(ord("a"), TinyVocab())
    assert s.pending == [ord("a")] and s.output == [ord("a")]


def test_eog_finishes_with_stop_and_is_not_kept():
    s = seq()
    feed(s, "hi")
    assert s.append(EOS, TinyVocab()) == []
    assert s.finish_reason == "stop" and s.output == [ord("h"), ord("i")] and s.is_finished
    assert s.result().text == "hi"


def test_ignore_eos_keeps_generating():
    s = seq(ignore_eos=True, max_tokens=2)
    s.append(EOS, TinyVocab())
    assert not s.is_finished and s.output == [EOS]


def test_stop_string_is_held_back_and_never_emitted():
    s = seq(stop=("END",))
    chunks = feed(s, "abEN")
    assert "".join(c.text for c in chunks) == "ab"
    chunks = feed(s, "D")
    assert chunks == [] and s.finish_reason == "stop" and s.result().stop_word == "END"
    assert s.result().text == "ab"


def test_max_tokens_finishes_with_length_and_flushes_the_tail():
    s = seq(stop=("xyz",), max_tokens=3)
    chunks = feed(s, "abx")
    assert [c.text for c in chunks] == ["a", "b", "", "x"]  # "x" held (could start "xyz"), then flushed
    assert chunks[-1].token is None and s.finish_reason == "length"


def test_a_character_is_never_split_across_chunks():
    s = seq()
    assert [c.text for c in s.append(200, TinyVocab())] == [""]
    assert [c.text for c in s.append(201, TinyVocab())] == ["é"]


def test_finish_is_idempotent_and_keeps_the_first_reason():
    s = seq()
    feed(s, "a")
    s.finish("abort")
    assert s.finish("length") == [] and s.finish_reason == "abort"


def test_shift_drops_half_after_n_keep():
    s = seq(prompt=range(1, 11))
    s.n_past = 10
    assert s.shift(2) == (2, 4)
    assert s.tokens == [1, 2, 7, 8, 9, 10] and s.n_past == 6


def test_empty_prompt_is_refused():
    with pytest.raises(ValueError, match="prompt is empty"):
        seq(prompt=())
