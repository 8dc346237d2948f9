"""Where a chat prompt's messages start, in tokens (common/chat's `common_chat_msg_delimiters` and `split`, the
message spans llama-server computes for each task: server-common.cpp `find_message_spans`; the delimiters come
from the template's analysis, chat-diff-analyzer.cpp `detect_user_start_marker` / `detect_assistant_start_marker`).

llama-server ends a prompt chunk at the start of a user message and takes a context checkpoint there
(server-context.cpp, `spans.is_user_start`), so that a later request which shares the conversation up to a message
and then differs restores the state at that message's start instead of decoding the whole prompt again
(engine/checkpoints.py). The delimiters are the text that opens a user (and an assistant) message in the
template's output, found by rendering the template with and without one message and keeping the markers that
come before the message's text:

    delims = MessageDelimiters.from_template(template, vocab)     # gemma: "<start_of_turn>user", ...
    delims.user_starts(tokens)                                     # (1, 734, 1510): token positions
"""

from __future__ import annotations

import re
from dataclasses import dataclass

USER_MSG = "U_USER_MSG Hello END_U"  # chat-diff-analyzer.cpp's probe messages
USER_MSG_TWO = "V_USER_MSG Hello END_V"
ASSISTANT_MSG = "A_ASST_MSG I can help END_A"

_MARKER = re.compile(r"<[^>]*>|\[[^\]]*\]")  # segmentize_markers: <...> and [...] are markers, the rest text


def segmentize_markers(text: str) -> list[tuple[bool, str]]:
    """`text` as (is_marker, piece) segments: `<...>` and `[...]` are markers (chat-auto-parser-helpers.cpp
    segmentize_markers; an unclosed opener stays text)."""
    out: list[tuple[bool, str]] = []
    last = 0
    for m in _MARKER.finditer(text):
        if m.start() > last:
            out.append((False, text[last : m.start()]))
        out.append((True, m.group()))
        last = m.end()
    if last < len(text):
        out.append((False, text[last:]))
    return out


def _diff_right(left: str, right: str) -> str:
    """What `right` has that `left` lacks: both split into segments, their common leading and trailing segments
    dropped (calculate_diff_split's `right`)."""
    a, b = segmentize_markers(left), segmentize_markers(right)
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1
    j = 0
    while j < min(len(a), len(b)) - i and a[len(a) - 1 - j] == b[len(b) - 1 - j]:
        j += 1
    return "".join(s for _, s in b[i : len(b) - j])


def _render(template, messages: list[dict]) -> str | None:
    try:
        return template.render(messages, False)
    except ValueError:  # ChatTemplateError: a template that refuses these messages yields no delimiter
        return None


def detect_user_start(template) -> str:
    """The text that opens a user message (detect_user_start_marker): the template rendered with one user message
    against none (or, if an empty conversation fails, a user-assistant pair plus a user message), the part before
    the message's text, its leading end markers and blank text dropped. "" when none is found."""
    user = {"role": "user", "content": USER_MSG}
    assistant = {"role": "assistant", "content": ASSISTANT_MSG}
    a, b = _render(template, []), _render(template, [user])
    if a is None or b is None:
        two = [{"role": "user", "content": USER_MSG_TWO}, assistant]
        a, b = _render(template, two), _render(template, [*two, user])
        if a is None or b is None:
            return ""
    diff = _diff_right(a, b)
    if ASSISTANT_MSG in diff:
        diff = diff[diff.find(ASSISTANT_MSG) + len(ASSISTANT_MSG) :]
    if USER_MSG not in diff:
        return ""
    out, seen_marker = [], False
    for is_marker, piece in segmentize_markers(diff[: diff.find(USER_MSG)]):
        lower = piece.lower()
        if is_marker and not seen_marker and ("end" in lower or "close" in lower):
            continue
        if not is_marker and not seen_marker and not piece.strip():
            continue
        seen_marker |= is_marker
        out.append(piece)
    return "".join(out).strip()


def detect_assistant_start(template) -> str:
    """The text that opens an assistant message (detect_assistant_start_marker, without its reasoning tags): a
    user message alone against the same followed by an assistant message, the part before the reply's text."""
    user = {"role": "user", "content": USER_MSG}
    a = _render(template, [user])
    b = _render(template, [user, {"role": "assistant", "content": ASSISTANT_MSG}])
    if a is None or b is None:
        return ""
    diff = _diff_right(a, b)
    return diff[: diff.find(ASSISTANT_MSG)].strip() if ASSISTANT_MSG in diff else ""


@dataclass(frozen=True, slots=True)
class MessageDelimiters:
    """The token sequences that open an assistant and a user message (common_chat_msg_delimiters, in its order:
    assistant first); an empty one never matches."""

    assistant: tuple[int, ...] = ()
    user: tuple[int, ...] = ()

    @classmethod
    def from_template(cls, template, vocab) -> MessageDelimiters:
        """The delimiters of a `ChatTemplate`, tokenized without BOS and with special tokens parsed
        (common_chat_msg_delimiters::tokenize)."""
        def tokens(text: str) -> tuple[int, ...]:
            return tuple(vocab.tokenize(text, add_special=False, parse_special=True)) if text else ()

        return cls(tokens(detect_assistant_start(template)), tokens(detect_user_start(template)))

    def user_starts(self, tokens) -> tuple[int, ...]:
        """The positions in `tokens` where a user message starts (split's user spans: at each position the first
        delimiter that matches, assistant before user, names the span starting there)."""
        if not self.user:
            return ()
        first, n, out = self.user[0], len(self.user), []
        tokens = list(tokens)
        for i, t in enumerate(tokens):
            if t != first or tuple(tokens[i : i + n]) != self.user:
                continue
            if self.assistant and tuple(tokens[i : i + len(self.assistant)]) == self.assistant:
                continue
            out.append(i)
        return tuple(out)
