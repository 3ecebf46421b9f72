"""Preallocated KV cache shared by the target, the MTP head and the drafter context; linear-attention states too.

Full attention. Each request b owns rows [0, cap) of every layer's buffer. A forward writes its q new rows at the
positions given in `write_pos` ([B, q]); what is *committed* is tracked outside the cache as a length per request, so
rolling back rejected candidates is just not advancing that length: stale rows are overwritten by the next forward
before any query can see them, because every mask below only exposes key positions <= the query's own position (or
< anchor).

Linear attention (Gated DeltaNet layers of hybrid Qwen3.5/3.6 targets). A GDN layer keeps, per request, a
recurrent state S [Hv, dk, dv] and the last K inputs of its causal depthwise conv; both fold in every token they see,
so they cannot be cropped like KV rows. Our choice: *record, then select* (no replay, no recomputation).
  - Before a cached forward of q rows, `Target` sets `cuts`: the row counts after which a state may be kept. The GDN
    layers run their q rows segment by segment between cuts (HF's own kernels: chunked for long segments, the
    recurrent one for single tokens) and call `cut(layer, c)` after each, so the cache sees the exact state after c
    rows of every request.
  - Verify ([A, T1..Tk], acceptance unknown): cuts = 1..q; every intermediate state is kept until `commit(n)` picks,
    per request, the state after its n committed rows (A + accepted drafts; requests differ in n). Memory: q states
    per linear layer and request for the duration of one round (SGLang keeps the same "intermediate SSM states").
  - Prefill (right-padded prompts of different lengths, `keep` = prompt lengths known up front): cuts = the distinct
    prompt lengths; at cut c the rows whose prompt ends at c save their state, so padding never reaches a request's
    state, and no history is held.
Full-attention rows written for rejected candidates are harmless as above. A target with full attention only never
sets `cuts`, and `commit` is a no-op: the fast path is untouched.
"""
from __future__ import annotations

import torch


class _LinearLayerView:
    """What HF's GatedDeltaNet reads through `cache.layers[i]` (transformers 5.17): `record_past`, `conv_states[0]`,
    `recurrent_states[0]`. `record_past = True` keeps HF off its in-place single-token conv update, so every state
    change goes through `update_conv_state` / `update_recurrent_state` below."""

    record_past = True

    def __init__(self, cache: "KVCache", layer: int):
        self.cache, self.layer = cache, layer

    @property
    def conv_states(self):
        return {0: self.cache.conv.get(self.layer)}

    @property
    def recurrent_states(self):
        return {0: self.cache.rec.get(self.layer)}


class _LayerViews:
    def __init__(self, cache):
        self.cache = cache

    def __getitem__(self, i):
        return _LinearLayerView(self.cache, i)


class KVCache:
    """Duck-types the part of `transformers.Cache` that HF attention layers (`update`) and Gated DeltaNet layers
    (`has_previous_state`, `update_conv_state`, `update_recurrent_state`, `layers[i]`) call."""

    is_compileable = False

    def __init__(self, batch: int, capacity: int, fast: bool = False):
        self.batch, self.capacity = batch, capacity
        # decode steps over this cache run the compiled engine's forwards (`fast.py`: attention over the valid rows);
        # its capacity is then a whole number of flex-attention blocks. Prefill writes it through the HF path as usual
        # (or `fast.prefill_forward`).
        self.fast = fast
        self.k: dict[int, torch.Tensor] = {}
        self.v: dict[int, torch.Tensor] = {}
        self.write_pos: torch.Tensor | None = None  # [B, q] absolute positions of the rows being written
        # linear attention (hybrid targets only)
        self.conv: dict[int, torch.Tensor] = {}  # layer -> [B, C, K] the last K conv inputs
        self.rec: dict[int, torch.Tensor] = {}  # layer -> [B, Hv, dk, dv] recurrent state
        self.cuts: list[int] | None = None  # row counts after which GDN layers report their state (see docstring)
        self._keep: torch.Tensor | None = None  # [B] rows to keep, when known before the forward (prefill)
        self._saved: dict[int, list[torch.Tensor]] = {}  # layer -> [conv, rec] saved at each row's own cut
        self._hist: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}  # layer -> state after cut 1..q
        self.layers = _LayerViews(self)

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
        # on CUDA and in compiled code `Batch` has sized the cache: no host sync here
        if not pos.is_cuda and not torch.compiler.is_compiling() and int(pos.max()) >= self.capacity:
            raise RuntimeError(f"KV cache capacity {self.capacity} exceeded (position {int(pos.max())})")
        bi = torch.arange(k.shape[0], device=k.device)[:, None]
        kb[bi, :, pos] = k.transpose(1, 2).to(kb.dtype)
        vb[bi, :, pos] = v.transpose(1, 2).to(vb.dtype)
        return kb, vb

    def copy_rows(self, other: "KVCache", dst: torch.Tensor, src: "torch.Tensor | slice"):
        """Rows `src` (indices, or a slice of them) of another cache (same capacity) into rows `dst` of this one: KV
        and linear-attention states (dynamic batching moves freshly prefilled requests into free slots this way)."""
        if other.capacity != self.capacity:
            raise ValueError(f"cache capacities differ ({other.capacity} vs {self.capacity})")
        for mine, theirs in ((self.k, other.k), (self.v, other.v), (self.conv, other.conv), (self.rec, other.rec)):
            for layer, t in theirs.items():
                if layer not in mine:
                    mine[layer] = t.new_zeros((self.batch, *t.shape[1:]))
                mine[layer][dst] = t[src]

    # --- linear attention: the calls HF's Qwen3_5GatedDeltaNet makes ----------------------------------------------
    def has_previous_state(self, layer_idx: int | None = None, state_idx: int = 0) -> bool:
        return layer_idx in self.rec

    def update_conv_state(self, x: torch.Tensor, layer_idx: int, state_idx: int = 0, conv_kernel_size=None, **kw):
        """x [B, C, s] new conv inputs -> [B, C, K + s] (previous K inputs, zeros at the start, then x); keeps the
        last K. HF convolves the result causally and keeps the last s outputs."""
        K = int(conv_kernel_size)
        prev = self.conv.get(layer_idx)
        if prev is None:
            prev = x.new_zeros(*x.shape[:2], K)
        full = torch.cat([prev, x.to(prev.dtype)], -1)
        self.conv[layer_idx] = full[..., -K:].contiguous()
        return full

    def update_recurrent_state(self, s: torch.Tensor, layer_idx: int, state_idx: int = 0, **kw):
        self.rec[layer_idx] = s
        return s

    # --- linear attention: record, then select ------------------------------------------------------------------
    def begin(self, q: int, keep: torch.Tensor | None = None):
        """Called by `Target.forward` before a cached forward of q rows on a hybrid target. keep [B] (rows each
        request keeps) known -> states are saved at each request's own cut; None -> every cut is recorded for
        `commit`."""
        self._hist, self._saved = {}, {}
        if keep is None:
            self._keep, self.cuts = None, list(range(1, q + 1))
        else:
            self._keep = keep
            self.cuts = sorted(set(int(c) for c in keep.tolist()) | {q})

    def cut(self, layer: int, c: int):
        """A GDN layer has consumed the first c rows of this forward (called by the layer wrapper in `target.py`)."""
        conv, rec = self.conv[layer], self.rec[layer]
        if self._keep is None:
            # references suffice: HF's kernels (torch and FLA) return fresh state tensors, and `record_past` keeps HF
            # off its in-place conv update, so nothing writes into a recorded state afterwards
            self._hist.setdefault(layer, []).append((conv, rec))
            return
        if layer not in self._saved:
            self._saved[layer] = [torch.empty_like(conv), torch.empty_like(rec)]
        saved = self._saved[layer]
        rows = self._keep == c
        saved[0][rows], saved[1][rows] = conv[rows], rec[rows]
        if c == self.cuts[-1]:  # every request has reached its own cut: its saved state is the state
            self.conv[layer], self.rec[layer] = saved

    def end(self):
        self.cuts = None

    def commit(self, n: torch.Tensor):
        """Keep the state after the first n[b] rows of the last verify forward (n >= 1); no-op without linear layers
        (full-attention rollback is the caller's length bookkeeping). Reads each kept state once: rows that kept
        fewer than all rows are copied over the final state, grouped by their count."""
        if not self._hist:
            return
        groups: dict[int, list[int]] = {}
        for b, i in enumerate((n - 1).tolist()):
            groups.setdefault(int(i), []).append(b)
        for layer, hist in self._hist.items():
            conv, rec = hist[-1]  # the state after all q rows (a tensor of our own: overwritten in place below)
            for i, rows in groups.items():
                if i != len(hist) - 1:
                    r = torch.tensor(rows, device=conv.device)
                    conv.index_copy_(0, r, hist[i][0].index_select(0, r))
                    rec.index_copy_(0, r, hist[i][1].index_select(0, r))
            self.conv[layer], self.rec[layer] = conv, rec
        self._hist = {}

    # HF helpers that some code paths query
    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0

    def __len__(self):
        return len(self.k)


def causal_mask(pos: torch.Tensor, capacity: int) -> torch.Tensor:
    """[B, 1, q, cap] bool: a query at absolute position p sees cache rows j <= p."""
    j = torch.arange(capacity, device=pos.device)
    return (j[None, None, :] <= pos[:, :, None])[:, None]
