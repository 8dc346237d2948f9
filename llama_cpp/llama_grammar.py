"""llama-cpp-python's llama_grammar: `LlamaGrammar` (GBNF text or a JSON schema, compiled by llamactx's grammar
sampler on llguidance: llamactx.sampling.grammar) and `json_schema_to_gbnf`'s place, answered by llguidance
reading the schema itself."""

from __future__ import annotations

from llamactx.llama_cpp_options import LlamaGrammar

LLAMA_GRAMMAR_DEFAULT_ROOT = "root"

JSON_GBNF = r"""
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

ws ::= | " " | "\n" [ \t]{0,20}
"""  # llama.cpp's grammars/json.gbnf


def json_schema_to_gbnf(schema: str, prop_order: list[str] | None = None) -> str:
    """llama-cpp-python converts a schema to GBNF text here; llamactx's grammar engine reads JSON schemas
    directly (LlamaGrammar.from_json_schema), so there is no GBNF form to give."""
    raise NotImplementedError("json_schema_to_gbnf: llamactx compiles JSON schemas directly; use "
                              "LlamaGrammar.from_json_schema(schema)")


__all__ = ["JSON_GBNF", "LLAMA_GRAMMAR_DEFAULT_ROOT", "LlamaGrammar", "json_schema_to_gbnf"]
