"""Graphs of different sizes in one batch: edges as packed node indices, one round of message
passing (sum of neighbours' features) with one gather and one scatter-add over all graphs.

Run: ``python examples/graph_message_passing.py``
"""

from __future__ import annotations

import torch

import nestbatch as nb


def message_passing(nodes: nb.NestedBatch, edges: nb.NestedBatch) -> nb.NestedBatch:
    """For every node, the sum of the features of the nodes with an edge into it.

    ``nodes`` ``(B, (N_i), F)``; ``edges`` ``(B, (E_i), 2)`` local ``(source, target)`` pairs.
    """
    packed = nb.packed_indices(edges, nodes).values  # (E_total, 2) rows of nodes.values
    source, target = packed[:, 0], packed[:, 1]
    messages = nodes.values[source]  # (E_total, F)
    summed = torch.zeros_like(nodes.values).index_add_(0, target, messages)
    return nodes.with_values(summed)


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    nodes = nb.nested([torch.randn(n, 4, generator=gen) for n in (3, 5, 1)])
    edges = nb.nested([
        torch.tensor([[0, 1], [1, 2], [2, 0]]),  # a directed triangle
        torch.tensor([[0, 4], [1, 4], [2, 4], [3, 4]]),  # a star into node 4
        torch.zeros(0, 2, dtype=torch.int64),  # a lone node: no edge
    ])
    out = message_passing(nodes, edges)
    star = nodes.unbind()[1]
    print("nodes per graph:", nodes.lengths.tolist(), "edges per graph:", edges.lengths.tolist())
    print("star centre gets the sum of the leaves:",
          torch.allclose(out.unbind()[1][4], star[:4].sum(0)))
    print("lone node gets nothing:", out.unbind()[2].abs().sum().item() == 0.0)


if __name__ == "__main__":
    main()
