"""llama.cpp's path globs (common/common.cpp `glob_match`, tools/server/server-tools.cpp `path_glob_match`), as
the file_glob_search and grep_search tools match include / exclude patterns."""

from __future__ import annotations

import re


def glob_match(pattern: str, text: str) -> bool:
    """llama.cpp's glob (common.cpp): '*' any run without '/', '**' any run, '?' one character but '/',
    '[...]' a class ('!' negates, ranges a-z); everything else literal."""
    return re.fullmatch(_glob_regex(pattern), text, re.DOTALL) is not None


def _glob_regex(pattern: str) -> str:
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[" and (end := _class_end(pattern, i)) > 0:
            body = pattern[i + 1:end]
            neg = body.startswith("!")
            body = body[1:] if neg else body
            out.append("[" + ("^" if neg else "") + body.replace("\\", "\\\\").replace("^", "\\^") + "]")
            i = end + 1
            continue
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def _class_end(pattern: str, i: int) -> int:
    j = i + 1
    if j < len(pattern) and pattern[j] == "!":
        j += 1
    if j < len(pattern) and pattern[j] in "]-":
        j += 1
    end = pattern.find("]", j)
    return end


def path_glob_match(pattern: str, rel: str) -> bool:
    """No '/' in the pattern: it matches the basename at any depth; else the whole relative path, anchored
    with "**/" unless it already starts with "**" or '/'."""
    if "/" not in pattern:
        return glob_match(pattern, rel.rsplit("/", 1)[-1])
    if pattern == "**" or pattern.startswith(("**/", "/")):
        return glob_match(pattern, rel)
    return glob_match("**/" + pattern, rel)
