"""Context parallelism (examples/cp_layer.py): a DSA layer over R ranks with the zig-zag split
against the whole sequence on one rank. Indices, lengths, out, lse and dq bitwise equal; dkv and
dsink (sums of R partials) within bf16 tolerance. R processes with gloo on the CPU (libdsa's CPU
reference), and with NCCL on GPUs where the machine has at least R of them."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
import cp_layer  # noqa: E402


def check(reports, R):
    assert sorted(reports) == list(range(R))
    for rank, rep in reports.items():
        for name in ("idx", "lengths", "out", "lse", "dq"):
            assert rep[name] is True, f"rank {rank}: {name} differs from the one-rank run"
        assert rep["dkv"] < 1e-2 and rep["dsink"] < 1e-2, f"rank {rank}: {rep}"


@pytest.mark.parametrize("R", [2, 4])
def test_cpu_ranks_match_one_rank(R):
    args = cp_layer.parse(["--device", "cpu", "--check", "--docs", "20", "28", "16", "--heads", "16"])
    check(cp_layer.spawn(R, args, port=29517 + R), R)


@pytest.mark.parametrize("R", [2, 4, 8])
def test_gpu_ranks_match_one_gpu(R):
    if not torch.cuda.is_available() or torch.cuda.device_count() < R:
        pytest.skip(f"needs {R} CUDA devices")
    args = cp_layer.parse(["--device", "cuda", "--check", "--deterministic", "--docs", "1000", "3000", "96",
                           "--heads", "64", "--topk", "2048"])
    check(cp_layer.spawn(R, args, port=29537 + R), R)
