"""The edit_file tool's text replacement (llama.cpp's tools/server/server-tools.cpp, `server_tool_edit_file`):
exact replacements matched against the original content, each unique and disjoint; when some old_text only
matches after normalizing whitespace and typographic punctuation, matching runs on the normalized text and the
lines no edit touches are kept byte for byte.

    apply_edits("a\\nb\\n", [("b", "c")], "notes.txt")   # -> "a\\nc\\n", or raises EditError
"""

from __future__ import annotations

from dataclasses import dataclass

from llamactx.errors import LlamactxError

# typographic characters -> ASCII (normalize_line_for_fuzzy_match)
_FUZZY = {**{c: "'" for c in "\u2018\u2019\u201a\u201b"}, **{c: '"' for c in "\u201c\u201d\u201e\u201f"},
          **{chr(c): "-" for c in range(0x2010, 0x2016)}, "\u2212": "-", "\u00a0": " ",
          **{chr(c): " " for c in range(0x2002, 0x200b)}, "\u202f": " ", "\u205f": " ", "\u3000": " "}
_FUZZY_TABLE = str.maketrans(_FUZZY)


class EditError(LlamactxError):
    """An edit that cannot be applied; the message is the tool's "error"."""


@dataclass(slots=True)
class _Match:
    edit_index: int
    start: int  # offset into the base content
    length: int
    new_text: str


def normalize_for_fuzzy_match(content: str) -> str:
    """Per line: trailing spaces, tabs and CRs dropped, typographic quotes, dashes and spaces made ASCII; the
    line count and order never change."""
    return "\n".join(line.rstrip(" \t\r").translate(_FUZZY_TABLE) for line in content.split("\n"))


def apply_edits(original: str, edits: list[tuple[str, str]], path: str) -> str:
    """The new content for `edits` [(old_text, new_text)] applied to `original`. Raises EditError when an
    old_text is not found, is not unique, two edits overlap, or nothing changes."""
    any_fuzzy = False
    for i, (old, _) in enumerate(edits):
        if old in original:
            continue
        if normalize_for_fuzzy_match(old) not in normalize_for_fuzzy_match(original):
            raise EditError(f"could not find edits[{i}].old_text in {path}, it must match the file's current "
                            "content exactly")
        any_fuzzy = True
    base = normalize_for_fuzzy_match(original) if any_fuzzy else original
    matches = []
    for i, (old, new) in enumerate(edits):
        needle = normalize_for_fuzzy_match(old) if any_fuzzy else old
        # uniqueness is always judged on normalized text: a whitespace-only duplicate still counts
        n = _count(normalize_for_fuzzy_match(original), normalize_for_fuzzy_match(old))
        if n > 1:
            raise EditError(f"found {n} occurrences of edits[{i}].old_text in {path}, it must be unique")
        matches.append(_Match(i, base.find(needle), len(needle), new))
    matches.sort(key=lambda m: m.start)
    for a, b in zip(matches, matches[1:], strict=False):
        if a.start + a.length > b.start:
            raise EditError(f"edits[{a.edit_index}] and edits[{b.edit_index}] overlap in {path}; merge them into "
                            "one edit or target disjoint regions")
    new_content = _preserving_unchanged_lines(original, base, matches) if any_fuzzy else \
        _replace(base, matches, 0)
    if new_content == original:
        raise EditError("no changes made: the replacement(s) produced identical content")
    return new_content


def _count(content: str, needle: str) -> int:
    return content.count(needle) if needle else 0


def _replace(content: str, matches: list[_Match], offset: int) -> str:
    """`matches` ascending and disjoint, their offsets relative to `offset`."""
    for m in reversed(matches):
        at = m.start - offset
        content = content[:at] + m.new_text + content[at + m.length:]
    return content


def _line_spans(content: str) -> list[tuple[int, int]]:
    spans, offset = [], 0
    for line in _split_keep_newline(content):
        spans.append((offset, offset + len(line)))
        offset += len(line)
    return spans


def _split_keep_newline(content: str) -> list[str]:
    """Lines split on '\\n' only, each with its '\\n' (the last without one, when the text does not end in it)."""
    parts = content.split("\n")
    lines = [p + "\n" for p in parts[:-1]]
    return lines + ([parts[-1]] if parts[-1] else [])


def _line_range(spans: list[tuple[int, int]], start: int, length: int) -> tuple[int, int]:
    """The lines [first, last) a replacement at [start, start + length) touches."""
    first = next((i for i, (a, b) in enumerate(spans) if a <= start < b), len(spans) - 1)
    last = first
    while last < len(spans) - 1 and spans[last][1] < start + length:
        last += 1
    return first, last + 1


def _preserving_unchanged_lines(original: str, base: str, matches: list[_Match]) -> str:
    """Like _replace on the normalized `base`, but every line no edit touches comes from `original`."""
    original_lines, spans = _split_keep_newline(original), _line_spans(base)
    groups: list[list] = []  # [first_line, end_line, matches]
    for m in matches:
        first, end = _line_range(spans, m.start, m.length)
        if groups and first < groups[-1][1]:
            groups[-1][1] = max(groups[-1][1], end)
            groups[-1][2].append(m)
        else:
            groups.append([first, end, [m]])
    out, line = [], 0
    for first, end, group in groups:
        out += original_lines[line:first]
        lo, hi = spans[first][0], spans[end - 1][1]
        out.append(_replace(base[lo:hi], group, lo))
        line = end
    out += original_lines[line:]
    return "".join(out)
