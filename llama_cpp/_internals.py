"""llama-cpp-python's llama_cpp._internals: LlamaModel, LlamaContext, LlamaBatch and LlamaSampler, the object
wrappers its Llama and its users build on, over llama.h's functions (llamactx.llama_h)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from llamactx import llama_h as C
from llamactx.llama_cpp_options import LlamaTokenizer


class LlamaModel:
    """A loaded model (`.model`: the llamactx Model, None once closed). Closing it closes its contexts."""

    def __init__(self, *, path_model: str, params: C.llama_model_params, verbose: bool = True):
        self.path_model, self.params, self.verbose = path_model, params, verbose
        self.model = C.llama_model_load_from_file(path_model, params)
        self.vocab = self.model.vocab
        self._contexts: list[LlamaContext] = []

    def close(self) -> None:
        for ctx in self._contexts:
            ctx.close()
        self._contexts.clear()
        if self.model is not None:
            self.model.close()
        self.model = None

    def __del__(self) -> None:
        self.close()

    def n_vocab(self) -> int:
        return self.vocab.n_tokens

    def n_ctx_train(self) -> int:
        return self.model.hparams.n_ctx_train

    def n_embd(self) -> int:
        return self.model.hparams.n_embd

    def desc(self) -> str:
        return self.model.desc()

    def size(self) -> int:
        return C.llama_model_size(self.model)

    def token_bos(self) -> int:
        return self.vocab.bos

    def token_eos(self) -> int:
        return self.vocab.eos

    def token_cls(self) -> int:
        return self.vocab.bos

    def token_sep(self) -> int:
        return self.vocab.sep

    def token_nl(self) -> int:
        return self.vocab.nl

    def token_get_text(self, token: int) -> str:
        return self.vocab.token_get_text(token)

    def add_bos_token(self) -> bool:
        return bool(self.vocab.add_bos)

    def add_eos_token(self) -> bool:
        return bool(self.vocab.add_eos)

    def tokenize(self, text: bytes, add_bos: bool, special: bool) -> list[int]:
        return self.vocab.tokenize(text.decode("utf-8", "replace"), add_special=add_bos, parse_special=special)

    def token_to_piece(self, token: int, special: bool = False) -> bytes:
        return self.vocab.token_to_piece(int(token), special=special)

    def detokenize(self, tokens: Sequence[int], special: bool = False) -> bytes:
        return _Detok(self.vocab).detokenize(tokens, special=special)

    def metadata(self) -> dict[str, str]:
        return {k: str(v) for k, v in self.model.meta.items() if isinstance(v, (str, int, float, bool))}


class _Detok(LlamaTokenizer):
    def __init__(self, vocab):
        self._vocab = vocab


class LlamaContext:
    """A context of `model` (`.ctx`: the llamactx Context, None once closed or its model closed)."""

    def __init__(self, *, model: LlamaModel, params: C.llama_context_params, verbose: bool = True):
        self.model, self.params, self.verbose = model, params, verbose
        self.ctx = C.llama_init_from_model(model.model, params)
        self.memory = self.ctx.memory
        model._contexts.append(self)

    def close(self) -> None:
        if self.ctx is not None:
            self.ctx.close()
        self.ctx = None

    def __del__(self) -> None:
        self.close()

    def n_ctx(self) -> int:
        return C.llama_n_ctx(self.ctx)

    def pooling_type(self) -> int:
        return C.llama_pooling_type(self.ctx)

    def kv_cache_clear(self) -> None:
        C.llama_memory_clear(self.memory, True)

    def kv_cache_seq_rm(self, seq_id: int, p0: int, p1: int) -> bool:
        return C.llama_memory_seq_rm(self.memory, seq_id, p0, p1)

    def kv_cache_seq_cp(self, seq_id_src: int, seq_id_dst: int, p0: int, p1: int) -> None:
        C.llama_memory_seq_cp(self.memory, seq_id_src, seq_id_dst, p0, p1)

    def kv_cache_seq_keep(self, seq_id: int) -> None:
        C.llama_memory_seq_keep(self.memory, seq_id)

    def kv_cache_seq_shift(self, seq_id: int, p0: int, p1: int, shift: int) -> None:
        C.llama_memory_seq_add(self.memory, seq_id, p0, p1, shift)

    def get_state_size(self) -> int:
        return C.llama_state_get_size(self.ctx)

    def decode(self, batch: LlamaBatch) -> None:
        """Decode; RuntimeError with llama_decode's status when it is not 0, as llama-cpp-python."""
        status = C.llama_decode(self.ctx, batch.batch)
        if status != 0:
            raise RuntimeError(f"llama_decode returned {status}")

    def encode(self, batch: LlamaBatch) -> None:
        status = C.llama_encode(self.ctx, batch.batch)
        if status != 0:
            raise RuntimeError(f"llama_encode returned {status}")

    def get_logits(self) -> np.ndarray:
        return C.llama_get_logits(self.ctx)

    def get_logits_ith(self, i: int) -> np.ndarray:
        return C.llama_get_logits_ith(self.ctx, i)

    def get_embeddings(self) -> np.ndarray:
        return C.llama_get_embeddings(self.ctx)

    def get_embeddings_seq(self, seq_id: int) -> np.ndarray:
        return C.llama_get_embeddings_seq(self.ctx, seq_id)


class LlamaBatch:
    """A batch of up to `n_tokens` tokens (`.batch`: the llamactx Batch)."""

    def __init__(self, *, n_tokens: int, embd: int, n_seq_max: int, verbose: bool = True):
        self._n_tokens, self.embd, self.n_seq_max, self.verbose = n_tokens, embd, n_seq_max, verbose
        self.batch = C.llama_batch_init(n_tokens, embd, n_seq_max)

    def close(self) -> None:
        self.batch = None

    def n_tokens(self) -> int:
        return self.batch.n_tokens

    def reset(self) -> None:
        self.batch.n_tokens = 0

    def set_batch(self, batch: Sequence[int], n_past: int, logits_all: bool) -> None:
        """`batch` as sequence 0 from position n_past; logits for every token with logits_all, else the last."""
        self.reset()
        n = len(batch)
        for i, token in enumerate(batch):
            self.batch.add(int(token), n_past + i, (0,), logits_all or i == n - 1)

    def add_sequence(self, batch: Sequence[int], seq_id: int, logits_all: bool) -> None:
        n = len(batch)
        for i, token in enumerate(batch):
            self.batch.add(int(token), i, (seq_id,), logits_all or i == n - 1)


class LlamaSampler:
    """A sampler chain built by add_* calls (llama_sampler_chain_* over llamactx's samplers)."""

    def __init__(self):
        self.sampler = C.llama_sampler_chain_init(C.llama_sampler_chain_default_params())

    def _add(self, smpl) -> None:
        C.llama_sampler_chain_add(self.sampler, smpl)

    def add_greedy(self) -> None:
        self._add(C.llama_sampler_init_greedy())

    def add_dist(self, seed: int) -> None:
        self._add(C.llama_sampler_init_dist(seed))

    def add_top_k(self, k: int) -> None:
        self._add(C.llama_sampler_init_top_k(k))

    def add_top_p(self, p: float, min_keep: int) -> None:
        self._add(C.llama_sampler_init_top_p(p, min_keep))

    def add_min_p(self, p: float, min_keep: int) -> None:
        self._add(C.llama_sampler_init_min_p(p, min_keep))

    def add_typical(self, p: float, min_keep: int) -> None:
        self._add(C.llama_sampler_init_typical(p, min_keep))

    def add_temp(self, temp: float) -> None:
        self._add(C.llama_sampler_init_temp(temp))

    def add_temp_ext(self, t: float, delta: float, exponent: float) -> None:
        self._add(C.llama_sampler_init_temp_ext(t, delta, exponent))

    def add_mirostat(self, n_vocab: int, seed: int, tau: float, eta: float, m: int) -> None:
        self._add(C.llama_sampler_init_mirostat(n_vocab, seed, tau, eta, m))

    def add_mirostat_v2(self, seed: int, tau: float, eta: float) -> None:
        self._add(C.llama_sampler_init_mirostat_v2(seed, tau, eta))

    def add_grammar(self, model: LlamaModel, grammar) -> None:
        self._add(C.llama_sampler_init_grammar(model.vocab, grammar._grammar, grammar._root))

    def add_penalties(self, n_vocab: int, penalty_last_n: int, penalty_repeat: float, penalty_freq: float,
                      penalty_present: float) -> None:
        self._add(C.llama_sampler_init_penalties(penalty_last_n, penalty_repeat, penalty_freq, penalty_present,
                                                 n_vocab))

    def sample(self, ctx: LlamaContext, idx: int) -> int:
        return C.llama_sampler_sample(self.sampler, ctx.ctx, idx)

    def accept(self, token: int) -> None:
        C.llama_sampler_accept(self.sampler, token)

    def reset(self) -> None:
        C.llama_sampler_reset(self.sampler)

    def close(self) -> None:
        self.sampler = None
