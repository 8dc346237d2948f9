"""llama.cpp's own chat-output parse cases, read from tests/test-chat.cpp (0c1e570) as it stands.

`test_template_output_peg_parsers` runs each case as a fluent chain,

    tst.test("<input>").reasoning_format(...).tools({...}).expect(message_assist_call).run();

under `auto tst = peg_tester("models/templates/X.jinja")`. This module reads those chains with a small evaluator of
the C++ they use (string literals, raw strings, the file's message and tool constants, `simple_assist_msg(...)` and
brace lists) and returns one `ParseCase` per `.run()`, so the Python tests check the very inputs and expectations
llama.cpp checks. A chain that uses something the evaluator does not know is returned with `unsupported` set (and
the test that wants it fails, naming it), never dropped silently.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_TOKEN = re.compile(r'''
    (?P<ws>\s+|//[^\n]*|/\*.*?\*/)
  | (?P<raw>R"(?P<delim>[^(\s]*)\((?P<body>.*?)\)(?P=delim)")
  | (?P<str>"(?:[^"\\\n]|\\.)*")
  | (?P<chr>'(?:[^'\\\n]|\\.)')
  | (?P<num>-?\d+(?:\.\d+)?)
  | (?P<id>[A-Za-z_][A-Za-z0-9_]*(?:::[A-Za-z_][A-Za-z0-9_]*)*)
  | (?P<op>[{}()\[\],.;=&<>:*+!|-])
''', re.S | re.X)

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "0": "\0"}


class Unsupported(Exception):
    pass


def _unescape(body: str) -> str:
    out, i = [], 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        n = body[i + 1]
        if n == "x":
            m = re.match(r"[0-9a-fA-F]+", body[i + 2:])
            out.append(chr(int(m.group(0), 16)))
            i += 2 + len(m.group(0))
        elif n == "u":
            out.append(chr(int(body[i + 2:i + 6], 16)))
            i += 6
        else:
            out.append(_ESCAPES[n])
            i += 2
    return "".join(out)


def tokenize(src: str) -> list[tuple[str, Any]]:
    toks, pos = [], 0
    while pos < len(src):
        m = _TOKEN.match(src, pos)
        if m is None:
            raise Unsupported(f"cannot tokenize at {src[pos:pos + 30]!r}")
        pos = m.end()
        kind = m.lastgroup
        if kind == "ws":
            continue
        if kind == "delim":
            kind = "raw"
        if kind == "raw":
            toks.append(("str", m.group("body")))
        elif kind == "str":
            toks.append(("str", _unescape(m.group(0)[1:-1])))
        else:
            toks.append((kind, m.group(0)))
    return toks


def _msg(content: str = "", reasoning: str = "", name: str = "", arguments: str = "", id: str = "") -> dict:
    calls = [{"name": name, "arguments": arguments, "id": id}] if name or id else []
    return {"role": "assistant", "content": content, "reasoning_content": reasoning, "tool_calls": calls}


def _multi(reasoning: str, content: str, calls: list) -> dict:
    return {"role": "assistant", "content": content, "reasoning_content": reasoning,
            "tool_calls": [{"name": n, "arguments": a, "id": ""} for n, a in calls]}


FUNCTIONS = {
    "simple_assist_msg": _msg,
    "message_with_tool_calls": lambda n, a: _msg("", "", n, a),
    "message_with_tool_calls_and_reasoning": lambda n, a, r: _msg("", r, n, a),
    "message_with_content_and_tool_call": lambda c, n, a: _msg(c, "", n, a),
    "message_with_reasoning_and_tool_call": lambda r, n, a: _msg("", r, n, a),
    "message_with_reasoning_content_and_multiple_tool_calls": _multi,
}


class _Evaluator:
    def __init__(self, toks: list[tuple[str, Any]], env: dict[str, Any]):
        self.toks, self.i, self.env = toks, 0, env

    def peek(self, k: int = 0) -> tuple[str, Any]:
        return self.toks[self.i + k] if self.i + k < len(self.toks) else ("eof", None)

    def take(self, value: str | None = None) -> tuple[str, Any]:
        tok = self.peek()
        if value is not None and tok[1] != value:
            raise Unsupported(f"expected {value!r}, got {tok[1]!r}")
        self.i += 1
        return tok

    def expr(self) -> Any:
        value = self.primary()
        while self.peek()[1] == "+":  # std::string concatenation
            self.take()
            value = value + self.primary()
        return value

    def primary(self) -> Any:
        kind, value = self.peek()
        if kind == "str":
            parts = []
            while self.peek()[0] == "str":
                parts.append(self.take()[1])
            return "".join(parts)
        if kind == "num":
            self.take()
            return float(value) if "." in value else int(value)
        if value == "{":
            return self.brace()
        if kind == "id":
            self.take()
            if value in ("std::string", "json", "common_chat_tool_call", "common_chat_msg") and self.peek()[1] in "({":
                return self.expr() if self.peek()[1] == "{" else self.call_args()[0]
            if self.peek()[1] == "(":
                fn = FUNCTIONS.get(value)
                if fn is None:
                    raise Unsupported(f"call of {value}")
                return fn(*self.call_args())
            if value in self.env:
                return self.env[value]
            if value in ("true", "false"):
                return value == "true"
            if value.startswith("COMMON_"):
                return value
            raise Unsupported(f"identifier {value}")
        raise Unsupported(f"token {value!r}")

    def brace(self) -> list[Any]:
        self.take("{")
        items = []
        while self.peek()[1] != "}":
            items.append(self.expr())
            if self.peek()[1] == ",":
                self.take()
        self.take("}")
        return items

    def call_args(self) -> list[Any]:
        self.take("(")
        args = []
        while self.peek()[1] != ")":
            args.append(self.expr())
            if self.peek()[1] == ",":
                self.take()
        self.take(")")
        return args


def _tool(name: str, description: str, parameters: str) -> dict:
    return {"type": "function", "function": {"name": name, "description": description,
                                             "parameters": json.loads(parameters)}}


def _constants(src: str) -> dict[str, Any]:
    """The file's `static common_chat_tool X{...};` and `const common_chat_msg X = ...;` constants."""
    env: dict[str, Any] = {}
    for m in re.finditer(r"^static common_chat_tool (\w+)\{(.*?)^\};", src, re.S | re.M):
        args = _Evaluator(tokenize("{" + m.group(2) + "}"), env).brace()
        env[m.group(1)] = _tool(*args[:3])
    for m in re.finditer(r"^const common_chat_msg (\w+)\s*=\s*(.*?);\s*$", src, re.S | re.M):
        try:
            env[m.group(1)] = _Evaluator(tokenize(m.group(2)), env).expr()
        except Unsupported:
            pass
    for m in re.finditer(r'const char \* (\w+) = (R"\((.*?)\)");', src, re.S):
        env[m.group(1)] = m.group(3)
    env["message_user"] = {"role": "user", "content": "Hey there!"}
    return env


@dataclass
class ParseCase:
    line: int
    template: str
    input: str = ""
    reasoning_format: str = "none"
    enable_thinking: bool = True
    tools: list[dict] = field(default_factory=list)
    parallel_tool_calls: bool = False
    tool_choice: str = "auto"
    messages: list[dict] | None = None
    add_generation_prompt: bool = True
    continuation: str = ""
    json_schema: str = ""
    is_partial: bool = False
    expect: dict = field(default_factory=lambda: _msg())
    unsupported: str = ""

    @property
    def id(self) -> str:
        return f"{Path(self.template).stem}:{self.line}"


_REASONING = {"COMMON_REASONING_FORMAT_NONE": "none", "COMMON_REASONING_FORMAT_AUTO": "auto",
              "COMMON_REASONING_FORMAT_DEEPSEEK": "deepseek",
              "COMMON_REASONING_FORMAT_DEEPSEEK_LEGACY": "deepseek-legacy"}
_CHOICE = {"COMMON_CHAT_TOOL_CHOICE_AUTO": "auto", "COMMON_CHAT_TOOL_CHOICE_REQUIRED": "required",
           "COMMON_CHAT_TOOL_CHOICE_NONE": "none"}


def _apply(case: ParseCase, method: str, args: list[Any]) -> None:
    a = args[0] if args else True
    if method == "reasoning_format":
        case.reasoning_format = _REASONING[a]
    elif method == "tools":
        case.tools = [_tool(*t[:3]) if isinstance(t, list) else t for t in a]
    elif method == "enable_thinking":
        case.enable_thinking = bool(a)
    elif method == "parallel_tool_calls":
        case.parallel_tool_calls = bool(a)
    elif method == "add_generation_prompt":
        case.add_generation_prompt = bool(a)
    elif method == "continue_final_message":
        case.continuation = a
    elif method == "json_schema":
        case.json_schema = a
    elif method == "is_partial":
        case.is_partial = bool(a)
    elif method == "tool_choice":
        case.tool_choice = _CHOICE[a]
    elif method == "messages":
        case.messages = list(a)
    elif method == "expect":
        case.expect = json.loads(json.dumps(a))
    elif method == "expect_content":
        case.expect["content"] = a
    elif method == "expect_reasoning":
        case.expect["reasoning_content"] = a
    elif method == "expect_tool_calls":
        case.expect["tool_calls"] = [{"name": c[0], "arguments": c[1], "id": c[2] if len(c) > 2 and isinstance(
            c[2], str) else ""} for c in a]
    elif method in ("expect_reconstruction", "run"):
        pass
    else:
        raise Unsupported(f"method .{method}()")


def load_cases(llamacpp_src: Path) -> list[ParseCase]:
    """Every `.run()` chain of test_template_output_peg_parsers, in file order."""
    path = llamacpp_src / "tests" / "test-chat.cpp"
    src = path.read_text()
    env = _constants(src)
    start = src.index("static void test_template_output_peg_parsers(")
    end = src.index("static void test_template_generation_prompt(")
    body = re.sub(r"(?m)^[ \t]*//.*$", "", src[start:end])  # commented-out cases are not cases
    line0 = src[:start].count("\n") + 1
    testers: dict[str, str] = {}
    loop_paths: list[str] = []
    cases = []
    for m in re.finditer(r"for \(const auto & path\s*:\s*\{(.*?)\}\)|auto (\w+)\s*=\s*peg_tester\((\"[^\"]*\"|path)"
                         r"|\b(\w+)\.test\(|" + _DECLARATION + "|" + _MEMBER, body, re.S):
        if m.group("decl") or m.group("obj"):
            _declare(m, body, env)
            continue
        if m.group(1) is not None:
            loop_paths = re.findall(r'"([^"]+)"', m.group(1))
            continue
        if m.group(2) is not None:
            testers[m.group(2)] = m.group(3).strip('"') if m.group(3) != "path" else "|".join(loop_paths)
            continue
        name = m.group(4)
        if name not in testers:
            continue
        stmt_end = _statement_end(body, m.end())
        line = line0 + body[:m.start()].count("\n")
        for template in testers[name].split("|"):
            cases.append(_case(template, line, body[m.start() + len(name):stmt_end], env))
    return cases


# the test body's own variables: `const std::string x = ...;`, `common_chat_msg m;` then `m.role = ...;`,
# `static common_chat_tool t{...};` (read in file order, so a later block's variable of the same name wins)
_DECLARATION = (r"(?:static\s+)?(?:const\s+)?(?P<type>std::string|auto|common_chat_msg|common_chat_tool)\s+"
                r"(?P<decl>\w+)\s*(?P<how>=|\{|;)")
_MEMBER = r"\b(?P<obj>\w+)\.(?P<field>role|content|reasoning_content|tool_call_id)\s*="


def _declare(m: re.Match, body: str, env: dict[str, Any]) -> None:
    """Evaluate one declaration or member assignment into `env` (one the evaluator cannot read is left out: a
    case that uses it then reports the identifier)."""
    end = _expression_end(body, m.end())
    try:
        if m.group("obj"):
            if isinstance(env.get(m.group("obj")), dict):
                env[m.group("obj")][m.group("field")] = _Evaluator(tokenize(body[m.end():end]), env).expr()
            return
        name, how = m.group("decl"), m.group("how")
        env.pop(name, None)
        if how == ";":
            if m.group("type") == "common_chat_msg":
                env[name] = {"role": "", "content": "", "reasoning_content": "", "tool_calls": []}
        elif how == "{":
            args = _Evaluator(tokenize("{" + body[m.end():end]), env).brace()
            env[name] = _tool(*args[:3]) if m.group("type") == "common_chat_tool" else args
        else:
            env[name] = _Evaluator(tokenize(body[m.end():end]), env).expr()
    except (Unsupported, KeyError, IndexError, TypeError, json.JSONDecodeError):
        pass


def _expression_end(body: str, pos: int) -> int:
    """The index of the `;` that ends the statement at `pos` (strings skipped, brackets balanced)."""
    depth = 0
    while pos < len(body):
        m = _TOKEN.match(body, pos)
        if m is None:
            pos += 1
            continue
        tok = m.group(0)
        if m.lastgroup == "op":
            if tok in "({[":
                depth += 1
            elif tok in ")}]":
                depth -= 1
            elif tok == ";" and depth <= 0:
                return pos
        pos = m.end()
    return pos


def _statement_end(body: str, pos: int) -> int:
    """The index of the `;` that ends the chain started before `pos` (skipping strings)."""
    toks_src = body[pos:]
    m = re.search(r'\.run\(\)\s*;', toks_src)
    return pos + m.end()


def _case(template: str, line: int, chain: str, env: dict[str, Any]) -> ParseCase:
    case = ParseCase(line, template)
    try:
        ev = _Evaluator(tokenize(chain), env)
        while ev.peek()[1] == ".":
            ev.take(".")
            method = ev.take()[1]
            args = ev.call_args()
            if method == "test":
                case.input = args[0]
            else:
                _apply(case, method, args)
    except (Unsupported, KeyError, IndexError, json.JSONDecodeError) as e:
        case.unsupported = f"{type(e).__name__}: {e}"
    return case
