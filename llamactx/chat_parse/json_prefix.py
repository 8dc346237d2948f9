"""How far a text is the beginning of one JSON value: what a stream may already send of a tool call's arguments
(llama.cpp counterpart: the lenient JSON parser of common/peg-parser.cpp, which in a partial parse accepts a
value cut short at the end of the input, and common_chat_peg_mapper, which passes the text it matched on as
the call's arguments).

`scan(text, pos)` reads one JSON value from `pos`: (end, True) when the value is complete at `end`, (len(text),
False) when the text ends inside it with everything so far valid JSON, None as soon as the text cannot begin a
JSON value (a malformed call, whose text stays held back until the final parse makes it content).

`dumped_prefix(text, pos)` is the same beginning as json.dumps would write the whole value (for the families whose
parser re-serialises a call's arguments rather than passing them on as written): the text is cut back to where
it can be closed (inside a string value, after a complete member or element), closed, parsed and dumped, and the
closing characters taken off again. Whatever follows, the dump of the whole value begins with it.
"""

from __future__ import annotations

import json
import re

WS = " \t\r\n"
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_NUMBER_PREFIX = re.compile(r"-?(?:0|[1-9][0-9]*)?(?:\.[0-9]*)?(?:[eE][+-]?[0-9]*)?")
_LITERALS = ("true", "false", "null")


def _string_end(text: str, i: int) -> int | None:
    """The index after the string opening at `i`; len(text) + 1 when the text ends inside it; None for a raw
    control character (json's strict mode refuses it)."""
    n = len(text)
    j = i + 1
    while j < n:
        c = text[j]
        if c == "\\":
            j += 2
            continue
        if c == '"':
            return j + 1
        if c < " ":
            return None
        j += 1
    return n + 1


def _scalar_end(text: str, i: int) -> int | None:
    """The index after the number or literal at `i`; len(text) + 1 when it may still go on; None if invalid."""
    n = len(text)
    if text[i] in "tfn":
        for word in _LITERALS:
            if text.startswith(word, i):
                return i + len(word)
            if word.startswith(text[i:]):
                return n + 1
        return None
    j = i
    while j < n and text[j] in "+-.eE0123456789":
        j += 1
    token = text[i:j]
    if j == n:
        return n + 1 if _NUMBER_PREFIX.fullmatch(token) else None
    return j if _NUMBER.fullmatch(token) else None


def scan(text: str, pos: int = 0) -> tuple[int, bool] | None:
    """(end, complete) of the JSON value at `pos` (leading whitespace skipped), or None when the text there is
    not (the beginning of) one."""
    n = len(text)
    stack: list[str] = []
    expect = "value"  # value | key | colon | next (a comma or the container's end)
    i = pos
    while i < n:
        c = text[i]
        if c in WS:
            i += 1
            continue
        if expect == "value":
            if c in "{[":
                stack.append(c)
                expect = "key" if c == "{" else "value"
                i += 1
                if expect == "value":  # an empty array may end at once
                    j = _skip_ws(text, i)
                    if j < n and text[j] == "]":
                        stack.pop()
                        i = j + 1
                        expect = "next"
                elif (j := _skip_ws(text, i)) < n and text[j] == "}":
                    stack.pop()
                    i = j + 1
                    expect = "next"
                if expect == "next" and not stack:
                    return i, True
                continue
            end = _string_end(text, i) if c == '"' else _scalar_end(text, i) if c in "-0123456789tfn" else None
        elif expect == "key":
            end = _string_end(text, i) if c == '"' else None
        elif expect == "colon":
            if c != ":":
                return None
            i, expect = i + 1, "value"
            continue
        else:  # next
            if c == ",":
                i, expect = i + 1, "key" if stack[-1] == "{" else "value"
                continue
            if c != {"{": "}", "[": "]"}[stack[-1]]:
                return None
            stack.pop()
            i += 1
            if not stack:
                return i, True
            continue
        if end is None:
            return None
        if end > n:
            return n, False
        i = end
        if expect == "key":
            expect = "colon"
        elif not stack:
            return i, True
        else:
            expect = "next"
    return n, False


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in WS:
        i += 1
    return i


def dumped_prefix(text: str, pos: int = 0) -> str | None:
    """The beginning of json.dumps(value) (", " / ": " separators, non-ASCII as is) for the unfinished JSON
    object or array at `pos`; the whole dump once it is complete; None when the text there is not (the beginning
    of) one."""
    cut = _closable(text, pos)
    if cut is None:
        return None
    end, closers = cut
    try:
        dumped = json.dumps(json.loads(text[pos:end] + closers), ensure_ascii=False)
    except (json.JSONDecodeError, RecursionError):
        return None
    return dumped[:len(dumped) - len(closers)] if closers else dumped


def _closable(text: str, pos: int) -> tuple[int, str] | None:
    """(end, closers): the longest beginning text[pos:end] that `closers` make one complete JSON value; None
    when the value at `pos` is no object or array, or is malformed."""
    pos = _skip_ws(text, pos)
    if pos >= len(text) or text[pos] not in "{[" or scan(text, pos) is None:
        return None
    stack: list[str] = []
    safe: tuple[int, str] = (pos, "")
    i, expect, n = pos, "value", len(text)
    closers = lambda: "".join("}" if c == "{" else "]" for c in reversed(stack))  # noqa: E731
    while i < n:
        c = text[i]
        if c in WS:
            i += 1
            continue
        if expect == "value" and c in "{[":
            stack.append(c)
            i += 1
            expect = "key" if c == "{" else "value"
            safe = (i, closers())
            j = _skip_ws(text, i)
            if j < n and text[j] == ("}" if c == "{" else "]"):
                expect = "next"
            continue
        if expect in ("value", "key") and c == '"':
            end = _string_end(text, i)
            if end is None:
                return None
            if end > n:  # the text ends inside this string
                if expect == "value":
                    body = _whole_escapes(text[i:])
                    return i + len(body), '"' + closers()
                return safe
            i, expect = end, "colon" if expect == "key" else "next"
            if expect == "next":
                safe = (i, closers())
            continue
        if expect == "value":
            end = _scalar_end(text, i)
            if end is None or end > n:
                return safe
            i, expect = end, "next"
            safe = (i, closers())
            continue
        if expect == "colon":
            i, expect = i + 1, "value"
            continue
        if c == ",":  # next
            i, expect = i + 1, "key" if stack[-1] == "{" else "value"
            continue
        stack.pop()
        i += 1
        safe, expect = (i, closers()), "next"
        if not stack:
            return safe
    return safe


def _whole_escapes(body: str) -> str:
    """An unfinished string (from its quote) less a trailing escape that is not complete yet."""
    j = 1
    while j < len(body):
        if body[j] == "\\":
            step = 6 if body[j + 1:j + 2] == "u" else 2
            if j + step > len(body):
                return body[:j]
            j += step
            continue
        j += 1
    return body
