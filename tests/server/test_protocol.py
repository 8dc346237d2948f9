"""The request -> sampler chain step of the server (and of `Llama`): fields that mean "the context size" get the
slot's real one, not a fixed number."""

from __future__ import annotations

import pytest

from llamactx.api import protocol as P
from llamactx.cli.commands import build_parser
from llamactx.cli.serve import config_from_args
from llamactx.runtime import Runtime
from llamactx.sampling.penalties import PenaltiesSampler


@pytest.mark.parametrize("flags, n_ctx_slot", [(["-c", "256"], 256), (["-c", "1024"], 1024),
                                               (["-c", "8192", "-np", "2"], 4096)])
def test_repeat_last_n_minus_one_is_the_slots_context_size(smollm, flags, n_ctx_slot):
    """`serve -c N` (and -np): a request's repeat_last_n = -1 looks back over its slot's whole context."""
    config = config_from_args(build_parser().parse_args(["serve", *flags]))
    runtime = Runtime(config.runtime, model=smollm)
    req = P.validate(P.CompletionRequest, {"prompt": "x", "repeat_last_n": -1, "repeat_penalty": 1.1})
    chain = runtime.sampler(P.GenerationRequest.from_fields(req, smollm.vocab, n_probs=0).sampling_for())
    penalties = [s for s in chain.samplers if isinstance(s, PenaltiesSampler)]
    assert [s.penalty_last_n for s in penalties] == [n_ctx_slot]


def test_the_servers_sampling_flags_are_every_requests_defaults():
    """`serve --temp 0 -n 6`: a request that names neither is greedy and 6 tokens long, as one that names both;
    a request's own value still wins."""
    from tests.server.conftest import running_server

    with running_server(n_slots=1, n_ctx=512, request_defaults={"temperature": 0.0, "n_predict": 6}) as srv, \
            srv.client() as c:
        plain = c.post("/completion", json={"prompt": "The capital of France is"}).json()
        named = c.post("/completion", json={"prompt": "The capital of France is", "temperature": 0,
                                             "n_predict": 6}).json()
        longer = c.post("/completion", json={"prompt": "The capital of France is", "n_predict": 9}).json()
    assert plain["content"] == named["content"] and plain["tokens_predicted"] == 6
    assert longer["tokens_predicted"] == 9 and longer["content"].startswith(plain["content"])


@pytest.mark.parametrize("fields, stream", [({}, False), ({"id_slot": 1, "cache_prompt": False}, False),
                                            ({"post_sampling_probs": True, "return_progress": True}, True),
                                            ({"return_progress": True}, False)])
def test_a_requests_engine_options_are_read_once_into_request_options(smollm, fields, stream):
    """The fields a request sets for its engine sequence arrive as one frozen RequestOptions (llama-server's
    slot_params), the same object the worker hands to Engine.add_request; return_progress only on a stream."""
    import dataclasses

    from llamactx.engine import RequestOptions

    req = P.validate(P.CompletionRequest, {"prompt": "x", "stream": stream, **fields})
    gen = P.GenerationRequest.from_fields(req, smollm.vocab, n_probs=3)
    expected = {"id_slot": -1, "cache_prompt": True, "post_sampling_probs": False, "return_progress": False,
                **fields, "n_probs": 3}
    expected["return_progress"] = expected["return_progress"] and stream
    assert gen.options == RequestOptions(**expected)
    assert (gen.n_probs, gen.post_sampling_probs) == (3, expected["post_sampling_probs"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        gen.options.id_slot = 0  # type: ignore[misc]
