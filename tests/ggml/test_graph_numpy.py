"""What numpy does with a graph tensor (llamactx.ggml.graph.Tensor) while a forward is recorded: np.concatenate
along the last axis records a concat node, head column slices and copies record cont nodes, `array + tensor`
defers to the tensor's own add, and any conversion to an array (np.asarray, np.ascontiguousarray, np.stack, ...)
raises GraphUnsupported naming the node, so that FastOps runs the ubatch op by op instead of computing on an
object array."""

from __future__ import annotations

import numpy as np
import pytest

from llamactx.ggml.graph import Graph, GraphUnsupported


@pytest.fixture
def graph():
    return Graph(supports=lambda w: True)


def test_conversion_to_an_array_names_the_node(graph):
    x = graph.input("embd", (3, 8))
    with pytest.raises(GraphUnsupported, match=r"numpy conversion of a graph tensor \(input node, shape \(3, 8\)\)"):
        np.ascontiguousarray(x)
    with pytest.raises(GraphUnsupported, match="numpy conversion"):
        np.asarray(x, np.float32)
    with pytest.raises(GraphUnsupported, match=r"numpy\.stack of a graph tensor"):
        np.stack([x, x], axis=1)


def test_concatenate_records_a_concat_node(graph):
    a, b = graph.input("embd", (3, 4, 8)), graph.input("embd", (3, 4, 2))
    c = np.concatenate([a, b], axis=2)
    assert (c.op, c.shape, c.src) == ("concat", (3, 4, 10), (a, b))
    assert np.concatenate([a.reshape(3, 32), b.reshape(3, 8)], axis=-1).shape == (3, 40)
    with pytest.raises(GraphUnsupported, match="numpy.concatenate"):
        np.concatenate([a, b], axis=1)  # not the last axis


def test_head_columns_and_copies(graph):
    x = graph.input("embd", (3, 4, 8))
    q_pe = x[:, :, 6:]
    assert (q_pe.op, q_pe.shape, q_pe.params) == ("cont", (3, 4, 2), (4, 8, 6))
    assert q_pe.copy() is q_pe  # already its own storage
    view = x.reshape(3, 32)[:, 24:]
    assert view.op == "view" and view.copy().op == "cont"


def test_array_plus_tensor_is_the_tensors_add(graph):
    x = graph.input("embd", (3, 4))
    y = np.ones(4, np.float32) + x
    assert (y.op, y.shape) == ("add_row", (3, 4))


def test_other_ufuncs_name_the_function(graph):
    x = graph.input("embd", (3, 4))
    with pytest.raises(GraphUnsupported, match=r"numpy\.exp of a graph tensor \(input node"):
        np.exp(x)
    with pytest.raises(GraphUnsupported, match=r"numpy\.subtract"):
        np.ones(4, np.float32) - x
