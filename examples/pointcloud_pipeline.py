"""3D pipeline: point clouds of different sizes -> per-cloud centroid and plane normal computed
on the packed points (segment sums over ``row_ids``, no padding) -> padded points for a batched
PointNet-style network, whose max-pool ignores the padded slots.

Run: ``python examples/pointcloud_pipeline.py``
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

import nestbatch
from nestbatch.convert.kaolin import tile_to_packed


def make_clouds(num_clouds: int, seed: int = 0) -> list[Tensor]:
    """Noisy samples of random planes, ``(N_i, 3)`` with ``N_i`` between 20 and 60."""
    generator = torch.Generator().manual_seed(seed)
    clouds = []
    for _ in range(num_clouds):
        n = int(torch.randint(20, 60, (1,), generator=generator))
        uv = torch.rand(n, 2, generator=generator) * 2 - 1
        basis = torch.linalg.qr(torch.randn(3, 3, generator=generator))[0]
        offset = torch.randn(3, generator=generator)
        noise = 0.01 * torch.randn(n, generator=generator)
        clouds.append(uv @ basis[:, :2].T + noise[:, None] * basis[:, 2] + offset)
    return clouds


def segment_sum(batch: nestbatch.NestedBatch, rows: Tensor) -> Tensor:
    """Per-sample sum of packed ``rows (total, *f)``: ``(B, *f)``."""
    out = rows.new_zeros((batch.batch_size, *rows.shape[1:]))
    return out.index_add(0, batch.row_ids, rows)


def centroids_and_normals(points: nestbatch.NestedBatch) -> tuple[Tensor, Tensor]:
    """Centroid ``(B, 3)`` and best-fit plane normal ``(B, 3)`` of every cloud."""
    counts = points.lengths.to(points.dtype)[:, None]
    centroids = segment_sum(points, points.values) / counts
    centered = points.values - centroids[points.row_ids]
    covariance = segment_sum(points, centered[:, :, None] * centered[:, None, :])
    normals = torch.linalg.eigh(covariance).eigenvectors[:, :, 0]  # smallest eigenvalue
    return centroids, normals


class PointNet(nn.Module):
    """Shared per-point MLP, then a max-pool over the real points of every cloud."""

    def __init__(self, in_features: int = 6, out_features: int = 32) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(in_features, 64), nn.ReLU(), nn.Linear(64, out_features))

    def forward(self, padded: Tensor, mask: Tensor) -> Tensor:
        features = self.mlp(padded)
        features = features.masked_fill(~mask[..., None], float("-inf"))
        return features.amax(1)


def cloud_features(clouds: list[Tensor], net: PointNet) -> Tensor:
    """One feature vector per cloud ``(B, 32)``: geometry on packed points, network on padded."""
    points = nestbatch.nested(clouds)
    centroids, normals = centroids_and_normals(points)
    # Every point, centered, next to its cloud's normal (tiled to the packed rows, kaolin-style).
    normal_rows = torch.cat(
        [tile_to_packed(normals[:, d], points.lengths) for d in range(3)], dim=1
    )
    per_point = points.with_values(
        torch.cat([points.values - centroids[points.row_ids], normal_rows], dim=1)
    )
    padded = per_point.padded(0.0)
    return net(padded.data, padded.mask)


def main() -> None:
    torch.manual_seed(0)
    clouds = make_clouds(5)
    points = nestbatch.nested(clouds)
    centroids, normals = centroids_and_normals(points)
    for i, cloud in enumerate(clouds):
        residual = ((cloud - centroids[i]) @ normals[i]).abs().max().item()
        print(f"cloud {i}: {len(cloud):2d} points, centroid {centroids[i].numpy().round(2)}, "
              f"max distance to plane {residual:.3f}")
    padded = points.padded(0.0)
    print("padded points:", tuple(padded.data.shape), "mask:", tuple(padded.mask.shape))
    features = cloud_features(clouds, PointNet())
    print("per-cloud features:", tuple(features.shape))


if __name__ == "__main__":
    main()
