"""Constrained output: GrammarSampler masks against the real SmolLM2 / Gemma vocabularies, completions from
SmolLM2 under a GBNF grammar and a JSON schema, engine errors as GrammarError, dead ends as GrammarDeadEnd.

The decode loop here is deliberately tiny (prompt once, then one token per step until an end-of-generation
token) so that these tests depend only on Context and SamplerChain.
"""

from __future__ import annotations

import gc
import json
import weakref

import jsonschema
import numpy as np
import pytest

from llamactx import Batch, Context, ContextParams
from llamactx.sampling import SamplerChain, SamplingParams, TokenDataArray
from llamactx.sampling.grammar import GrammarDeadEnd, GrammarError, GrammarSampler, engine_tokenizer
from llamactx.vocab import Vocab

YES_NO = 'root ::= "yes" | "no"'
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
# A grammar that compiles but cannot continue after "a": the character class matches nothing.
DEAD_AFTER_A = 'start: "a" /[^\\x00-\\U0010FFFF]/'
N_CTX = 256


def _chat(question: str) -> str:
    return f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


def _prefix_tokens(vocab, words: tuple[str, ...]) -> set[int]:
    """Tokens whose piece is a non-empty prefix of one of `words`: what a choice grammar allows first."""
    out = set()
    for t in range(vocab.n_tokens):
        piece = vocab.token_to_piece(t)
        if piece and any(w.encode().startswith(piece) for w in words):
            out.add(t)
    return out


class Generator:
    """A prompt decoded once; `complete` samples from its end, reusing the prompt's KV cells each time."""

    def __init__(self, model, prompt: str) -> None:
        self.model, self.vocab = model, model.vocab
        self.ctx = Context(model, ContextParams(n_ctx=N_CTX))
        tokens = self.vocab.tokenize(prompt, add_special=True, parse_special=True)
        assert self.ctx.decode(Batch.get_one(tokens)) == 0
        self.n_prompt = len(tokens)
        self.first = self.ctx.get_logits_ith(-1).copy()  # (n_vocab,)

    def chain(self, grammar: GrammarSampler, seed: int, temperature: float) -> SamplerChain:
        params = SamplingParams(seed=seed, temperature=temperature)
        return SamplerChain.default(params, self.model.hparams.n_vocab, self.vocab, n_ctx=N_CTX, grammar=grammar)

    def complete(self, chain: SamplerChain, max_tokens: int) -> tuple[list[int], bool]:
        """Generated tokens (without the end token) and whether generation ended at an end-of-generation
        token."""
        self.ctx.memory.seq_rm(0, self.n_prompt, -1)
        logits, out = self.first, []
        for _ in range(max_tokens):
            token = chain.sample_logits(logits)
            if self.vocab.is_eog(token):
                return out, True
            out.append(token)
            assert self.ctx.decode(Batch.get_one([token])) == 0
            logits = self.ctx.get_logits_ith(-1)
        return out, False


@pytest.fixture(scope="module")
def vocab(smollm):
    return smollm.vocab


@pytest.fixture(scope="module")
def yes_no_gen(smollm):
    return Generator(smollm, _chat("Is the sky blue? Answer with yes or no."))


def _tiny_vocab() -> Vocab:
    """A byte-level vocab of the 256 bytes plus an end token, owned by the caller alone."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    extra = [b for b in range(256) if b not in keep]
    char = {**{b: chr(b) for b in keep}, **{b: chr(256 + n) for n, b in enumerate(extra)}}
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": ["<|endoftext|>", *(char[b] for b in range(256))],
        "tokenizer.ggml.merges": [],
        "tokenizer.ggml.token_type": np.array([3] + [1] * 256, dtype=np.int32),
        "tokenizer.ggml.eos_token_id": 0,
    }
    return Vocab.from_gguf_meta(meta)


# ---- masks -------------------------------------------------------------------------------------------------


def test_choice_mask_is_exactly_the_prefix_tokens(vocab):
    g = GrammarSampler.from_gbnf(vocab, YES_NO)
    assert set(np.flatnonzero(g.allowed()).tolist()) == _prefix_tokens(vocab, ("yes", "no"))
    for t in vocab.tokenize("ye", add_special=False):
        g.accept(t)
    assert not g.is_accepting
    assert set(np.flatnonzero(g.allowed()).tolist()) == _prefix_tokens(vocab, ("s",))
    g.accept(vocab.tokenize("s", add_special=False)[0])
    assert g.is_accepting and g.is_done
    assert set(np.flatnonzero(g.allowed()).tolist()) == set(vocab.eog_ids)


def test_choice_mask_on_gemma_includes_byte_tokens(gemma):
    vocab = gemma.vocab
    g = GrammarSampler.from_gbnf(vocab, YES_NO)
    allowed = set(np.flatnonzero(g.allowed()).tolist())
    assert allowed == _prefix_tokens(vocab, ("yes", "no"))
    byte_y = next(t for t in range(vocab.n_tokens) if vocab.token_get_text(t) == "<0x79>")
    assert byte_y in allowed  # SPM byte-fallback token for 'y'


def test_apply_masks_any_candidate_subset(vocab):
    g = GrammarSampler.from_gbnf(vocab, YES_NO)
    yes = vocab.tokenize("yes", add_special=False)[0]
    ids = np.array([vocab.n_tokens + 5, yes, 0, 3], dtype=np.int32)  # unsorted, with an id past the vocab
    cur = TokenDataArray(ids, np.zeros(4, dtype=np.float32))
    g.apply(cur)
    assert np.isneginf(cur.logits).tolist() == [True, False, True, True]


def test_special_tokens_are_marked_for_the_engine(vocab):
    tok = engine_tokenizer(vocab)
    assert tok is engine_tokenizer(vocab)  # built once per vocab
    assert tok.is_special_token(vocab.eos)
    assert not tok.is_special_token(vocab.tokenize("yes", add_special=False)[0])
    assert set(tok.eos_tokens) == set(vocab.eog_ids)


def test_tokenizer_cache_does_not_keep_a_vocab_alive():
    v = _tiny_vocab()
    g = GrammarSampler.from_gbnf(v, YES_NO)
    assert np.flatnonzero(g.allowed()).tolist() == [1 + ord("n"), 1 + ord("y")]
    ref = weakref.ref(v)
    del v, g
    gc.collect()
    assert ref() is None


# ---- generation with SmolLM2 -------------------------------------------------------------------------------


def test_yes_no_greedy_and_seeded(vocab, yes_no_gen):
    runs = [(0, 0.0), (1, 1.0), (2, 1.0), (3, 1.0), (4, 1.0)]
    for seed, temperature in runs:
        g = GrammarSampler.from_gbnf(vocab, YES_NO)
        out, ended = yes_no_gen.complete(yes_no_gen.chain(g, seed, temperature), max_tokens=8)
        assert ended, f"seed {seed}: no end token after {vocab.detokenize(out)!r}"
        assert vocab.detokenize(out) in ("yes", "no"), f"seed {seed}"
        assert g.is_done


def test_json_schema_completions_validate(smollm, vocab):
    gen = Generator(smollm, _chat("Reply with a JSON object giving a person's name and age."))
    grammar = GrammarSampler.from_json_schema(vocab, PERSON)
    texts = []
    for seed in range(20):
        g = grammar.clone()
        out, ended = gen.complete(gen.chain(g, seed, 0.9 + 0.005 * seed), max_tokens=60)
        text = vocab.detokenize(out)
        assert ended, f"seed {seed}: no end token after {text!r}"
        jsonschema.validate(json.loads(text), PERSON)
        texts.append(text)
    assert len(set(texts)) > 1  # the seeds were used: sampling, not one greedy answer 20 times


def test_dead_end_ends_one_generation(vocab, yes_no_gen):
    g = GrammarSampler.from_lark(vocab, DEAD_AFTER_A)
    chain = yes_no_gen.chain(g, seed=7, temperature=1.0)
    with pytest.raises(GrammarDeadEnd, match=r"dead end after 1 accepted tokens \(ending b'a'\)"):
        yes_no_gen.complete(chain, max_tokens=8)
    # the same chain, reset, and a fresh one both keep working
    chain.reset()
    assert g.tokens == [] and g.allowed().sum() >= 1
    ok = GrammarSampler.from_gbnf(vocab, YES_NO)
    out, ended = yes_no_gen.complete(yes_no_gen.chain(ok, seed=7, temperature=1.0), max_tokens=8)
    assert ended and vocab.detokenize(out) in ("yes", "no")


def test_forcing_a_disallowed_token_raises_and_changes_nothing(vocab):
    g = GrammarSampler.from_gbnf(vocab, YES_NO)
    chain = SamplerChain([], grammar=g)
    chain.accept(vocab.tokenize("y", add_special=False)[0])
    before = g.allowed().copy()
    bad = vocab.tokenize("no", add_special=False)[0]
    assert not g.can_accept(bad)
    with pytest.raises(GrammarDeadEnd, match=rf"token {bad} \(b'no'\) is not allowed here"):
        chain.accept(bad)
    assert list(chain.prev) == g.tokens == [vocab.tokenize("y", add_special=False)[0]]
    np.testing.assert_array_equal(g.allowed(), before)
    for t in vocab.tokenize("es", add_special=False):
        chain.accept(t)
    assert g.is_accepting


# ---- errors ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, message",
    [
        ('root ::= "yes" | answer', "Rule 'answer' not found"),
        ('start ::= "yes"', "No 'root' rule found"),
        ('root ::= "yes" [a-', "Unexpected end of input"),
        ('%llguidance {}\nstart: "yes" | bar', 'lark grammar: at 2\\(8\\): unknown name: "bar"'),
    ],
)
def test_malformed_gbnf_is_a_grammar_error(vocab, text, message):
    with pytest.raises(GrammarError, match=message) as info:
        GrammarSampler.from_gbnf(vocab, text)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    "schema, message",
    [
        ({"type": "strin"}, "Invalid type: strin"),
        ({"type": "integer", "minimum": 5, "maximum": 1}, r"minimum \(5\) is greater than maximum \(1\)"),
        ({"properties": {"a": {"$ref": "#/nope"}}}, "'/nope' does not exist"),
        ('{"type": "object",', "trailing comma at line 1"),
        ([1, 2], "schema must be an object or boolean"),
    ],
)
def test_malformed_schema_is_a_grammar_error(vocab, schema, message):
    with pytest.raises(GrammarError, match=message):
        GrammarSampler.from_json_schema(vocab, schema)


def test_schema_as_text_equals_schema_as_dict(vocab):
    a = GrammarSampler.from_json_schema(vocab, PERSON)
    b = GrammarSampler.from_json_schema(vocab, json.dumps(PERSON))
    np.testing.assert_array_equal(a.allowed(), b.allowed())
    assert np.flatnonzero(a.allowed()).tolist() == sorted(_prefix_tokens(vocab, ('{"',)))


# ---- clone / reset -----------------------------------------------------------------------------------------


def test_clone_is_independent(vocab):
    y = vocab.tokenize("y", add_special=False)[0]
    g = GrammarSampler.from_gbnf(vocab, YES_NO)
    g.accept(y)
    after_y = g.allowed().copy()
    c = g.clone()
    for t in vocab.tokenize("es", add_special=False):
        c.accept(t)
    assert c.is_done and not g.is_accepting
    np.testing.assert_array_equal(g.allowed(), after_y)
    g.reset()
    assert g.tokens == [] and c.tokens == [y, *vocab.tokenize("es", add_special=False)]
    assert set(np.flatnonzero(g.allowed()).tolist()) == _prefix_tokens(vocab, ("yes", "no"))
    assert set(np.flatnonzero(c.allowed()).tolist()) == set(vocab.eog_ids)


def test_build_is_the_one_way_a_front_end_makes_its_constraint(vocab):
    """GrammarSampler.build: a GBNF grammar, a JSON schema (a dict or its text), or None; both, or schema text
    that is not JSON, is a GrammarError naming the field."""
    assert GrammarSampler.build(vocab) is None
    assert GrammarSampler.build(vocab, grammar='root ::= "yes"').kind == "gbnf"
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert GrammarSampler.build(vocab, json_schema=json.dumps(schema)).grammar == \
        GrammarSampler.build(vocab, json_schema=schema).grammar
    with pytest.raises(GrammarError, match="not both"):
        GrammarSampler.build(vocab, grammar='root ::= "yes"', json_schema=schema)
    with pytest.raises(GrammarError, match="json_schema: not valid JSON"):
        GrammarSampler.build(vocab, json_schema="{bad")
