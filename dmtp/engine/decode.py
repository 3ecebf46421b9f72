"""One decode loop for every method: `ar`, `mtp` (chained native MTP, k steps), `dflash` and each DMTP variant
(the methods, built by name: dmtp/engine/methods/).

A round (docs/METHOD.md, "One round"), for a batch of requests each at its own anchor position a (A = last committed
token, not yet fed):
    cands = method.propose()                       # [B, k] draft tokens T1..Tk (k = 0 for ar)
    y     = target([A, T1..Tk] at a..a+k)          # the target's own token at every position (argmax or sample)
    n     = longest prefix with T_j == y_{j-1}     # accepted drafts
    emit y_0..y_n                                  # = T1..Tn + correction (or bonus when n = k)
    method.commit(n)                               # advance MTP / drafter context over committed rows only
Every emitted token is the target's own choice given the committed prefix, so at T = 0 the output is the target's
greedy output and at T > 0 it is distributed exactly as the target's samples (target-only verification). With
`verify="sample"` or `"block"` at T > 0 the drafts are samples of each drafter's tempered distribution and the
round accepts by speculative sampling or block verification instead (`verify.py`); the law of the output is the same.

The engine (docs/DESIGN.md, "Decode engine"):
  - caches are preallocated (`cache.KVCache`); rejecting candidates is not advancing a length, never a copy;
  - the MTP has a private KV cache; its advance always runs k+1 rows at a..a+k (the committed stream's first n+1
    rows plus scratch rows that the next advance overwrites before anything can see them) — a fixed shape;
  - the drafter's context K/V lives in one cache with a row per absolute position; each layer's visibility (the
    anchor window, or the public rule's sliding window) is a mask over it, not a copy;
  - outputs, accept counts, EOS and length checks are kept on the device; the host learns which requests finished
    from a pinned copy of the done flags that it reads a round or two later without waiting (no synchronisation per
    round in steady state); stop strings (`stop=`, `stops.py`) are matched on the host from pinned copies of each
    round's tokens that travel with those flags, and the record is cut exactly where the stop string ends;
  - on CUDA, the stages of a round — drafter, MTP advance, T1 head + embedding + fusion, verification, acceptance and
    record, drafter context, anchor/length update — are CUDA graphs captured per batch (serve: per batch cap) on first
    use (`graphs.py`);
  - the engine (`EngineConfig`, passed to `generate` / `Server` / `Batch`; `engine_for`): "compiled" (the default on
    CUDA) runs the models' decode steps through `models/fast.py` (attention over the valid cache rows, compiled
    regions) and compiles every other stage whole; "fast-eager" runs those forwards uncompiled; "hf" (the default on
    CPU) runs the HF layers.

    results = generate(target, build_method("zero_init_residual", target, drafter=d, mtp=m), prompts, 0.0, 128)

The round is `Batch.step`, below; what a batch holds and how the host follows it without waiting (prefill, device-side
record, copies in flight, graphs, moving requests in and out of slots) is `slots.py`; dynamic batching (a `Server`
keeping `cap` slots busy, newcomers prefilled and moved into freed slots) is `server.py`.
"""
from __future__ import annotations

import gc

import torch

from dmtp.compiling import announce
from dmtp.config import EngineConfig
from dmtp.engine.methods import Method
from dmtp.engine.slots import Result, Slots, engine_for, target_token
from dmtp.engine.stops import StopStrings
from dmtp.models import fast


class Batch(Slots):
    """Requests decoding together (`slots.Slots`: caches, method state, device-side record, the host's view) and
    the round that advances them all: `step`."""

    @torch.no_grad()
    def step(self):
        """One round for every live request (finished ones ride along; their rows are ignored)."""
        st, method = self.st, self.method
        with method.timer("round"):
            if self.draw.sampling:  # this round's races and uniforms, drawn before any stage reads them
                self.draw.refill(st.lens.shape[0], method.k, self.target.vocab_size, self.dev)
            cands = method.propose(st)  # [B, k]
            out, y = self._run("verify", self._verify, st.anchor, cands, st.lens)
            record = (self.out, self.n_out, self.acc, self.n_rounds, st.done)
            if self.draw.sampling:  # speculative sampling / block verification against the drafts' q
                y, n_acc = self._run("accept", self.draw.accept, out.logits, cands)
                live, emitted = self._run("record", self._record_live, y, n_acc, updates=record)
            else:  # target-only: the target's own token after each prefix, the longest matching prefix accepted
                if y is None:
                    y = target_token(out.logits, self.temperature, self.gen)  # [B, k+1]
                n_acc, live, emitted = self._run("accept", self._accept, cands, y, updates=record)
            if self.match is not None:  # what the host's stop-string matcher reads (`_publish`)
                self._y, self._emitted = y, emitted
            if self.target.hybrid:
                self.cache.commit(n_acc + 1)  # linear-attention states after A + accepted drafts
            method.commit(st, out, y, n_acc)
            self._run("advance", self._advance, y, n_acc, live, updates=(st.anchor, st.lens))
        self._publish()

    def _verify(self, anchor, cands, lens):
        """The target's forward over [A, T1..Tk] at a..a+k (and, at T = 0, its argmax at every row)."""
        ids, pos = torch.cat([anchor[:, None], cands], 1), lens[:, None] + self.ar
        if self.cache.fast:  # the compiled engine: gpt-fast-style layers over the valid cache rows
            out = fast.target_forward(self.target, ids, pos, self.cache, self.method.taps, self.engine == "compiled",
                                      self.eng)
        else:
            out = self.target.forward(ids, pos, self.cache, taps=self.method.taps)
        return out, (out.logits.argmax(-1) if self.temperature <= 0 else None)

    def _accept(self, cands, y):
        """n = the longest prefix with T_j == y_{j-1} (accepted drafts) [B]; y_0..y_n recorded for live requests.
        Returns n, the live mask and the count appended per request [B] (a stage: the host keeps no reference to
        its temporaries; `step` hands y and the count to the stop-string matcher)."""
        n_acc = (cands == y[:, : cands.shape[1]]).long().cumprod(1).sum(1)
        live = ~self.st.done
        return n_acc, live, self._record(y, n_acc, live)

    def _record_live(self, y, n_acc):
        """The sampled-draft path's record stage (n and y from `verify.Draw.accept`): the live mask and the count
        appended per request [B]."""
        live = ~self.st.done
        return live, self._record(y, n_acc, live)

    def _advance(self, y, n_acc, live):
        """The next anchor A' = y_n at a' = a + n + 1 (after the method has committed rows a..a+n)."""
        self.st.anchor.copy_(y.gather(1, n_acc[:, None])[:, 0])
        self.st.lens.copy_(torch.where(live, self.st.lens + n_acc + 1, self.st.lens))

    def _record(self, y, n_acc, live):
        """Device-side: append y_0..y_n (cut at the first EOS and at max_new_tokens) and n to each live request;
        returns the count appended [B]."""
        emit = self.ar[None] <= n_acc[:, None]
        hit = emit & torch.isin(y, self.eos)
        first = torch.where(hit.any(1), hit.int().argmax(1), y.shape[1])  # index of the first emitted EOS
        cnt = torch.minimum(torch.minimum(n_acc + 1, first + 1), self.max_new_tokens - self.n_out)
        self.out.scatter_(1, (self.n_out[:, None] + self.ar).clamp(max=self.out.shape[1] - 1), y)
        self.acc.scatter_(1, self.n_rounds.clamp(max=self.acc.shape[1] - 1)[:, None], n_acc[:, None])
        self.n_rounds += live.long()
        emitted = torch.where(live, cnt, 0)
        self.n_out += emitted
        self.st.done |= live & ((first < cnt) | (self.n_out >= self.max_new_tokens))
        return emitted


@torch.no_grad()
def generate(target, method: Method, prompts: list[list[int]], temperature: float = 0.0,
             max_new_tokens: int = 128, eos_ids=(), seed: int = 0, progress=None,
             engine: EngineConfig | None = None, stop: StopStrings | None = None,
             verify: str = "target", capacity: int | None = None) -> list[Result]:
    """Decode a batch of prompts (token id lists of any lengths) with `method`; returns one Result per prompt.
    A request ends at an id in `eos_ids`, at a stop string of `stop` (`stops.py`), or at `max_new_tokens`.
    `engine`: the `EngineConfig` (None: the default). `verify`: target (default) | sample | block — how drafts are
    drawn and accepted at T > 0 (`verify.py`). `capacity`: cache rows per request (default: `capacity_for` these
    prompts; a larger one gives the batch another's shapes, so it replays what that one compiled)."""
    gen = torch.Generator(device=target.device).manual_seed(seed)
    compiles = engine_for(target, EngineConfig.of(engine)) == "compiled"
    with announce(f"the decode graphs of {method.name} for batch {len(prompts)}", active=compiles):
        batch = Batch(target, method, prompts, temperature, max_new_tokens, set(int(e) for e in eos_ids), gen,
                      capacity, engine=engine, stop=stop, verify=verify)
        if not batch.finished:  # the first round compiles (and captures) every stage
            batch.step()
            if progress is not None:
                progress(int(batch.poll().sum()))
    while not batch.finished:
        batch.step()
        if progress is not None:
            progress(int(batch.poll().sum()))
    results = batch.results
    compiled = batch.engine == "compiled"
    del batch
    if compiled:
        collect()
    return results


def collect():
    """Free what the compiled engine's batches left to the garbage collector: dynamo's trace of a compiled stage (a
    bound method of the batch) keeps the batch in a reference cycle, so each batch that compiled (a new prompt length
    means a new cache shape, hence a recompile) held its KV cache and graph memory until a full collection, which a
    tensor-heavy loop rarely triggers: a data stage at 32 layers ran out of device memory after ten 2,048-prompt
    batches."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
