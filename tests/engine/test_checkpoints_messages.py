"""Context checkpoints at the starts of user messages (engine/checkpoints.py `user_break`, chat_spans.py; llama-server
0c1e570's message spans in update_slots): Gemma 3 (iSWA), one slot, llama-server's batch sizes (-b 2048, -ub 512).
A ~2,100-token conversation, then a request that shares it up to the middle of its second user message and then
differs: with checkpoints only once per n_batch chunk and at the prompt's tail, the whole shared part was decoded
again (issue #48); now the slot restores the state at the start of that message, and the logits equal a fresh
engine's on the same prompt bit for bit (both end a chunk at every user message, so every position is computed in
the same chunk)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llamactx.chat_spans import MessageDelimiters
from llamactx.chat_template import ChatTemplate
from llamactx.engine import Engine, Limits
from llamactx.sampling import SamplerChain, SamplingParams

DATA = Path(__file__).parent.parent / "data"
N_CTX = 4096


def conversation(first_half: str, second_half: str, code: str) -> list[dict]:
    return [
        {"role": "user", "content": first_half + "\n\nWhat is this text about?"},
        {"role": "assistant", "content": "It is the start of the preamble of the GNU General Public License."},
        {"role": "user", "content": second_half + "\n\nAnd what does this part add?"},
        {"role": "assistant", "content": "It says who may change and share the program, and on what terms."},
        {"role": "user", "content": code + "\n\nWhat does this code do?"},
    ]


@pytest.fixture(scope="module")
def prompts(gemma):
    """The first request's tokens, the second's (the second user message keeps its first ~60% and then goes on
    with other text), and the positions where their user messages start."""
    gpl, code = (DATA / "gpl3_head.txt").read_text(), (DATA / "spec_code.txt").read_text()
    half = len(gpl) // 2
    template = ChatTemplate.from_model(gemma)

    def tokens(messages):  # the server's chat path: render, then tokenize with special tokens parsed
        return gemma.vocab.tokenize(template.render(messages, True), add_special=True, parse_special=True)

    first = tokens(conversation(gpl[:half], gpl[half:], code[:2400]))
    edited = gpl[half:][: int(0.6 * (len(gpl) - half))] + " Whatever the text said next, ignore it."
    second = tokens(conversation(gpl[:half], edited, code[:2400]))
    delims = MessageDelimiters.from_template(template, gemma.vocab)
    return first, second, delims.user_starts(first), delims.user_starts(second)


def run(engine: Engine, prompt, n: int = 1):
    sampler = SamplerChain.default(SamplingParams(temperature=0.0), engine.model.hparams.n_vocab, engine.model.vocab,
                                   n_ctx=N_CTX)
    seq = engine.add_request(prompt, sampler, Limits(max_tokens=n))
    for _ in range(100):
        if not engine.has_work:
            break
        engine.step()
    assert seq.is_finished
    return seq, engine.ctx.get_logits()[-1].copy()


def engine_for(model, **kw) -> Engine:
    return Engine(model, n_ctx=N_CTX, n_batch=2048, n_ubatch=512, n_threads=2, **kw)


def test_message_delimiters_of_gemma(gemma, prompts):
    first, _, starts, _ = prompts
    vocab = gemma.vocab
    assert len(starts) == 3 and starts[0] == 1  # after BOS
    for pos in starts:
        assert [vocab.token_get_text(t) for t in first[pos : pos + 2]] == ["<start_of_turn>", "user"]
    opens = [i for i, t in enumerate(first) if vocab.token_get_text(t) == "<start_of_turn>"]
    assert len(opens) == 6  # three user, two assistant turns and the generation prompt: only users are starts


def test_diverging_inside_a_message_restores_its_start(gemma, prompts):
    first, second, starts, starts2 = prompts
    assert starts2[:2] == starts[:2]
    n_shared = next(i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b)
    assert starts[1] < n_shared < starts[2] and n_shared > 1000
    engine = engine_for(gemma)
    run(engine, first)
    items = [c.n_tokens for c in engine.scheduler.cache.slots[0].checkpoints.items]
    assert set(starts) <= set(items)  # a checkpoint before each user message
    assert not engine.ctx.memory.can_continue(0, n_shared)  # the window has left the divergence behind
    seq, logits = run(engine, second)
    assert seq.n_cached == starts[1]  # the start of the message that differs
    assert seq.timings.prompt_n == len(second) - starts[1]
    assert n_shared - seq.n_cached <= n_shared // 2  # at most half of the shared part decoded again
    ref, ref_logits = run(engine_for(gemma), second)
    assert ref.n_cached == 0
    assert np.array_equal(logits, ref_logits)


def test_without_delimiters_only_the_tail_points(gemma, prompts):
    """No message spans (a raw prompt): with one n_batch chunk, checkpoints only at llama-server's tail points,
    none before a divergence in the middle: the case issue #48 found."""
    first = prompts[0][:1200]
    engine = engine_for(gemma, message_delimiters=MessageDelimiters())
    run(engine, first)
    items = [c.n_tokens for c in engine.scheduler.cache.slots[0].checkpoints.items]
    assert items == [len(first) - 516, len(first) - 4]
