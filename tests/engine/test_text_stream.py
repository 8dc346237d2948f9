"""TextStream: bytes in, text out; never part of a character, never a stop string (model-free)."""

from __future__ import annotations

from llamactx.engine.text_stream import TextStream


def test_text_stream_never_splits_a_character():
    stream = TextStream()
    data = "héllo 日本 😀!".encode()
    out = [stream.push(data[i : i + 1]) for i in range(len(data))]
    out.append(stream.flush())
    assert "".join(out) == "héllo 日本 😀!"
    assert all("\ufffd" not in chunk for chunk in out)
    assert out[1] == "" and out[2] == "é"  # the first byte of "é" waits for the second


def test_text_stream_holds_back_and_cuts_stop_strings():
    stream = TextStream(stop=["</end>"])
    pieces = [b"abc", b"</e", b"n", b"d> tail"]
    out = [stream.push(p) for p in pieces]
    assert out == ["abc", "", "", ""]
    assert stream.stop_word == "</end>" and stream.text == "abc"
    stream = TextStream(stop=["</end>"])
    assert [stream.push(p) for p in (b"a</", b"b")] == ["a", "</b"]  # a false alarm is released


def test_invalid_utf8_becomes_replacement_at_the_end():
    stream = TextStream()
    assert stream.push(b"ok\xe6\x97") == "ok"
    assert stream.flush() == "\ufffd"
