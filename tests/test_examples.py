"""The examples run end to end (tiny sizes, fixed seeds) and print their results."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = {
    "nlp_pipeline.py": "tagging loss",
    "pointcloud_pipeline.py": "per-cloud features: (5, 32)",
    "handover.py": "empty scene state is zero: True",
    "transformer_encoder.py": "matches the per-sentence block: True",
    "mesh_normals.py": "mean unit normal of the square: [0.0, 0.0, 1.0]",
    "graph_message_passing.py": "star centre gets the sum of the leaves: True",
    "distributed_gather.py": "boxes per image on every rank: [3, 0, 1, 4, 2]",
    "documents.py": "padded to (B, max sentences, max tokens, features): (3, 3, 5, 8)",
    "left_padded_prompts.py": "last position read back: True",
    "moe_dispatch.py": "loss equals the single-process reference: True",
    "train_lm_packed.py": "float64: padded, bucketed and packed losses and gradients agree: True",
}


#: Examples on gloo process groups. gloo sometimes aborts a rank while tearing down, after all
#: work is done (seen once in moe_dispatch.py under torch 2.14.1; tests/distributed_harness.py
#: describes it): with the expected result printed first, that crash is not the example's.
GLOO_EXAMPLES = frozenset({"distributed_gather.py", "moe_dispatch.py"})
GLOO_TEARDOWN = "terminate called without an active exception"


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_runs(name):
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name)],
        capture_output=True, text=True, timeout=120, env=env, cwd=ROOT,
    )
    assert EXAMPLES[name] in result.stdout, result.stderr
    if result.returncode != 0 and name in GLOO_EXAMPLES and GLOO_TEARDOWN in result.stderr:
        return  # gloo aborted a rank in teardown, after the result above: not the example's
    assert result.returncode == 0, result.stderr
