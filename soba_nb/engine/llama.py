"""A llama-architecture transformer in numpy: the embedded model's forward pass.

SmolLM2-135M is small enough that plain numpy (its BLAS) runs it at a usable speed on two
cores — about 300 prompt tokens and 30-40 generated tokens a second — with no native build
and nothing that can crash the process it runs in. The weights are the GGUF's, dequantized
once to float32 (about 540 MB for the 135M model); the arithmetic follows llama.cpp's
`llama` graph: RMS norm, rotary embeddings on adjacent pairs (GGUF stores Q and K permuted
for that), grouped-query attention, a SwiGLU feed-forward, tied or separate output weights.

The KV cache keeps the tokens it holds, so a request that starts with the previous one's
tokens (a conversation that grew by one turn) only computes what is new. Long prompts are
processed in chunks, which bounds the attention scores held at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from soba_nb.engine.gguf_file import GGUFError, GGUFFile

PREFILL_CHUNK = 256
"""Prompt tokens computed together (attention scores held: chunk × context × heads)."""
CACHE_GROWTH = 512
"""The KV cache grows in steps of this many positions."""
SUPPORTED_ARCHITECTURES = frozenset({"llama"})

Progress = Callable[[float], None]


@dataclass(frozen=True)
class Hyperparameters:
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ctx: int
    rope_base: float
    norm_eps: float

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @classmethod
    def from_gguf(cls, gguf: GGUFFile) -> Hyperparameters:
        arch = gguf.architecture
        if arch not in SUPPORTED_ARCHITECTURES:
            raise GGUFError(
                f"{gguf.path}: architecture {arch!r}; this engine runs llama-architecture models"
            )

        def get(key: str, default: float | None = None) -> float:
            value = gguf.metadata.get(f"{arch}.{key}", default)
            if value is None:
                raise GGUFError(f"{gguf.path}: metadata {arch}.{key} is missing")
            return float(value)

        n_head = int(get("attention.head_count"))
        return cls(
            n_layer=int(get("block_count")),
            n_embd=int(get("embedding_length")),
            n_head=n_head,
            n_head_kv=int(get("attention.head_count_kv", n_head)),
            n_ctx=int(get("context_length")),
            rope_base=get("rope.freq_base", 10000.0),
            norm_eps=get("attention.layer_norm_rms_epsilon", 1e-5),
        )


@dataclass
class Layer:
    attn_norm: np.ndarray
    wqkv: np.ndarray
    """Q, K and V projections side by side, (n_embd, n_embd + 2 × kv width): one matmul."""
    wo: np.ndarray
    ffn_norm: np.ndarray
    w_gate_up: np.ndarray
    """Gate and up projections side by side, (n_embd, 2 × n_ff)."""
    w_down: np.ndarray


@dataclass
class KVCache:
    """Keys and values per layer for the first `length` positions, and their tokens."""

    keys: list[np.ndarray]
    values: list[np.ndarray]
    tokens: list[int] = field(default_factory=list)

    @property
    def length(self) -> int:
        return len(self.tokens)

    def reserve(self, positions: int) -> None:
        capacity = self.keys[0].shape[0]
        if positions <= capacity:
            return
        grown = max(positions, capacity + CACHE_GROWTH)
        for store in (self.keys, self.values):
            for index, array in enumerate(store):
                bigger = np.empty((grown, *array.shape[1:]), dtype=np.float32)
                bigger[:capacity] = array
                store[index] = bigger


class LlamaModel:
    """The model: `LlamaModel(gguf)` loads the weights (`on_progress(0..1)` as it goes)."""

    def __init__(self, gguf: GGUFFile, *, on_progress: Progress | None = None):
        self.hp = hp = Hyperparameters.from_gguf(gguf)

        def tensor(name: str) -> np.ndarray:
            return np.ascontiguousarray(gguf.tensor(name), dtype=np.float32)

        self.embeddings = tensor("token_embd.weight")
        self.output_norm = tensor("output_norm.weight")
        output = gguf.tensors.get("output.weight")
        self.output = tensor("output.weight") if output is not None else self.embeddings
        self.layers: list[Layer] = []
        for index in range(hp.n_layer):
            p = f"blk.{index}."
            self.layers.append(
                Layer(
                    attn_norm=tensor(p + "attn_norm.weight"),
                    wqkv=np.ascontiguousarray(
                        np.concatenate(
                            [
                                tensor(p + "attn_q.weight"),
                                tensor(p + "attn_k.weight"),
                                tensor(p + "attn_v.weight"),
                            ]
                        ).T
                    ),
                    wo=np.ascontiguousarray(tensor(p + "attn_output.weight").T),
                    ffn_norm=tensor(p + "ffn_norm.weight"),
                    w_gate_up=np.ascontiguousarray(
                        np.concatenate(
                            [tensor(p + "ffn_gate.weight"), tensor(p + "ffn_up.weight")]
                        ).T
                    ),
                    w_down=np.ascontiguousarray(tensor(p + "ffn_down.weight").T),
                )
            )
            if on_progress is not None:
                on_progress((index + 1) / hp.n_layer)
        self.vocab_size = self.embeddings.shape[0]
        half = hp.head_dim // 2
        self._inv_freq = (
            hp.rope_base ** (-np.arange(half, dtype=np.float64) * 2 / hp.head_dim)
        ).astype(np.float64)
        self._scale = 1.0 / float(np.sqrt(hp.head_dim))

    @property
    def weight_bytes(self) -> int:
        arrays = [self.embeddings, self.output_norm] + [
            a for layer in self.layers for a in vars(layer).values()
        ]
        if self.output is not self.embeddings:
            arrays.append(self.output)
        return sum(a.nbytes for a in arrays)

    def new_cache(self) -> KVCache:
        hp = self.hp
        shape = (0, hp.n_head_kv, hp.head_dim)
        return KVCache(
            [np.empty(shape, np.float32) for _ in range(hp.n_layer)],
            [np.empty(shape, np.float32) for _ in range(hp.n_layer)],
        )

    def prefill(
        self,
        cache: KVCache,
        tokens: Sequence[int],
        *,
        should_stop: Callable[[], bool] | None = None,
        on_chunk: Callable[[int, int], None] | None = None,
    ) -> np.ndarray | None:
        """Bring `cache` to exactly `tokens` (reusing the prefix it already holds) and return
        the logits after the last token; None if `should_stop` said so between chunks.
        `on_chunk(done, total)` after each chunk: prompt tokens in the cache so far, of all."""
        keep = 0
        limit = min(cache.length, len(tokens) - 1)  # always compute at least the last token
        while keep < limit and cache.tokens[keep] == tokens[keep]:
            keep += 1
        del cache.tokens[keep:]
        logits: np.ndarray | None = None
        for start in range(keep, len(tokens), PREFILL_CHUNK):
            if should_stop is not None and should_stop():
                return None
            logits = self.forward(cache, tokens[start : start + PREFILL_CHUNK])
            if on_chunk is not None:
                on_chunk(cache.length, len(tokens))
        assert logits is not None
        return logits

    def forward(self, cache: KVCache, tokens: Sequence[int]) -> np.ndarray:
        """Append `tokens` to the cache; the logits after the last one (float32, vocab)."""
        hp = self.hp
        start, count = cache.length, len(tokens)
        if start + count > hp.n_ctx:
            raise ValueError(f"{start + count} positions exceed the model's window of {hp.n_ctx}")
        cache.reserve(start + count)
        x = self.embeddings[np.asarray(tokens, dtype=np.int64)]
        cos, sin = self._rope(start, count)
        for index, layer in enumerate(self.layers):
            x = x + self._attention(
                layer, self._norm(x, layer.attn_norm), cache, index, start, cos, sin
            )
            h = self._norm(x, layer.ffn_norm)
            gate, up = np.split(h @ layer.w_gate_up, 2, axis=-1)
            x = x + ((gate / (1.0 + np.exp(-gate))) * up) @ layer.w_down
        cache.tokens.extend(int(t) for t in tokens)
        last = self._norm(x[-1:], self.output_norm)
        logits: np.ndarray = (last @ self.output.T)[0]
        return logits

    def _norm(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        normed: np.ndarray = (
            x / np.sqrt((x * x).mean(-1, keepdims=True) + self.hp.norm_eps) * weight
        )
        return normed

    def _rope(self, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        angles = (
            np.arange(start, start + count, dtype=np.float64)[:, None] * self._inv_freq[None, :]
        )
        return np.cos(angles).astype(np.float32)[:, None, :], np.sin(angles).astype(np.float32)[
            :, None, :
        ]

    @staticmethod
    def _rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        even, odd = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = even * cos - odd * sin
        out[..., 1::2] = even * sin + odd * cos
        return out

    def _attention(
        self,
        layer: Layer,
        h: np.ndarray,
        cache: KVCache,
        index: int,
        start: int,
        cos: np.ndarray,
        sin: np.ndarray,
    ) -> np.ndarray:
        hp = self.hp
        count, dim, kv_dim = h.shape[0], hp.head_dim, hp.n_head_kv * hp.head_dim
        qkv = h @ layer.wqkv
        q = self._rotate(qkv[:, : hp.n_embd].reshape(count, hp.n_head, dim), cos, sin)
        k = self._rotate(
            qkv[:, hp.n_embd : hp.n_embd + kv_dim].reshape(count, hp.n_head_kv, dim), cos, sin
        )
        v = qkv[:, hp.n_embd + kv_dim :].reshape(count, hp.n_head_kv, dim)
        end = start + count
        cache.keys[index][start:end] = k
        cache.values[index][start:end] = v
        keys, values = cache.keys[index][:end], cache.values[index][:end]
        group = hp.n_head // hp.n_head_kv
        # (kv heads, group, queries, dim) against (kv heads, 1, positions, dim)
        queries = q.reshape(count, hp.n_head_kv, group, dim).transpose(1, 2, 0, 3)
        scores = (queries @ keys.transpose(1, 2, 0)[:, None]) * self._scale
        if count > 1:  # causal: a query sees positions up to its own
            future = np.arange(end)[None, :] > (np.arange(count)[:, None] + start)
            scores[..., future] = -np.inf
        scores -= scores.max(-1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= scores.sum(-1, keepdims=True)
        out = scores @ values.transpose(1, 0, 2)[:, None]
        projected: np.ndarray = out.transpose(2, 0, 1, 3).reshape(count, hp.n_embd) @ layer.wo
        return projected
