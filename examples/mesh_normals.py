"""Meshes of different sizes: packed faces gather vertex positions, per-face normals, and the
mean face normal of every mesh, with no loop over the meshes.

Run: ``python examples/mesh_normals.py``
"""

from __future__ import annotations

import torch

import nestbatch as nb


def mesh_normals(
    verts: nb.NestedBatch, faces: nb.NestedBatch
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(face normals (F_total, 3), mean unit normal per mesh (B, 3))``."""
    faces_packed = nb.packed_indices(faces, verts)  # PyTorch3D's faces_packed rule
    corners = verts.values[faces_packed.values]  # (F_total, 3 corners, 3 coordinates)
    normals = torch.cross(corners[:, 1] - corners[:, 0], corners[:, 2] - corners[:, 0], dim=1)
    unit = torch.nn.functional.normalize(normals, dim=1)
    per_mesh = torch.mean(faces.with_values(unit), dim=1)  # a segment mean over each mesh's faces
    return normals, per_mesh


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    # A square in the z=0 plane (2 faces), a tetrahedron (4 faces), a triangle in x=0 (1 face).
    square = torch.tensor([[0.0, 0, 0], [1, 0, 0], [1, 1, 0], [0, 1, 0]])
    tetra = torch.rand(4, 3, generator=gen)
    tri = torch.tensor([[0.0, 0, 0], [0, 1, 0], [0, 0, 1]])
    verts = nb.nested([square, tetra, tri])
    faces = nb.nested([
        torch.tensor([[0, 1, 2], [0, 2, 3]]),
        torch.tensor([[0, 1, 2], [0, 1, 3], [0, 2, 3], [1, 2, 3]]),
        torch.tensor([[0, 1, 2]]),
    ])
    normals, per_mesh = mesh_normals(verts, faces)
    print("faces per mesh:", faces.lengths.tolist(), "face normals:", tuple(normals.shape))
    print("mean unit normal of the square:", per_mesh[0].tolist())
    print("mean unit normal of the triangle:", per_mesh[2].tolist())
    padded = faces.to_padded_tensor(nb.INDEX_FILLER)
    print("padded faces use the filler -1:", padded[2].tolist())


if __name__ == "__main__":
    main()
