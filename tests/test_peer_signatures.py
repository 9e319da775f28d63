"""kaolin's ``kaolin.ops.batch`` and PyTorch3D's ``structures.utils`` as nestbatch provides
them: every name with the peer's parameters (names, order, defaults), the type and shape of what
it returns, and the examples of the peers' documentation, written from their docs."""

from __future__ import annotations

import inspect

import pytest
import torch

from nestbatch.convert import kaolin
from nestbatch.convert import pytorch3d as p3d

_EMPTY = inspect.Parameter.empty

#: name -> the peer's parameters as (name, default); ``_EMPTY`` for a required one.
KAOLIN = {
    "get_shape_per_tensor": [("tensor_list", _EMPTY)],
    "list_to_packed": [("tensor_list", _EMPTY)],
    "get_first_idx": [("numel_per_tensor", _EMPTY)],
    "tile_to_packed": [("values", _EMPTY), ("numel_per_tensor", _EMPTY)],
    "packed_to_list": [("packed_tensor", _EMPTY), ("shape_per_tensor", _EMPTY),
                       ("first_idx", _EMPTY)],
    "fill_max_shape": [("shape_per_tensor", _EMPTY), ("partial_max_shape", None)],
    "list_to_padded": [("tensor_list", _EMPTY), ("padding_value", _EMPTY), ("max_shape", None)],
    "padded_to_list": [("padded_tensor", _EMPTY), ("shape_per_tensor", _EMPTY)],
    "packed_to_padded": [("packed_tensor", _EMPTY), ("shape_per_tensor", _EMPTY),
                         ("first_idx", _EMPTY), ("padding_value", _EMPTY), ("max_shape", None)],
    "padded_to_packed": [("padded_tensor", _EMPTY), ("shape_per_tensor", _EMPTY)],
}

PYTORCH3D = {
    "list_to_padded": [("x", _EMPTY), ("pad_size", None), ("pad_value", 0.0),
                       ("equisized", False)],
    "padded_to_list": [("x", _EMPTY), ("split_size", None)],
    "list_to_packed": [("x", _EMPTY)],
    "packed_to_list": [("x", _EMPTY), ("split_size", _EMPTY)],
    "padded_to_packed": [("x", _EMPTY), ("split_size", None), ("pad_value", None)],
}


def _parameters(fn):
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("module, table", [(kaolin, KAOLIN), (p3d, PYTORCH3D)],
                         ids=["kaolin", "pytorch3d"])
def test_every_name_has_the_peers_parameters(module, table):
    for name, parameters in table.items():
        assert _parameters(getattr(module, name)) == parameters, name


def _kaolin_returns():
    """``name -> (result, description)`` on one small list: 2-D elements ragged in 1 dim."""
    a, b = torch.arange(6.0).view(2, 3), torch.arange(3.0).view(1, 3)
    shapes = torch.tensor([[2], [1]])
    first_idx = torch.tensor([0, 2, 3])
    packed = torch.cat([a, b])
    padded = torch.stack([a, torch.cat([b, torch.full((1, 3), -1.0)])])
    return {
        "get_shape_per_tensor": kaolin.get_shape_per_tensor([a, b]),
        "list_to_packed": kaolin.list_to_packed([a, b]),
        "get_first_idx": kaolin.get_first_idx(torch.tensor([2, 1])),
        "tile_to_packed": kaolin.tile_to_packed(torch.tensor([1.0, 2.0]), torch.tensor([2, 1])),
        "packed_to_list": kaolin.packed_to_list(packed, shapes, first_idx),
        "fill_max_shape": kaolin.fill_max_shape(shapes),
        "list_to_padded": kaolin.list_to_padded([a, b], -1.0),
        "padded_to_list": kaolin.padded_to_list(padded, shapes),
        "packed_to_padded": kaolin.packed_to_padded(packed, shapes, first_idx, -1.0),
        "padded_to_packed": kaolin.padded_to_packed(padded, shapes),
    }


def _describe(value):
    if isinstance(value, torch.Tensor):
        return ("Tensor", tuple(value.shape), value.dtype)
    return (type(value).__name__, tuple(_describe(v) for v in value))


def test_kaolin_return_types_and_shapes():
    f, i = torch.float32, torch.int64
    expected = {
        "get_shape_per_tensor": ("Tensor", (2, 1), i),
        "list_to_packed": ("tuple", (("Tensor", (3, 3), f), ("Tensor", (2, 1), i))),
        "get_first_idx": ("Tensor", (3,), i),
        "tile_to_packed": ("Tensor", (3, 1), f),
        "packed_to_list": ("list", (("Tensor", (2, 3), f), ("Tensor", (1, 3), f))),
        "fill_max_shape": ("Tensor", (1,), i),
        "list_to_padded": ("tuple", (("Tensor", (2, 2, 3), f), ("Tensor", (2, 1), i))),
        "padded_to_list": ("list", (("Tensor", (2, 3), f), ("Tensor", (1, 3), f))),
        "packed_to_padded": ("Tensor", (2, 2, 3), f),
        "padded_to_packed": ("Tensor", (3, 3), f),
    }
    got = {name: _describe(value) for name, value in _kaolin_returns().items()}
    assert got == expected
    assert set(got) == set(KAOLIN)


def test_pytorch3d_return_types_and_shapes():
    x = [torch.ones(2, 3), torch.ones(1, 3)]
    f, i = torch.float32, torch.int64
    got = {
        "list_to_padded": _describe(p3d.list_to_padded(x)),
        "padded_to_list": _describe(p3d.padded_to_list(torch.ones(2, 2, 3), [2, 1])),
        "list_to_packed": _describe(p3d.list_to_packed(x)),
        "packed_to_list": _describe(p3d.packed_to_list(torch.ones(3, 3), [2, 1])),
        "padded_to_packed": _describe(p3d.padded_to_packed(torch.ones(2, 2, 3), [2, 1])),
    }
    assert got == {
        "list_to_padded": ("Tensor", (2, 2, 3), f),
        "padded_to_list": ("list", (("Tensor", (2, 3), f), ("Tensor", (1, 3), f))),
        "list_to_packed": ("tuple", (("Tensor", (3, 3), f), ("Tensor", (2,), i),
                                     ("Tensor", (2,), i), ("Tensor", (3,), i))),
        "packed_to_list": ("tuple", (("Tensor", (2, 3), f), ("Tensor", (1, 3), f))),
        "padded_to_packed": ("Tensor", (3, 3), f),
    }
    assert set(got) == set(PYTORCH3D)


# ------------------------------------------------------------- the peers' documented examples
def test_kaolin_documented_examples():
    tensor_list = [torch.zeros((1, 3, 4, 2)), torch.ones((2, 5, 3, 2))]
    assert kaolin.get_shape_per_tensor(tensor_list).tolist() == [[1, 3, 4], [2, 5, 3]]

    a = torch.LongTensor([[0, 1, 2], [1, 2, 3]])
    b = torch.LongTensor([[2, 4, 5]])
    packed_tensor, shape_per_tensor = kaolin.list_to_packed([a, b])
    assert packed_tensor.tolist() == [[0, 1, 2], [1, 2, 3], [2, 4, 5]]
    assert shape_per_tensor.tolist() == [[2], [1]]

    assert kaolin.get_first_idx(torch.LongTensor([2, 3, 5])).tolist() == [0, 2, 5, 10]

    tiled = kaolin.tile_to_packed(torch.tensor([0.0, 6.0, 7.0]), torch.LongTensor([2, 2, 3]))
    assert tiled.tolist() == [[0.0], [0.0], [6.0], [6.0], [7.0], [7.0], [7.0]]

    packed = torch.arange(16).reshape(8, 2)
    pieces = kaolin.packed_to_list(packed, torch.LongTensor([[3], [4], [1]]),
                                   torch.LongTensor([0, 3, 7, 8]))
    assert [p.tolist() for p in pieces] == [[[0, 1], [2, 3], [4, 5]],
                                            [[6, 7], [8, 9], [10, 11], [12, 13]], [[14, 15]]]

    partial = kaolin.fill_max_shape(torch.LongTensor([[2, 3, 5], [3, 4, 2]]), (6, -1, -1))
    assert partial.tolist() == [6, 4, 5]

    padded_tensor, shape_per_tensor = kaolin.list_to_padded([a, b], -1, [3])
    assert padded_tensor.tolist() == [[[0, 1, 2], [1, 2, 3], [-1, -1, -1]],
                                      [[2, 4, 5], [-1, -1, -1], [-1, -1, -1]]]
    assert shape_per_tensor.tolist() == [[2], [1]]

    padded = torch.LongTensor([[[0, 1, 2], [1, 2, 3], [-1, -1, -1]],
                               [[2, 4, 5], [-1, -1, -1], [-1, -1, -1]]])
    back = kaolin.padded_to_list(padded, torch.LongTensor([[2], [1]]))
    assert [t.tolist() for t in back] == [[[0, 1, 2], [1, 2, 3]], [[2, 4, 5]]]


def test_pytorch3d_documented_behaviour():
    # list_to_padded: (N, max S_0, ..., max S_D), or pad_size; empty 1-D tensors pad to nothing.
    x = [torch.ones(2, 3), torch.full((1, 4), 2.0), torch.tensor([])]
    padded = p3d.list_to_padded(x, pad_value=-1.0)
    assert padded.shape == (3, 2, 4)
    assert padded[0, :2, :3].eq(1).all() and padded[0, :, 3].eq(-1).all()
    assert padded[1, 0].tolist() == [2.0] * 4 and padded[2].eq(-1).all()
    assert p3d.list_to_padded(x, pad_size=[3, 5]).shape == (3, 3, 5)
    # padded_to_list: unbind, cut to split_size (1-D: first dim; 2-D: every dim).
    assert [t.shape for t in p3d.padded_to_list(padded, [2, 1, 0])] == [(2, 4), (1, 4), (0, 4)]
    cut = p3d.padded_to_list(padded, [[2, 3], [1, 4], [0, 0]])
    assert [t.shape for t in cut] == [(2, 3), (1, 4), (0, 0)]
    # list_to_packed: (x_packed, num_items, item_packed_first_idx, item_packed_to_list_idx).
    x_packed, num_items, first, to_list = p3d.list_to_packed([torch.ones(2, 3), torch.ones(3, 3)])
    assert x_packed.shape == (5, 3) and num_items.tolist() == [2, 3]
    assert first.tolist() == [0, 2] and to_list.tolist() == [0, 0, 1, 1, 1]
    # packed_to_list: a split along the first dim.
    assert [t.shape for t in p3d.packed_to_list(x_packed, [2, 3])] == [(2, 3), (3, 3)]
    # padded_to_packed: by split sizes, by a pad value, or the flattened rows.
    three_d = torch.tensor([[[1.0, 2.0], [0.0, 0.0]], [[3.0, 4.0], [5.0, 6.0]]])
    assert p3d.padded_to_packed(three_d, [1, 2]).tolist() == [[1, 2], [3, 4], [5, 6]]
    assert p3d.padded_to_packed(three_d, pad_value=0.0).tolist() == [[1, 2], [3, 4], [5, 6]]
    assert p3d.padded_to_packed(three_d).shape == (4, 2)
    with pytest.raises(ValueError, match="Only one of split_size or pad_value"):
        p3d.padded_to_packed(three_d, [1, 2], 0.0)
    with pytest.raises(ValueError, match="3-dimensional"):
        p3d.padded_to_packed(torch.ones(2, 2))
