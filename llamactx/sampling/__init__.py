"""Sampling: a chain of small samplers turning one row of logits into a token (src/llama-sampler.cpp,
common/sampling.cpp).

    chain.py        SamplerChain (llama_sampler_chain + common_sampler); the names below
    params.py       SamplingParams (common_params_sampling) and its validation
    samplers.py     greedy, dist, top-k/p, min-p, typical, temperature, XTC, top-n-sigma, logit bias
    penalties.py    repetition / frequency / presence penalties
    dry.py          DRY (don't repeat yourself)
    mirostat.py     mirostat v1 and v2
    rng.py          std::mt19937 and llama.cpp's seeding
    token_data.py   TokenDataArray (llama_token_data_array) and the Sampler protocol
    grammar.py      GrammarSampler on llguidance (GBNF, Lark, JSON schema); imported on first use
    lazy_grammar.py a lazy grammar: free text until a trigger word, then the grammar (llama-grammar's triggers)
    reasoning_budget.py  the thinking budget: the end-of-thinking tag forced after N tokens (reasoning-budget.cpp)
    kernels.py      numba loops of the hot samplers (top-k selection, top-p / min-p cuts, dist's draw)
"""

from llamactx.sampling.chain import *  # noqa: F403
from llamactx.sampling.chain import __all__  # noqa: F401
