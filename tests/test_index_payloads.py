"""Index payloads against per-sample loops and PyTorch3D's faces_packed rule, and the mesh and
graph examples' computations against plain per-sample code."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import nestbatch as nb
from nestbatch.ops.index_payloads import INDEX_FILLER

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

from graph_message_passing import message_passing  # noqa: E402
from mesh_normals import mesh_normals  # noqa: E402


@st.composite
def payloads(draw):
    """Targets of random sizes (zero included) and index samples into them."""
    num = draw(st.integers(0, 5))
    sizes = [draw(st.integers(0, 6)) for _ in range(num)]
    width = draw(st.sampled_from([(), (2,), (3,)]))
    dtype = draw(st.sampled_from([torch.int32, torch.int64]))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    targets = [torch.randn(n, 3, generator=gen) for n in sizes]
    index_samples = []
    for n in sizes:
        rows = draw(st.integers(0, 4)) if n else 0
        index_samples.append(torch.randint(0, max(n, 1), (rows, *width), generator=gen,
                                           dtype=dtype))
    return targets, index_samples


@given(payloads())
def test_packed_and_local_indices_match_the_faces_packed_rule(case):
    targets, index_samples = case
    into = nb.nested(targets, dtype=torch.float32) if targets else \
        nb.NestedBatch.from_lengths(torch.zeros(0, 3), [])
    indices = nb.nested(index_samples) if index_samples else \
        nb.NestedBatch.from_lengths(torch.zeros(0, dtype=torch.int64), [])
    out = nb.packed_indices(indices, into)
    first = [0]
    for t in targets:
        first.append(first[-1] + len(t))
    expected = [s + first[i] for i, s in enumerate(index_samples)]  # PyTorch3D's rule
    assert all(torch.equal(a, b) for a, b in zip(out.unbind(), expected))
    assert out.dtype == indices.dtype
    for i, s in enumerate(index_samples):  # the packed rows are the sample's rows
        if len(s):
            rows = out.unbind()[i].long()
            assert torch.equal(into.values[rows], targets[i][s.long()])
    back = nb.local_indices(out.values, indices, into)
    assert all(torch.equal(a, b) for a, b in zip(back.unbind(), index_samples))


def test_out_of_range_indices_and_bad_arguments_raise():
    into = nb.nested([torch.rand(2, 3), torch.rand(3, 3)])
    with pytest.raises(ValueError, match="outside its sample's local range"):
        nb.packed_indices(nb.nested([torch.tensor([0, 2]), torch.tensor([0])]), into)
    with pytest.raises(ValueError, match="outside its sample's local range"):
        nb.packed_indices(nb.nested([torch.tensor([-1]), torch.tensor([0])]), into)
    faces = nb.nested([torch.tensor([0, 1]), torch.tensor([2])])
    with pytest.raises(ValueError, match="global range"):
        nb.local_indices(torch.tensor([0, 1, 1]), faces, into)  # row 2 points into sample 0
    with pytest.raises(ValueError, match="into has 2"):
        nb.packed_indices(nb.nested([torch.tensor([0])]), into)
    with pytest.raises(TypeError, match="integers"):
        nb.packed_indices(nb.nested([torch.tensor([0.0]), torch.tensor([1.0])]), into)
    with pytest.raises(ValueError, match="shaped as indices.values"):
        nb.local_indices(torch.tensor([0, 1]), faces, into)
    unchecked = nb.packed_indices(nb.nested([torch.tensor([0, 9]), torch.tensor([0])]), into,
                                  validate=False)
    assert unchecked.values.tolist() == [0, 9, 2]


def test_padded_index_slots_hold_the_filler():
    faces = nb.nested([torch.tensor([[0, 1, 2]]), torch.tensor([[0, 1, 2], [1, 2, 3]])])
    verts = nb.nested([torch.rand(3, 3), torch.rand(4, 3)])
    padded = nb.packed_indices(faces, verts).to_padded_tensor(INDEX_FILLER)
    assert padded[0, 1].tolist() == [-1, -1, -1]
    assert INDEX_FILLER == -1


def test_mesh_example_against_a_per_mesh_loop():
    gen = torch.Generator().manual_seed(3)
    vert_counts, face_counts = [5, 3, 8], [4, 1, 9]
    verts = [torch.randn(n, 3, generator=gen, dtype=torch.float64) for n in vert_counts]
    faces = [torch.randint(0, n, (f, 3), generator=gen) for n, f in zip(vert_counts, face_counts)]
    normals, per_mesh = mesh_normals(nb.nested(verts), nb.nested(faces))
    for i, (v, f) in enumerate(zip(verts, faces)):
        corners = v[f]
        expect = torch.cross(corners[:, 1] - corners[:, 0], corners[:, 2] - corners[:, 0], dim=1)
        start = sum(face_counts[:i])
        torch.testing.assert_close(normals[start:start + len(f)], expect)
        unit = torch.nn.functional.normalize(expect, dim=1)
        torch.testing.assert_close(per_mesh[i], unit.mean(0))


def test_graph_example_against_a_per_graph_loop():
    gen = torch.Generator().manual_seed(4)
    node_counts, edge_counts = [4, 1, 6, 0], [5, 0, 9, 0]
    nodes = [torch.randn(n, 2, generator=gen, dtype=torch.float64) for n in node_counts]
    edges = [torch.randint(0, max(n, 1), (e, 2), generator=gen)
             for n, e in zip(node_counts, edge_counts)]
    out = message_passing(nb.nested(nodes), nb.nested(edges))
    for x, e, got in zip(nodes, edges, out.unbind()):
        expect = torch.zeros_like(x)
        for s, t in e.tolist():
            expect[t] += x[s]
        torch.testing.assert_close(got, expect)


@pytest.mark.parametrize("dtype", [torch.int16, torch.int8, torch.uint8, torch.int32])
def test_narrow_index_dtypes_never_wrap(dtype):
    """Local ids that fit a narrow dtype while the packed rows do not: the shift and the range
    check ran in the indices' dtype and wrapped (int16 edges of 400 graphs of 100 nodes gave
    -25636, and the check passed)."""
    nodes = nb.nested([torch.randn(100, 2) for _ in range(400)])  # 40,000 packed rows
    local = torch.tensor([[0, 99]], dtype=dtype)
    edges = nb.nested([local] * 400)
    packed = nb.packed_indices(edges, nodes)
    expected = edges.values.long() + nodes.offsets[:-1][edges.row_ids][:, None]
    assert packed.values.dtype == (torch.int32 if dtype == torch.int32 else torch.int64)
    assert torch.equal(packed.values.long(), expected)
    assert torch.equal(nodes.values[packed.values[-1].long()], nodes[399][[0, 99]])
    back = nb.local_indices(packed, edges, nodes)
    assert torch.equal(back.values.long(), edges.values.long())
    # The inverse keeps the packed dtype: the local ids fit it whenever the packed ones do.
    small = nb.local_indices(packed.values.to(torch.int64), edges, nodes)
    assert small.values.dtype == torch.int64
