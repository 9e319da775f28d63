"""Hand-over from the 3D pipeline to a sequence model: every scene is a varying number of point
clouds; each cloud becomes one feature vector (``pointcloud_pipeline``), and each scene's cloud
features form one sequence of a ``NestedBatch`` that a GRU reads directly.

Run: ``python examples/handover.py``
"""

from __future__ import annotations

import torch
from pointcloud_pipeline import PointNet, cloud_features, make_clouds
from torch import nn

import nestbatch


def main() -> None:
    torch.manual_seed(0)
    objects_per_scene = [3, 1, 0, 4]  # scene 2 is empty: its output is empty, its state h0
    clouds = make_clouds(sum(objects_per_scene), seed=1)
    features = cloud_features(clouds, PointNet())  # (total clouds, 32), scene after scene
    scenes = nestbatch.NestedBatch.from_lengths(features, objects_per_scene)
    print("scenes:", scenes.lengths.tolist(), "feature shape:", tuple(scenes.feature_shape))

    gru = nn.GRU(32, 16, batch_first=True)
    per_object, scene_state = gru(scenes)
    print("GRU outputs per object:", per_object.lengths.tolist(), tuple(per_object.feature_shape))
    print("scene states:", tuple(scene_state.shape),
          "empty scene state is zero:", bool((scene_state[:, 2] == 0).all()))

    classifier = nn.Linear(16, 4)
    scene_logits = classifier(scene_state[-1])
    loss = nn.functional.cross_entropy(scene_logits, torch.tensor([0, 1, 2, 3]))
    loss.backward()
    print(f"scene classification loss: {loss.item():.4f}")


if __name__ == "__main__":
    main()
