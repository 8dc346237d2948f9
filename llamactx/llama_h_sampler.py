"""llama.h's sampler chain under its own names (llama_sampler_chain_*, llama_sampler_init_*, llama_sampler_sample
...; src/llama-sampler.cpp), on llamactx's samplers (llamactx.sampling): a `llama_sampler *` is a SamplerChain or
one sampler. llamactx.llama_h, the rest of llama.h, re-exports these names.
"""

from __future__ import annotations

from dataclasses import dataclass

from llamactx.context import Context
from llamactx.sampling import (
    DistSampler,
    GreedySampler,
    LogitBiasSampler,
    MinPSampler,
    MirostatSampler,
    MirostatV2Sampler,
    PenaltiesSampler,
    SamplerChain,
    TempExtSampler,
    TempSampler,
    TopKSampler,
    TopNSigmaSampler,
    TopPSampler,
    TypicalSampler,
    XtcSampler,
)
from llamactx.sampling.rng import LLAMA_DEFAULT_SEED


@dataclass
class llama_sampler_chain_params:  # noqa: N801 -- llama.h's struct name
    no_perf: bool = True


def llama_sampler_chain_default_params() -> llama_sampler_chain_params:
    return llama_sampler_chain_params()


def llama_sampler_chain_init(params: llama_sampler_chain_params | None = None) -> SamplerChain:
    return SamplerChain()


def llama_sampler_chain_add(chain: SamplerChain, smpl) -> None:
    chain.add(smpl)


def llama_sampler_chain_get(chain: SamplerChain, i: int):
    return chain.samplers[i]


def llama_sampler_chain_n(chain: SamplerChain) -> int:
    return len(chain.samplers)


def llama_sampler_chain_remove(chain: SamplerChain, i: int):
    return chain.samplers.pop(i)


def llama_sampler_init_greedy():
    return GreedySampler()


def llama_sampler_init_dist(seed: int):
    return DistSampler(int(seed))


def llama_sampler_init_top_k(k: int):
    return TopKSampler(int(k))


def llama_sampler_init_top_p(p: float, min_keep: int):
    return TopPSampler(float(p), int(min_keep))


def llama_sampler_init_min_p(p: float, min_keep: int):
    return MinPSampler(float(p), int(min_keep))


def llama_sampler_init_typical(p: float, min_keep: int):
    return TypicalSampler(float(p), int(min_keep))


def llama_sampler_init_temp(t: float):
    return TempSampler(float(t))


def llama_sampler_init_temp_ext(t: float, delta: float, exponent: float):
    return TempExtSampler(float(t), float(delta), float(exponent))


def llama_sampler_init_xtc(p: float, t: float, min_keep: int, seed: int):
    return XtcSampler(float(p), float(t), int(min_keep), int(seed))


def llama_sampler_init_top_n_sigma(n: float):
    return TopNSigmaSampler(float(n))


def llama_sampler_init_mirostat(n_vocab: int, seed: int, tau: float, eta: float, m: int):
    return MirostatSampler(int(n_vocab), int(seed), float(tau), float(eta), int(m))


def llama_sampler_init_mirostat_v2(seed: int, tau: float, eta: float):
    return MirostatV2Sampler(int(seed), float(tau), float(eta))


def llama_sampler_init_penalties(penalty_last_n: int, penalty_repeat: float, penalty_freq: float,
                                 penalty_present: float, n_vocab: int | None = None):
    """llama.h's penalties sampler; `n_vocab` (which the C sampler does not need) sizes the counts here, and
    defaults to the largest token id seen."""
    return PenaltiesSampler(int(n_vocab or 1 << 31), int(penalty_last_n), float(penalty_repeat),
                            float(penalty_freq), float(penalty_present))


def llama_sampler_init_logit_bias(n_vocab: int, n_logit_bias: int, logit_bias) -> LogitBiasSampler:
    """`logit_bias`: (token, bias) pairs or objects with .token / .bias (llama_logit_bias)."""
    pairs = [(int(b.token), float(b.bias)) if hasattr(b, "token") else (int(b[0]), float(b[1]))
             for b in list(logit_bias)[:n_logit_bias]]
    return LogitBiasSampler(int(n_vocab), pairs)


def llama_sampler_init_grammar(vocab, grammar_str: bytes | str, grammar_root: bytes | str = b"root"):
    from llamactx.sampling.grammar import GrammarSampler

    text = grammar_str.decode() if isinstance(grammar_str, bytes) else grammar_str
    return GrammarSampler.from_gbnf(vocab, text)


def llama_sampler_name(smpl) -> bytes:
    return smpl.name.encode()


def llama_sampler_accept(smpl, token: int) -> None:
    smpl.accept(int(token))


def llama_sampler_reset(smpl) -> None:
    smpl.reset()


def llama_sampler_free(smpl) -> None:
    """Nothing to free."""


def llama_sampler_get_seed(smpl) -> int:
    if isinstance(smpl, SamplerChain):
        return smpl.get_seed()
    return int(getattr(smpl, "seed_cur", LLAMA_DEFAULT_SEED))


def llama_sampler_sample(smpl, ctx: Context, idx: int) -> int:
    """Sample from output `idx` of `ctx` and accept the token (llama_sampler_sample)."""
    chain = smpl if isinstance(smpl, SamplerChain) else SamplerChain([smpl])
    return chain.sample(ctx, int(idx))


