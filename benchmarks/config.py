"""The benchmark's configuration, in a module of its own: every part of the benchmark imports it, and it imports
none of them (so that the parts import no circle)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Config:
    d_model: int = 768
    h: int = 12
    batch: int = 1
    lengths: tuple[int, ...] = (128, 512, 1024)
    decode_tokens: int = 512
    decode_sizes: tuple[tuple[int, int], ...] = ((768, 12), (64, 4))  # (d_model, h) of the decode-step timing
    memory_T: int = 4096
    min_run_time: float = 0.5
    rounds: int = 5
    threads: int = 2
    smoke: bool = False


SMOKE = dict(d_model=64, h=4, lengths=(16,), decode_tokens=16, memory_T=256, min_run_time=0.01, rounds=1)
