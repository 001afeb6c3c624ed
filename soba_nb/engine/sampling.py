"""Choosing the next token: repeat penalty, top-k, temperature, top-p, a seeded draw.

The order and the defaults follow llama.cpp's sampler chain closely enough that the tiny
model behaves as it did there: a mild repeat penalty keeps it from looping, a low
temperature keeps answers plain, and a fixed seed makes the same request give the same
answer (demos and CI).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

TEMPERATURE = 0.2
REPEAT_PENALTY = 1.1
REPEAT_LAST_N = 64
TOP_K = 40
TOP_P = 0.95
SEED = 0


@dataclass
class Sampler:
    """One request's sampler; `next(logits, history)` is the chosen token id."""

    temperature: float = TEMPERATURE
    repeat_penalty: float = REPEAT_PENALTY
    repeat_last_n: int = REPEAT_LAST_N
    top_k: int = TOP_K
    top_p: float = TOP_P
    seed: int = SEED

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.seed)

    def next(self, logits: np.ndarray, history: Sequence[int]) -> int:
        scores = logits.astype(np.float64, copy=True)
        recent = np.unique(np.asarray(history[-self.repeat_last_n :], dtype=np.int64))
        if recent.size and self.repeat_penalty != 1.0:
            picked = scores[recent]
            scores[recent] = np.where(
                picked > 0, picked / self.repeat_penalty, picked * self.repeat_penalty
            )
        if self.temperature <= 0:
            return int(np.argmax(scores))
        k = min(self.top_k, scores.size)
        candidates = np.argpartition(scores, -k)[-k:]
        candidates = candidates[np.argsort(scores[candidates])[::-1]]
        weights = np.exp((scores[candidates] - scores[candidates[0]]) / self.temperature)
        weights /= weights.sum()
        keep = int(np.searchsorted(np.cumsum(weights), self.top_p)) + 1
        weights = weights[:keep] / weights[:keep].sum()
        return int(candidates[self._rng.choice(keep, p=weights)])
