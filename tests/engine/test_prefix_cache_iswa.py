"""The prompt cache over an iSWA memory (model-free): a cached prefix is reused only where the sliding-window cache
still holds the window of the first token to decode; otherwise the request is reprocessed from position 0, as
llama-server does ("forcing full prompt re-processing due to lack of cache data")."""

from __future__ import annotations

import json
from pathlib import Path

from llamactx.engine import Engine, Limits, Sequence
from llamactx.engine.prefix_cache import PrefixCache
from llamactx.sampling import SamplerChain
from tests.engine.test_engine import chain, run_all
from tests.memory.test_kv_cache_iswa import decode, iswa


def request(tokens: list[int]) -> Sequence:
    return Sequence(list(tokens), SamplerChain(), Limits())


def cached(n: int, n_seq: int = 2):
    """An iSWA memory (n_swa 512, 1280 SWA cells) whose slot 0 holds n tokens 0..n-1, idle."""
    mem = iswa(n_seq=n_seq, n_ubatch=256)
    assert decode(mem, [([0], n)]) == 0
    pc = PrefixCache(mem, n_seq)
    pc.set_tokens(0, list(range(n)))
    return mem, pc


def test_a_prefix_inside_the_window_is_reused():
    mem, pc = cached(1400)  # the SWA cache holds 120..1399
    seq = request(list(range(1300)) + [7, 7])  # diverges at 1300: its window starts at 789
    pc.acquire(seq, id_slot=0)
    assert seq.n_past == seq.n_cached == 1300
    assert mem.seq_pos_max(0) == 1299 and mem.base.seq_pos_min(0) == 0


def test_a_prefix_the_window_has_left_is_reprocessed():
    mem, pc = cached(1400)
    seq = request(list(range(300)) + [7, 7])  # diverges at 300: its window starts at 0, dropped by the SWA cache
    pc.acquire(seq, id_slot=0)
    assert seq.n_past == seq.n_cached == 0
    assert mem.seq_pos_max(0) == -1 and mem.base.seq_pos_max(0) == -1  # nothing of the old cache is left


def test_a_donor_slot_shares_only_a_prefix_it_can_continue():
    mem, pc = cached(1400)
    pc.slots[0].tokens = list(range(1400))
    near = request(list(range(1200)) + [9])
    pc.acquire(near, id_slot=1)  # slot 1 is empty: it takes slot 0's cells for [0, 1200)
    assert near.n_past == 1200 and mem.seq_pos_max(1) == 1199 and mem.base.seq_pos_min(1) == 0
    pc.release(near, keep=False)
    far = request(list(range(600)) + [9])  # [0, 600) of slot 0: the SWA cache lost 0..119, the window needs 89..
    pc.acquire(far, id_slot=1)
    assert far.n_past == 0 and mem.seq_pos_max(1) == -1


def test_the_same_prompt_again_decodes_only_its_last_token():
    mem, pc = cached(1400)
    seq = request(list(range(1400)))
    pc.acquire(seq, id_slot=0)
    assert seq.n_past == 1399 and mem.can_continue(0, 1399)


def test_gemma_engine_reprocesses_a_prefix_the_window_has_left(gemma):
    """The engine on Gemma 3's iSWA cache (768 SWA cells at n_ubatch 256): a request sharing only the first 100
    tokens of an 800-token cached prompt is reprocessed from 0, and completes as it does in a fresh engine."""
    ref = json.loads((Path(__file__).parents[1] / "data" / "gemma3-270m-q4_k_m" / "iswa.json").read_text())
    long, short = ref["prompt"][:800], ref["prompt"][:100] + ref["prompt"][1000:1020]
    engine = Engine(gemma, n_slots=1, n_ctx=1024, n_ubatch=256)
    first = engine.add_request(long, chain(gemma), Limits(max_tokens=1))
    run_all(engine, [first])
    assert engine.ctx.memory.seq_pos_min(0) > 0  # the window has moved on
    again = engine.add_request(short, chain(gemma), Limits(max_tokens=4))
    run_all(engine, [again])
    assert again.n_cached == 0
    fresh = Engine(gemma, n_slots=1, n_ctx=1024, n_ubatch=256)
    alone = fresh.add_request(short, chain(gemma), Limits(max_tokens=4))
    run_all(fresh, [alone])
    assert again.output == alone.output
