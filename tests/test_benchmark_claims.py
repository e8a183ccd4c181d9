"""Notebook 07's section 4 reads the recorded benchmark (mha/data/benchmark_results.json): each sentence it says about
that run, checked here, so that the notebook only shows the run and a new recording cannot silently contradict it."""

import importlib.resources
import json

import pytest

RES = json.loads(importlib.resources.files("mha").joinpath("data/benchmark_results.json").read_text())
LENGTHS = list(RES["time_s"]["forward"])
T = LENGTHS[-1]
TIMES = {mode: {name: v["s"] for name, v in RES["time_s"][mode][T].items()} for mode in RES["time_s"]}
SMALL = {mode: {name: v["s"] for name, v in RES["time_s"][mode][LENGTHS[0]].items()} for mode in RES["time_s"]}
MEMORY, CFG = RES["peak_bytes"], RES["config"]
TABLE = CFG["batch"] * CFG["h"] * CFG["memory_T"] ** 2 * 4  # one (B, h, T, T) float32 table, in bytes


def test_the_recorded_run_is_a_full_one_at_the_lengths_the_notebook_names():
    assert not CFG["smoke"], "this file comes from a --smoke run"
    assert LENGTHS == ["128", "512", "1024"] and CFG["memory_T"] == 4096 and CFG["decode_tokens"] == 512
    assert TABLE == 768 * 2**20  # "more than one 768 MiB table"


@pytest.mark.parametrize("mode", sorted(TIMES))
def test_the_fused_path_costs_about_the_minimal_layer_and_the_explicit_ones_half_again_at_1024(mode):
    fused = TIMES[mode]["mha fused"] / TIMES[mode]["reference"]
    assert abs(fused - 1) < 0.05 and f"{fused:.3f}" == {"forward": "0.965", "forward+backward": "0.984"}[mode]
    assert TIMES[mode]["mha fused"] < TIMES[mode]["mha explicit"]
    assert max(SMALL[mode]["mha explicit"], SMALL[mode]["torch weights"]) < 1.2 * SMALL[mode]["reference"]  # T=128
    assert min(TIMES[mode]["mha explicit"], TIMES[mode]["torch weights"]) > 1.5 * TIMES[mode]["reference"]
    # explicit paths hold a table, fused ones under a quarter of one
    assert min(MEMORY[mode]["mha explicit"], MEMORY[mode]["torch weights"]) > TABLE
    assert 4 * max(MEMORY[mode]["mha fused"], MEMORY[mode]["reference"]) < TABLE


def test_torch_fast_path_the_kv_cache_and_the_one_miss_as_the_notebook_reads_them():
    assert TIMES["forward"]["mha fused"] < TIMES["forward"]["torch fused"]  # nn.MHA's inference fast path is slower
    assert 4 * MEMORY["forward+backward"]["torch fused"] < TABLE < MEMORY["forward"]["torch fused"]  # and builds it
    assert RES["decode_s"]["recompute"]["s"] > 10 * RES["decode_s"]["kv cache"]["s"]
    misses = [row for row in RES["targets"] if not row["ok"]]
    assert len(misses) == 1 and f"{misses[0]['value']:.3f}" == "1.094"
    rounds = {name: RES["time_s"]["forward+backward"][T][name]["round_medians"]
              for name in ("mha explicit", "torch weights")}
    per_round = [a / b for a, b in zip(rounds["mha explicit"], rounds["torch weights"])]
    fastest, second = sorted(rounds["torch weights"])[:2]
    assert len(per_round) == 5 and sum(r < 1 for r in per_round) == 4  # mha's median is lower in 4 of 5 rounds
    assert fastest < 0.9 * second  # PyTorch's one fast round: more than 10% faster than its next
