"""Speculative decoding with a draft model (engine/draft_model.py, the draft-simple type): the same tokens as
without it whatever the draft proposes, drafts verified and counted, several slots drafting together, the draft
context's memory in step with its tokens, vocabularies checked as llama.cpp does, and the flags.

The draft models are the targets' own layers (tests/models/draft.py), written once per session: the first two
blocks (a drafter whose drafts are all rejected: SmolLM2's and Gemma 3's early layers do not predict the next token),
SmolLM2 without five of its 30 blocks (some drafts accepted, some rejected), and the target model itself (drafts
nearly always accepted)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from llamactx import Model
from llamactx.cli import main
from llamactx.cli.args import ArgumentParser, CommandError, add_speculative, spec_params
from llamactx.embedded import gemma3_path, smollm2_path
from llamactx.engine import Engine
from llamactx.engine.draft_model import DraftSimple, draft_token, vocab_mismatch
from llamactx.engine.speculative import SpecParams, SpecParamsError, Speculator
from llamactx.llm import LLM
from tests.engine.test_speculative import TINY, check_memory, generate, grounded
from tests.models.draft import write_draft

SMOL_CHAT = ("<|im_start|>user\n", "<|im_end|>\n", "<|im_start|>assistant\n")
GEMMA_CHAT = ("<start_of_turn>user\n", "<end_of_turn>\n", "<start_of_turn>model\n")


@pytest.fixture(scope="session")
def smollm_draft2(tmp_path_factory):
    return Model.load(write_draft(smollm2_path(), tmp_path_factory.mktemp("draft") / "smollm2-2l.gguf", 2))


@pytest.fixture(scope="session")
def smollm_draft25(tmp_path_factory):
    layers = [i for i in range(30) if i % 6 != 3]  # 25 of the 30 blocks
    return Model.load(write_draft(smollm2_path(), tmp_path_factory.mktemp("draft") / "smollm2-25l.gguf",
                                  layers=layers))


@pytest.fixture(scope="session")
def gemma_draft2(tmp_path_factory):
    return Model.load(write_draft(gemma3_path(), tmp_path_factory.mktemp("draft") / "gemma3-2l.gguf", 2))


def draft_spec(model, **kw) -> SpecParams:
    return SpecParams(types=("draft-simple",), draft_model=model, **kw)


def check_draft_memory(engine: Engine) -> None:
    """The draft context's memory holds exactly the tokens its drafter says each sequence holds."""
    d = engine.speculator.draft_model
    for s, held in enumerate(d.held):
        assert d.ctx.memory.seq_pos_max(s) == len(held) - 1


@pytest.fixture(scope="module")
def smollm_prompt(smollm):
    return grounded(smollm, SMOL_CHAT, 900)


@pytest.fixture(scope="module")
def smollm_plain(smollm, smollm_prompt):
    (plain,), engine = generate(smollm, [smollm_prompt], max_tokens=32)
    return plain, engine.stats.n_decode


# -- the engine ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["2 layers", "25 layers", "itself"])
def test_one_stream_greedy_is_unchanged(smollm, smollm_prompt, smollm_plain, which, request):
    draft = {"2 layers": "smollm_draft2", "25 layers": "smollm_draft25", "itself": None}[which]
    draft = smollm if draft is None else request.getfixturevalue(draft)
    (fast,), engine = generate(smollm, [smollm_prompt], draft_spec(draft), max_tokens=32)
    plain, n_decode_plain = smollm_plain
    assert fast == plain
    st = engine.stats
    assert st.n_draft_tokens > 0 and st.n_draft_verif_steps > 0
    if which == "2 layers":
        assert st.n_draft_accepted == 0  # junk drafts, every one rejected, and still the same tokens
    if which == "25 layers":
        assert 0 < st.n_draft_accepted < st.n_draft_tokens
    if which == "itself":
        assert st.n_draft_accepted > st.n_draft_tokens // 2
        assert st.n_decode < n_decode_plain
    check_memory(engine)
    check_draft_memory(engine)


@pytest.mark.parametrize("temp", [0.0, 0.8])
def test_four_slots_draft_together_and_give_the_same_tokens(smollm, smollm_prompt, smollm_draft25, temp):
    """SmolLM2's kernels are row invariant: with drafts beside them, four slots' greedy and seeded outputs are
    those without speculation. The four slots draft in shared draft decodes (Speculator.prepare)."""
    prompts = [smollm_prompt, smollm.vocab.tokenize("1, 2, 3, 4, 5,"), smollm_prompt[:200],
               smollm.vocab.tokenize("The capital of France is")]
    plain, _ = generate(smollm, prompts, temp=temp, max_tokens=16, n_batch=256)
    fast, engine = generate(smollm, prompts, draft_spec(smollm_draft25), temp=temp, max_tokens=16, n_batch=256)
    assert fast == plain
    assert engine.stats.n_draft_accepted > 0
    d = engine.speculator.draft_model
    # one drafting decode for all slots: far fewer draft decodes than draft tokens of four separate drafters
    assert d.n_decode < engine.stats.n_draft_tokens
    check_memory(engine)
    check_draft_memory(engine)


def test_a_seeded_sampled_run_is_reproducible(smollm, smollm_prompt, smollm_draft25):
    runs = [generate(smollm, [smollm_prompt], draft_spec(smollm_draft25), temp=1.0, max_tokens=24)
            for _ in range(2)]
    assert runs[0][0] == runs[1][0]
    assert runs[0][1].stats.n_draft_tokens > 0


@pytest.mark.parametrize("which", ["2 layers", "itself"])
def test_gemma_greedy_is_unchanged(gemma, gemma_draft2, which):
    """Gemma 3 (iSWA, Q4_K weights: the engine caps a lone stream's drafts at two tokens, engine.py `_max_draft`)
    with its first two layers, or itself, as the draft model."""
    prompt = grounded(gemma, GEMMA_CHAT, 900)
    draft = gemma_draft2 if which == "2 layers" else gemma
    (plain,), _ = generate(gemma, [prompt], max_tokens=24)
    (fast,), engine = generate(gemma, [prompt], draft_spec(draft), max_tokens=24)
    assert fast == plain
    st = engine.stats
    assert st.n_draft_tokens > 0
    assert st.n_draft_tokens <= 2 * st.n_draft_verif_steps  # the Q4_K cap
    if which == "itself":
        assert st.n_draft_accepted > 0
    check_memory(engine)
    check_draft_memory(engine)


def test_n_max_and_n_min(smollm):
    """--spec-draft-n-max 0 drafts nothing; a draft shorter than --spec-draft-n-min is dropped (llama.cpp's
    draft-simple), so n_min > n_max drafts nothing either; the output is the same."""
    prompt = smollm.vocab.tokenize("def fibonacci(n):")
    (plain,), _ = generate(smollm, [prompt], max_tokens=12)
    for spec in (draft_spec(smollm, n_max=0), draft_spec(smollm, n_max=2, n_min=3)):
        (out,), engine = generate(smollm, [prompt], spec, max_tokens=12)
        assert out == plain
        assert engine.stats.n_draft_tokens == 0
    (out,), engine = generate(smollm, [prompt], draft_spec(smollm, n_max=2), max_tokens=12)
    assert out == plain
    assert 0 < engine.stats.n_draft_tokens <= 2 * engine.stats.n_draft_verif_steps


def test_ngram_types_are_tried_first(smollm, smollm_prompt, smollm_plain, smollm_draft2):
    """llama.cpp's order of preference: the n-gram types, then draft-simple (common_speculative_init)."""
    spec = SpecParams(types=("draft-simple", "ngram-simple"), draft_model=smollm_draft2)
    sp = Speculator(spec, smollm, 1, dict(n_ctx=256, n_threads=2))
    assert [type(d).__name__ for d in sp.drafters] == ["NgramSimple", "DraftSimple"]
    (out,), engine = generate(smollm, [smollm_prompt], spec, max_tokens=32)
    assert out == smollm_plain[0]
    assert engine.stats.n_draft_accepted > 0  # the n-gram drafts of the copied code; the 2-layer draft has none


@pytest.mark.parametrize("name", ["mamba2", "lfm2", "qwen35", "qwen35moe"])
def test_a_recurrent_target_rolls_back_a_draft_models_tokens(name, smollm_draft2):
    """A recurrent target with a draft model of its vocabulary (the tiny llama3, whose random weights draft nearly
    always wrong): every rejection restores the target's snapshot and replays, so the outputs of 2 slots are those
    without drafts. A draft of another vocabulary (SmolLM2's) is refused, naming the difference."""
    ref = json.loads((TINY / f"{name}.json").read_text())
    model = Model.load(TINY / f"tiny-{name}.gguf")
    prompts = [p["tokens"] * 2 for p in ref["prompts"][:2]]
    plain, _ = generate(model, prompts, max_tokens=16)
    fast, engine = generate(model, prompts, draft_spec(Model.load(TINY / "tiny-llama3.gguf")), max_tokens=16)
    assert fast == plain
    assert engine.stats.n_draft_tokens > engine.stats.n_draft_accepted
    check_memory(engine)
    with pytest.raises(SpecParamsError, match="n_vocab: target 1024, draft 49152"):
        generate(model, prompts[:1], draft_spec(smollm_draft2), max_tokens=1)


# -- the draft model and its context ---------------------------------------------------------------------------


def test_drafts_reuse_the_common_prefix(smollm, smollm_prompt):
    d = DraftSimple(smollm, 2, 4, 0, 0.0, smollm.hparams.n_vocab, dict(n_ctx=2048, n_threads=2))
    prompt, sampled = smollm_prompt[:-1], smollm_prompt[-1]
    first = d.draft(0, prompt, sampled)
    assert len(first) == 4
    assert d.held[0] == [*prompt, sampled, *first[:-1]]  # the last draft token is not decoded
    n = d.n_decode
    # the first two draft tokens accepted, the target sampled another: only what differs is decoded again
    nxt = d.draft(0, [*prompt, sampled, *first[:2]], 17, 2)
    assert len(nxt) == 2 and d.n_decode - n == 2  # catch-up of one token (17) with logits, then one drafting step
    assert d.held[0] == [*prompt, sampled, *first[:2], 17, nxt[0]]
    assert d.ctx.memory.seq_pos_max(0) == len(d.held[0]) - 1
    assert d.draft(1, [], 5, 0) == [] and d.held[1] == []  # n_max 0: nothing decoded


def test_draft_sampler_is_top_k_10_and_p_min():
    logits = np.full(100, -50.0, np.float32)
    logits[[7, 8]] = [2.0, 1.0]
    token, p = draft_token(logits)
    assert token == 7 and p == pytest.approx(np.e / (np.e + 1 + 8 * np.exp(-52.0)))
    flat = np.zeros(100, np.float32)
    assert draft_token(flat)[1] == pytest.approx(0.1)  # ten equal candidates after top-k 10


def _fake(model_type="gpt2", bos=1, eos=2, add_bos=False, add_eos=False, texts=("a", "b", "c", "d", "e", "f", "g")):
    vocab = SimpleNamespace(model_type=model_type, bos=bos, eos=eos, add_bos=add_bos, add_eos=add_eos,
                            n_tokens=len(texts), token_get_text=lambda i: texts[i])
    return SimpleNamespace(vocab=vocab)


def test_vocab_compatibility_follows_llama_cpp():
    base = _fake()
    assert vocab_mismatch(base, _fake()) is None
    assert vocab_mismatch(base, _fake(bos=9)) is None  # BOS not added: its id does not matter
    assert vocab_mismatch(base, _fake(texts=("x", "y", "z", "w", "v", "f", "g"))) is None  # ids < 5 not compared
    assert "vocab type" in vocab_mismatch(base, _fake(model_type="llama"))
    assert "BOS" in vocab_mismatch(_fake(add_bos=True), _fake(add_bos=True, bos=9))
    assert "EOS" in vocab_mismatch(base, _fake(add_eos=True))
    assert "token 6 text" in vocab_mismatch(base, _fake(texts=("a", "b", "c", "d", "e", "f", "h")))
    big = tuple(f"t{i}" for i in range(300))
    assert "n_vocab" in vocab_mismatch(_fake(texts=big), _fake(texts=big[:171]))  # 129 apart
    assert vocab_mismatch(_fake(texts=big), _fake(texts=big[:172])) is None  # 128 apart


def test_an_incompatible_draft_model_is_refused(smollm, gemma_draft2):
    with pytest.raises(SpecParamsError, match=r"vocabulary does not match.*vocab type: target 'gpt2', draft 'llama'"):
        Engine(smollm, n_ctx=256, spec=draft_spec(gemma_draft2))


def test_bad_draft_params_are_refused(smollm):
    for kw, msg in ((dict(types=("draft-simple",)), "needs a draft model"),
                    (dict(types=("draft-simple",), draft_model="/nonexistent.gguf"), "no such file"),
                    (dict(types=("draft-simple",), draft_model=3), "expected a GGUF path or a Model"),
                    (dict(types=("draft-mtp",), draft_model=smollm), "not implemented")):
        with pytest.raises(SpecParamsError, match=msg):
            SpecParams(**kw)
    with pytest.raises(SpecParamsError, match="target model"):
        Speculator(draft_spec(smollm))


# -- flags ---------------------------------------------------------------------------------------------------------


def test_cli_draft_model_flags(tmp_path, capsys, smollm_draft2):
    p = ArgumentParser(prog="llamactx serve")
    add_speculative(p)
    path = str(smollm_draft2.path)
    for flag in ("--spec-draft-model", "-md", "--model-draft"):
        sp = spec_params(p.parse_args(["--spec-type", "draft-simple", flag, path, "--spec-draft-n-max", "5",
                                       "--spec-draft-p-min", "0.5"]))
        assert sp == SpecParams(types=("draft-simple",), draft_model=path, n_max=5, p_min=0.5)
    assert spec_params(p.parse_args(["--spec-type", "draft-simple", "-md", "smollm2"])).draft_model == \
        str(smollm2_path())  # an embedded model's name, as -m takes
    # -md without draft-simple: loaded by llama-server 0c1e570 but not used; here not used, and said so
    assert spec_params(p.parse_args(["-md", path])) is None
    assert "--spec-draft-model unused" in capsys.readouterr().err
    assert spec_params(p.parse_args(["-md", path, "--spec-type", "ngram-simple"])).draft_model is None
    for bad, msg in ((["--spec-type", "draft-simple"], "needs a draft model"),
                     (["--spec-type", "draft-simple", "-md", str(tmp_path / "no.gguf")], "does not exist"),
                     (["--spec-type", "draft-simple", "-md", path, "--spec-draft-n-max", "-1"], "outside")):
        with pytest.raises((CommandError, SystemExit)):
            spec_params(p.parse_args(bad))
        if msg != "outside":
            with pytest.raises(CommandError, match=msg):
                spec_params(p.parse_args(bad))


def test_the_draft_model_path_reaches_the_engine(smollm, smollm_draft2):
    engine = Engine(smollm, n_slots=3, n_ctx=512, spec=draft_spec(str(smollm_draft2.path)), n_threads=2)
    d = engine.speculator.draft_model
    assert d.model.hparams.n_layer == 2 and d.ctx.params.n_seq_max == 3 and d.ctx.params.n_ctx == 512
    assert isinstance(d.model, Model) and Path(d.model.path) == Path(smollm_draft2.path)


# -- front ends ------------------------------------------------------------------------------------------------


def test_llm_and_run_take_a_draft_model(smollm, smollm_draft25, capsys):
    """`LLM(spec=SpecParams(draft_model=...))` and `llamactx run --spec-type draft-simple -md FNAME` (serve and
    chat build their engine from the same flags, cli/args.py runtime_params) give the text they give without."""
    prompt = grounded(smollm, SMOL_CHAT, 600)
    plain = LLM(smollm, n_ctx=1024).complete(prompt, max_tokens=16, temperature=0)
    fast = LLM(smollm, n_ctx=1024, spec=draft_spec(smollm_draft25))
    assert fast.complete(prompt, max_tokens=16, temperature=0).text == plain.text
    assert fast.engine.stats.n_draft_accepted > 0
    argv = ["run", "-p", "def fib(n):", "-n", "12", "--temp", "0", "-c", "512", "--no-escape"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert main([*argv, "--spec-type", "draft-simple", "-md", str(smollm_draft25.path)]) == 0
    assert capsys.readouterr().out == out
