"""Preallocated KV cache shared by the target, the MTP head and the drafter context.

Each request b owns rows [0, cap) of every layer's buffer. A forward writes its q new rows at the positions given in
`write_pos` ([B, q]); what is *committed* is tracked outside the cache as a length per request, so rolling back
rejected candidates is just not advancing that length: stale rows are overwritten by the next forward before any
query can see them, because every mask below only exposes key positions <= the query's own position (or < anchor).
"""
from __future__ import annotations

import torch


class KVCache:
    """Duck-types the part of `transformers.Cache` that HF attention layers call (`update`)."""

    is_compileable = False

    def __init__(self, batch: int, capacity: int):
        self.batch, self.capacity = batch, capacity
        self.k: dict[int, torch.Tensor] = {}
        self.v: dict[int, torch.Tensor] = {}
        self.write_pos: torch.Tensor | None = None  # [B, q] absolute positions of the rows being written

    def _buffers(self, layer: int, like: torch.Tensor):
        if layer not in self.k:
            b, h, _, d = like.shape
            shape = (self.batch, h, self.capacity, d)
            self.k[layer] = torch.zeros(shape, dtype=like.dtype, device=like.device)
            self.v[layer] = torch.zeros(shape, dtype=like.dtype, device=like.device)
        return self.k[layer], self.v[layer]

    def update(self, k: torch.Tensor, v: torch.Tensor, layer_idx: int, cache_kwargs=None):
        """k, v: [B, H, q, D] -> full buffers [B, H, cap, D] after writing rows at `write_pos`."""
        kb, vb = self._buffers(layer_idx, k)
        pos = self.write_pos
        if pos is None or pos.shape != (k.shape[0], k.shape[2]):
            raise RuntimeError("KVCache.write_pos must be set to [batch, q] before a forward")
        if int(pos.max()) >= self.capacity:
            raise RuntimeError(f"KV cache capacity {self.capacity} exceeded (position {int(pos.max())})")
        bi = torch.arange(k.shape[0], device=k.device)[:, None]
        kb[bi, :, pos] = k.transpose(1, 2).to(kb.dtype)
        vb[bi, :, pos] = v.transpose(1, 2).to(vb.dtype)
        return kb, vb

    # HF helpers that some code paths query
    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0

    def __len__(self):
        return len(self.k)


def causal_mask(pos: torch.Tensor, capacity: int) -> torch.Tensor:
    """[B, 1, q, cap] bool: a query at absolute position p sees cache rows j <= p."""
    j = torch.arange(capacity, device=pos.device)
    return (j[None, None, :] <= pos[:, :, None])[:, None]
