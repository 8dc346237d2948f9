"""The samplers a chat request adds to its chain: the tool-call grammar and the reasoning budget (llama.cpp
counterpart: common/sampling.cpp common_sampler_init, which builds `grmr` from common_chat_params' grammar,
grammar_lazy and grammar_triggers, and `rbudget` from the template's thinking tags when --reasoning-budget or
reasoning_budget_tokens is >= 0; tools/server/server-common.cpp passes them on).

- `tool_grammar_sampler(vocab, grammar, params)`: a GrammarSampler for tool_calls.ToolGrammar's Lark, wrapped in a
  LazyGrammarSampler when it has trigger words (which also knows whether the reply starts inside a thinking
  block, from the generation prompt in `params`).
- `reasoning_budget(vocab, params, budget, message)`: the ReasoningBudgetSampler for the family's thinking tags,
  or None when the family has none or the budget is unlimited (-1). It goes first in the chain.
"""

from __future__ import annotations

from llamactx.chat_parse import ChatParams
from llamactx.sampling.grammar import GrammarSampler
from llamactx.sampling.lazy_grammar import LazyGrammarSampler
from llamactx.sampling.reasoning_budget import ReasoningBudgetSampler
from llamactx.tool_calls import ToolGrammar
from llamactx.vocab import Vocab

# formats whose llama.cpp parser gives the budget more end tags than the parse needs; the first is the one forced
# (common/parsers/qwen3-coder.cpp: "the newline variant comes first so it is included in the forced message")
BUDGET_END_TAGS = {"qwen3-coder": ("\n</think>", "</think>", "<tool_call>")}


def opens_thinking(params: ChatParams | None) -> bool:
    """Whether the generation prompt leaves the reply inside a thinking block (Qwen3.5's "<think>\\n")."""
    if params is None or not params.thinking_start or not params.extract_reasoning:
        return False
    gp = params.generation_prompt
    at = gp.rfind(params.thinking_start)
    return at >= 0 and not any(end in gp[at:] for end in params.thinking_end)


def tool_grammar_sampler(vocab: Vocab, grammar: ToolGrammar, params: ChatParams | None = None):
    """The sampler of a tool-call grammar (compiled by llguidance: call it off the event loop). Raises
    GrammarError when a tool's parameters are not a schema the engine can compile."""
    sampler = GrammarSampler.from_lark(vocab, grammar.lark)
    if not grammar.triggers:
        return sampler
    return LazyGrammarSampler(sampler, grammar.triggers, params.thinking_end if params else (),
                              opens_thinking(params))


def reasoning_budget(vocab: Vocab, params: ChatParams | None, budget: int,
                     message: str = "") -> ReasoningBudgetSampler | None:
    """The budget sampler for `params`' thinking tags, None without tags or with budget -1 (no limit)."""
    if params is None or budget < 0 or not params.thinking_start or not params.thinking_end:
        return None
    ends = BUDGET_END_TAGS.get(params.format, params.thinking_end)
    return ReasoningBudgetSampler.from_tags(vocab, params.thinking_start, ends, budget, message,
                                            params.generation_prompt)
