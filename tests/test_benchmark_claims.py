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
MEMORY = RES["peak_bytes"]
CFG = RES["config"]
TABLE = CFG["batch"] * CFG["h"] * CFG["memory_T"] ** 2 * 4  # one (B, h, T, T) float32 table, in bytes
MODES = sorted(TIMES)


def test_the_recorded_run_is_a_full_one_at_the_lengths_the_notebook_names():
    assert not CFG["smoke"], "this file comes from a --smoke run"
    assert LENGTHS == ["128", "512", "1024"] and CFG["memory_T"] == 4096 and CFG["decode_tokens"] == 512
    assert TABLE == 768 * 2**20  # "more than one 768 MiB table"


@pytest.mark.parametrize("mode", MODES)
def test_mha_fused_costs_about_the_minimal_layer_and_less_than_its_explicit_path(mode):
    assert abs(TIMES[mode]["mha fused"] / TIMES[mode]["reference"] - 1) < 0.2
    assert TIMES[mode]["mha fused"] < TIMES[mode]["mha explicit"]


@pytest.mark.parametrize("mode", MODES)
def test_the_explicit_paths_barely_show_at_128_and_cost_half_again_at_1024(mode):
    assert max(SMALL[mode]["mha explicit"], SMALL[mode]["torch weights"]) < 1.2 * SMALL[mode]["reference"]
    assert min(TIMES[mode]["mha explicit"], TIMES[mode]["torch weights"]) > 1.5 * TIMES[mode]["reference"]


def test_torch_fast_path_is_slower_than_mha_fused_in_inference():
    assert TIMES["forward"]["mha fused"] < TIMES["forward"]["torch fused"]


@pytest.mark.parametrize("mode", sorted(MEMORY))
def test_explicit_paths_hold_a_table_and_fused_ones_under_a_quarter(mode):
    assert min(MEMORY[mode]["mha explicit"], MEMORY[mode]["torch weights"]) > TABLE
    assert 4 * max(MEMORY[mode]["mha fused"], MEMORY[mode]["reference"]) < TABLE


def test_torch_need_weights_false_is_fused_in_training_and_builds_the_table_in_inference():
    assert 4 * MEMORY["forward+backward"]["torch fused"] < TABLE < MEMORY["forward"]["torch fused"]


def test_the_kv_cache_decodes_more_than_ten_times_faster():
    assert RES["decode_s"]["recompute"]["s"] > 10 * RES["decode_s"]["kv cache"]["s"]


def test_the_one_miss_is_a_tie_decided_by_one_fast_round():
    misses = [row for row in RES["targets"] if not row["ok"]]
    assert len(misses) == 1 and f"{misses[0]['value']:.3f}" == "1.094"
    rounds = {name: RES["time_s"]["forward+backward"][T][name]["round_medians"]
              for name in ("mha explicit", "torch weights")}
    per_round = [a / b for a, b in zip(rounds["mha explicit"], rounds["torch weights"])]
    fastest, second = sorted(rounds["torch weights"])[:2]
    assert len(per_round) == 5 and sum(r < 1 for r in per_round) == 4  # mha's median is lower in 4 of 5 rounds
    assert fastest < 0.9 * second  # PyTorch's one fast round: more than 10% faster than its next
