"""The ops interface (llamactx/backend/ops.py): declared once, implemented by ReferenceOps, FastOps and Graph.

Every op a model builder calls is a method of the `Ops` Protocol, and each implementation has every method with a
signature that accepts the Protocol's calls (the same parameter names in the same order, its own extra parameters
optional). Nothing here computes: reading the classes is enough.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import llamactx
from llamactx.backend.fast import FastOps
from llamactx.backend.ops import GraphParams, Ops
from llamactx.backend.reference import ReferenceOps
from llamactx.ggml.graph import Graph

IMPLEMENTATIONS = (ReferenceOps, FastOps, Graph)


def _protocol_methods() -> dict[str, inspect.Signature]:
    return {name: _params(Ops, name) for name, value in vars(Ops).items()
            if inspect.isfunction(value) and not name.startswith("_")}


def _params(cls: type, name: str) -> inspect.Signature:
    """The method's signature as a caller sees it on an instance (no self)."""
    raw = inspect.getattr_static(cls, name)
    if isinstance(raw, staticmethod):
        return inspect.signature(raw.__func__)
    params = list(inspect.signature(raw).parameters.values())
    return inspect.Signature(params[1:])


def _incompatible(proto: inspect.Signature, impl: inspect.Signature) -> str | None:
    """Why a call written against `proto` could fail on `impl`, or None."""
    want, have = list(proto.parameters.values()), list(impl.parameters.values())
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in have):
        return "takes *args / **kwargs"
    if [p.name for p in have[: len(want)]] != [p.name for p in want]:
        return f"parameters {[p.name for p in have]}, the interface's {[p.name for p in want]}"
    for p, q in zip(want, have, strict=False):
        if p.default is not p.empty and q.default is q.empty:
            return f"{p.name!r} is optional in the interface, required here"
    extra = [q.name for q in have[len(want):] if q.default is q.empty]
    return f"extra required parameters {extra}" if extra else None


def test_the_interface_lists_the_ops():
    methods = _protocol_methods()
    assert {"compute_graph", "matmul", "rms_norm", "rope", "attention_kv"} <= set(methods)
    assert len(methods) >= 25


@pytest.mark.parametrize("cls", IMPLEMENTATIONS, ids=lambda c: c.__name__)
def test_each_backend_has_every_op_with_a_compatible_signature(cls):
    bad = {}
    for name, proto in _protocol_methods().items():
        if not hasattr(cls, name):
            bad[name] = "missing"
        elif (why := _incompatible(proto, _params(cls, name))) is not None:
            bad[name] = why
    assert bad == {}


def test_the_signature_check_tells_an_incompatible_op_apart():
    class Renamed:
        def rms_norm(self, x, w, eps): ...

    class ExtraRequired:
        def rms_norm(self, x, weight, eps, threads): ...

    class ExtraOptional:
        def rms_norm(self, x, weight, eps, threads=1): ...

    proto = _protocol_methods()["rms_norm"]
    assert _incompatible(proto, _params(Renamed, "rms_norm")) is not None
    assert _incompatible(proto, _params(ExtraRequired, "rms_norm")) is not None
    assert _incompatible(proto, _params(ExtraOptional, "rms_norm")) is None
    proto = _protocol_methods()["attention_kv"]
    assert "optional" in _incompatible(proto, _params(type("NoDefault", (), {
        "attention_kv": lambda self, q, kv, il, mask, vis, kq_scale, flash, n_threads, softcap=0.0, sinks=None: 0,
    }), "attention_kv"))


def test_every_op_the_model_builders_call_is_declared():
    """`ops.<name>(` anywhere in llamactx/models (the builders and the attention inputs) and the context names a
    method of the interface."""
    root = Path(llamactx.__file__).parent
    sources = [*sorted((root / "models").glob("*.py")), root / "context.py"]
    called = {m for path in sources for m in re.findall(r"\bops\.([a-z_0-9]+)\(", path.read_text(encoding="utf-8"))}
    assert "matmul" in called and "rms_norm" in called  # the scan sees the builders
    assert called - set(_protocol_methods()) - {"set_threads"} == set()  # set_threads: FastOps' thread count


def test_the_graph_params_are_one_frozen_object():
    import dataclasses

    fields = [f.name for f in dataclasses.fields(GraphParams)]
    assert fields == ["model", "token", "embd", "pos", "inp", "rope", "out_ids", "want_logits", "loras"]
    params = GraphParams(None, None, None, None, None, None, None, True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.want_logits = False  # type: ignore[misc]


def test_no_architecture_keeps_a_forward_trampoline():
    """The registry exposes each architecture's `build(ops, params)`; the context hands it to
    ops.compute_graph, so no module has a `forward` of its own."""
    from llamactx.models import MODULES

    for module in MODULES:
        assert not hasattr(module, "forward"), module.__name__
        sig = inspect.signature(module.build)
        assert list(sig.parameters) == ["ops", "params"], module.__name__
