"""`Llama(...)`'s keywords against llama-cpp-python 0.3.36's (its llama_cpp/llama.py `Llama.__init__`, read from the
sdist with ast, never imported): the same names in the same order with equal defaults, and each one either reaches
llamactx with its meaning or is refused by a ValueError naming it. The table below has one entry per keyword, so a
keyword added upstream without a decision here fails the walk."""

from __future__ import annotations

import ast
import inspect
import os
from pathlib import Path
from typing import Any

import llama_cpp
import pytest

from llamactx.llama_cpp_options import DEFAULTS, LlamaPromptLookupDecoding, runtime_params
from tests.conftest import LLAMACPP_SDIST

UPSTREAM = LLAMACPP_SDIST / "llama_cpp"


def _source(name: str) -> ast.Module:
    path = UPSTREAM / name
    if not path.exists():
        pytest.fail(f"{path} is missing: `make test` unpacks llama-cpp-python 0.3.36's sdist there")
    return ast.parse(Path(path).read_text(encoding="utf-8"))


def _constants() -> dict[str, Any]:
    """llama_cpp/llama_cpp.py's module-level constants (NAME = literal)."""
    out = {}
    for node in _source("llama_cpp.py").body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                out[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    return out


def upstream_keywords() -> list[tuple[str, Any]]:
    """(name, default) of Llama.__init__'s keyword-only arguments, in order; `llama_cpp.NAME` defaults resolved
    from llama_cpp.py's constants."""
    consts = _constants()
    init = next(f for c in ast.walk(_source("llama.py")) if isinstance(c, ast.ClassDef) and c.name == "Llama"
                for f in c.body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
    assert [a.arg for a in init.args.args] == ["self", "model_path"] and init.args.kwarg is not None
    out = []
    for arg, default in zip(init.args.kwonlyargs, init.args.kw_defaults, strict=True):
        if isinstance(default, ast.Attribute) and isinstance(default.value, ast.Name) \
                and default.value.id == "llama_cpp":
            value = consts[default.attr]
        else:
            value = ast.literal_eval(default)
        out.append((arg.arg, value))
    return out


def test_signature_has_llama_cpp_pythons_names_and_defaults():
    upstream = upstream_keywords()
    assert len(upstream) == 44
    params = list(inspect.signature(llama_cpp.Llama).parameters.values())
    assert params[0].name == "model_path" and params[0].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    ours = [(p.name, p.default) for p in params[1:]]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params[1:])
    assert [n for n, _ in ours] == [n for n, _ in upstream]
    for (name, mine), (_, theirs) in zip(ours, upstream, strict=True):
        assert (type(mine), mine) == (type(theirs), theirs), name  # 0 is not 0.0 is not False
    assert list(DEFAULTS) == [n for n, _ in upstream]


class FixedTokenizer(llama_cpp.BaseLlamaTokenizer):
    def tokenize(self, text, add_bos=True, special=True):
        return [1, 2, 3]

    def detokenize(self, tokens, prev_tokens=None, special=False):
        return b"x"


MODEL = "smollm2"
TOKENIZER = FixedTokenizer()
DEFAULT_PARAMS = runtime_params(MODEL, {})[1]

# keyword -> (a value other than the default, what it must change in (options, RuntimeParams))
HONOURED: dict[str, tuple[Any, Any]] = {
    "split_mode": (0, lambda o, p: o["split_mode"] == 0 and p == DEFAULT_PARAMS),  # none: one device, this CPU
    "vocab_only": (True, lambda o, p: p.vocab_only),
    "use_mmap": (False, lambda o, p: o["use_mmap"] is False),
    "seed": (1234, lambda o, p: o["seed"] == 1234),
    "n_ctx": (256, lambda o, p: p.n_ctx == 256 and p.n_batch == 256),  # n_batch at most n_ctx
    "n_batch": (64, lambda o, p: (p.n_batch, p.n_ubatch) == (64, 64)),  # n_ubatch at most n_batch
    "n_ubatch": (32, lambda o, p: (p.n_batch, p.n_ubatch) == (512, 32)),
    "n_threads": (3, lambda o, p: p.n_threads == 3),
    "n_threads_batch": (5, lambda o, p: p.n_threads_batch == 5),
    "rope_scaling_type": (2, lambda o, p: p.context["rope_scaling_type"] == "yarn"),
    "pooling_type": (1, lambda o, p: p.pooling == "mean"),
    "attention_type": (1, lambda o, p: p.context["attention_type"] == "non_causal"),
    "rope_freq_base": (20000.0, lambda o, p: p.context["rope_freq_base"] == 20000.0),
    "rope_freq_scale": (0.5, lambda o, p: p.context["rope_freq_scale"] == 0.5),
    "yarn_ext_factor": (0.5, lambda o, p: p.context["yarn_ext_factor"] == 0.5),
    "yarn_attn_factor": (2.0, lambda o, p: p.context["yarn_attn_factor"] == 2.0),
    "yarn_beta_fast": (16.0, lambda o, p: p.context["yarn_beta_fast"] == 16.0),
    "yarn_beta_slow": (2.0, lambda o, p: p.context["yarn_beta_slow"] == 2.0),
    "yarn_orig_ctx": (4096, lambda o, p: p.context["yarn_orig_ctx"] == 4096),
    "logits_all": (True, lambda o, p: o["logits_all"] is True),  # Llama keeps every row (test_llama_extras)
    "embedding": (True, lambda o, p: o["embedding"] is True),
    "flash_attn": (True, lambda o, p: p.flash_attn is True),
    "swa_full": (False, lambda o, p: p.swa_full is False),
    "no_perf": (True, lambda o, p: p.context["no_perf"] is True),
    "last_n_tokens_size": (16, lambda o, p: o["last_n_tokens_size"] == 16),  # each completion's repeat_last_n
    "lora_scale": (0.5, lambda o, p: o["lora_scale"] == 0.5 and p.lora == ()),  # with lora_path only
    "lora_path": ("a.gguf", lambda o, p: p.lora == (("a.gguf", 1.0),)),
    "chat_format": ("chatml", lambda o, p: p.chat_template == "chatml"),
    "chat_handler": (lambda **kw: None, lambda o, p: callable(o["chat_handler"])),
    "draft_model": (LlamaPromptLookupDecoding(num_pred_tokens=4),
                    lambda o, p: p.spec.ngram_simple.size_m == 4),
    "tokenizer": (TOKENIZER, lambda o, p: o["tokenizer"] is TOKENIZER),  # test_llama_level_keywords uses it
    "type_k": (8, lambda o, p: p.type_k == "q8_0"),
    "type_v": (2, lambda o, p: p.type_v == "q4_0"),
    "spm_infill": (True, lambda o, p: o["spm_infill"] is True),  # test_examples: the FIM order
    "verbose": (False, lambda o, p: o["verbose"] is False),
}
# GPU placement on a CPU-only build: accepted and without effect, as llama-cpp-python's CPU build takes them
CPU_ONLY: dict[str, Any] = {"n_gpu_layers": -1, "offload_kqv": False, "op_offload": True}
# what llamactx does not do: a ValueError naming the keyword
REFUSED: dict[str, Any] = {"main_gpu": 1, "tensor_split": [0.5, 0.5], "use_mlock": True,
                           "kv_overrides": {"general.name": "x"}, "lora_base": "base.gguf", "numa": True}


def test_every_keyword_is_honoured_or_refused():
    names = [n for n, _ in upstream_keywords()]
    assert sorted(names) == sorted([*HONOURED, *CPU_ONLY, *REFUSED])
    for name, (value, check) in HONOURED.items():
        opts, params = runtime_params(MODEL, {name: value})
        assert check(opts, params), name
    for name, value in CPU_ONLY.items():
        assert runtime_params(MODEL, {name: value})[1] == DEFAULT_PARAMS, name
    for name, value in REFUSED.items():
        with pytest.raises(ValueError, match=name) as e:
            runtime_params(MODEL, {name: value})
        assert repr(value) in str(e.value)


@pytest.mark.parametrize(("name", "value"), [("split_mode", 2), ("rope_scaling_type", 3), ("pooling_type", 9),
                                             ("attention_type", 5), ("type_k", 12), ("draft_model", "x.gguf"),
                                             ("tokenizer", "gpt2"), ("chat_handler", "chatml"),
                                             ("n_gpu_layers", "all")])
def test_bad_values_are_refused_by_name(name, value):
    with pytest.raises(ValueError, match=name):
        runtime_params(MODEL, {name: value})


def test_unknown_keyword_is_a_type_error_naming_it():
    """llama-cpp-python swallows unknown keywords in **kwargs; here a misspelt option is not silently lost."""
    with pytest.raises(TypeError, match="n_ctxx"):
        runtime_params(MODEL, {"n_ctxx": 64})


def test_llama_level_keywords():
    """The keywords Llama itself keeps (not RuntimeParams'), on one loaded model."""
    def handler(**kwargs):
        return {"handled": True}

    llm = llama_cpp.Llama(MODEL, n_ctx=256, last_n_tokens_size=7, spm_infill=True, verbose=False,
                          tokenizer=TOKENIZER, chat_handler=handler, seed=99, n_threads=1, n_threads_batch=1)
    assert llm.tokenize(b"anything") == [1, 2, 3] and llm.detokenize([5]) == b"x"
    assert llm.create_chat_completion(messages=[]) == {"handled": True}
    assert (llm.last_n_tokens_size, llm.spm_infill, llm.verbose, llm.n_ctx()) == (7, True, False, 256)
    assert llm._ctx.ctx.params.n_threads == 1 and os.fspath(llm.model_path) == MODEL


def _default(node: ast.expr | None, consts: dict[str, Any]) -> Any:
    """A Field's default as upstream writes it: a literal, arithmetic on literals, or `llama_cpp.NAME`; calls
    (llama_supports_mmap(), cpu_count()) come back as their source text."""
    if node is None:
        return "<required>"
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "llama_cpp":
        return consts[node.attr]
    try:
        return ast.literal_eval(node)
    except ValueError:
        if isinstance(node, ast.BinOp) and all(isinstance(n, ast.Constant) for n in (node.left, node.right)):
            return eval(compile(ast.Expression(node), "<default>", "eval"), {"__builtins__": {}})  # noqa: S307
        return ast.unparse(node)


def upstream_settings() -> dict[str, dict[str, Any]]:
    """{class name: {field: default}} of llama_cpp/server/settings.py's ModelSettings and ServerSettings."""
    consts = _constants()
    out = {}
    for cls in _source("server/settings.py").body:
        if isinstance(cls, ast.ClassDef) and cls.name in ("ModelSettings", "ServerSettings"):
            fields = {}
            for node in cls.body:
                if isinstance(node, ast.AnnAssign):
                    value = node.value
                    if isinstance(value, ast.Call) and getattr(value.func, "id", "") == "Field":
                        value = next((k.value for k in value.keywords if k.arg == "default"), None)
                    fields[node.target.id] = _default(value, consts)
            out[cls.name] = fields
    return out


# settings whose default is not upstream's literal: upstream computes it (the same value here: n_threads None is
# half the cores, n_threads_batch all, as llama_cpp_options.runtime_params computes), or llamactx cannot do it
SETTING_DEFAULTS = {"use_mmap": ("llama_cpp.llama_supports_mmap()", True),
                    "use_mlock": ("llama_cpp.llama_supports_mlock()", False),  # mlock is refused here
                    "n_threads": ("max(multiprocessing.cpu_count() // 2, 1)", None),
                    "n_threads_batch": ("max(multiprocessing.cpu_count(), 1)", None)}


def test_server_settings_have_llama_cpp_pythons_fields_and_defaults():
    from llama_cpp.server.settings import ModelSettings, ServerSettings

    for ours, theirs in ((ModelSettings, upstream_settings()["ModelSettings"]),
                         (ServerSettings, upstream_settings()["ServerSettings"])):
        fields = {n: f for n, f in ours.model_fields.items() if n != "n_parallel"}  # n_parallel: llamactx's own
        assert list(fields) == list(theirs)
        for name, default in theirs.items():
            mine = "<required>" if fields[name].is_required() else fields[name].default
            if name in SETTING_DEFAULTS:
                assert (default, mine) == SETTING_DEFAULTS[name], name
            else:
                assert (type(mine), mine) == (type(default), default), name
