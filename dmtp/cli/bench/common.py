"""What every part of bench shares: the stage timer, timed calls, ratio records, medians of repeats, the weight bytes
a round reads, the speed goals, the engine labels (`"compiled+dense+gw"`: named `EngineConfig`s) and the CSV merges."""
from __future__ import annotations

import contextlib
import statistics
import time
from collections import defaultdict
from pathlib import Path

import pandas as pd
import torch

from dmtp.analysis.ratios import Ratio
from dmtp.checks import require
from dmtp.config import EngineConfig
from dmtp.engine.decode import generate
from dmtp.engine.methods import no_timer
from dmtp.io import write_csv


class Stamped:
    """A text stream whose "[bench]" lines carry the seconds since `t0`: "[+123s] [bench] ..." (a log that a time
    limit cuts shows what took the time). Everything but `write` is the wrapped stream's."""

    def __init__(self, raw, t0: float | None = None):
        self.raw, self.t0, self._bol = raw, time.perf_counter() if t0 is None else t0, True

    def write(self, s: str) -> int:
        out = []
        for piece in s.splitlines(keepends=True):
            if self._bol and piece.startswith("[bench]"):
                out.append(f"[+{time.perf_counter() - self.t0:.0f}s] ")
            out.append(piece)
            self._bol = piece.endswith("\n")
        self.raw.write("".join(out))
        return len(s)

    def __getattr__(self, name):
        return getattr(self.raw, name)


class StageTimer:
    """Times named stages of every decode round (CUDA events on GPU, perf_counter on CPU); stages outside a round
    (prefill) are not timed."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.rounds: list[dict[str, list]] = []  # per round: stage -> [(start, end)]
        self._cur = None

    def _mark(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    @contextlib.contextmanager
    def __call__(self, stage):
        if stage == "round":
            self._cur = defaultdict(list)
            self.rounds.append(self._cur)
        cur = self._cur
        if cur is None:
            yield
            return
        a = self._mark()
        try:
            yield
        finally:
            cur[stage].append((a, self._mark()))
            if stage == "round":
                self._cur = None

    def ms_per_round(self, skip: int = 16) -> dict[str, float]:
        """Median ms per round of each stage over the rounds that ran it (a stage run twice in a round counts both),
        the first `skip` rounds excluded. The median: a few stalled rounds move a mean far above the sum of stages."""
        if self.cuda:
            torch.cuda.synchronize()
        per = defaultdict(list)
        for r in self.rounds[skip:]:
            for stage, ev in r.items():
                per[stage].append(sum((a.elapsed_time(b) if self.cuda else (b - a) * 1e3) for a, b in ev))
        return {s: statistics.median(v) for s, v in per.items()}


def sync(dev):
    if str(dev).startswith("cuda"):
        torch.cuda.synchronize()


def timed(dev, fn, *args, **kw):
    """(fn(*args, **kw), wall seconds), the device synchronised before and after."""
    sync(dev)
    t0 = time.perf_counter()
    out = fn(*args, **kw)
    sync(dev)
    return out, time.perf_counter() - t0


def ratio(setup: str, name: str, value: float, direction: str = "report", goal: float | None = None,
          condition: str = "", note: str = "", unit: str = "x") -> Ratio:
    return Ratio(setup, name, round(float(value), 4), direction, goal, unit, condition, note).show()


def median(xs: list[float]) -> float:
    return float(statistics.median(xs))


def spread(xs: list[float]) -> str:
    """'median [min, max]' of a few repeats, or the one value."""
    return f"{median(xs):.3f}" if len(xs) == 1 else f"{median(xs):.3f} [{min(xs):.3f}, {max(xs):.3f}]"


def device_name(dev) -> str:
    return torch.cuda.get_device_name() if str(dev).startswith("cuda") else str(dev)


def stage_times(tgt, m, prompts, tokens, skip=16, engine=None, capacity=None):
    """ms per round by stage over `tokens` generated tokens (EOS ignored), first `skip` rounds excluded; `engine`:
    `slots.engine_for` (default: compiled on CUDA); `capacity`: as `generate`'s."""
    m.timer = StageTimer(tgt.device.type == "cuda")
    res = generate(tgt, m, prompts, 0.0, tokens, eos_ids=(), seed=0, engine=engine, capacity=capacity)
    ms = m.timer.ms_per_round(skip)
    m.timer = no_timer
    return ms, res


def nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def read_bytes_per_token(target) -> int:
    """Weight bytes a decode step reads: every parameter except an untied input embedding (only rows are read)."""
    emb = target.body.embed_tokens.weight
    tied = emb.data_ptr() == target.model.lm_head.weight.data_ptr()
    return nbytes(*target.model.parameters()) - (0 if tied else nbytes(emb))


def t1_bytes_per_round(target, mtp) -> int:
    """Weight bytes DMTP reads each round beyond DFlash's: the MTP head and the exact T1 head (the target's LM head,
    read once more: T1 comes from the MTP hidden state after verify, so it cannot share verify's read)."""
    return nbytes(*mtp.parameters(), target.model.lm_head.weight)


def round_floor(target, mtp, dflash_round_ms: float, bandwidth: float, setup: str, name: str, condition: str,
                ) -> Ratio:
    """The lowest DMTP round / DFlash round the weights allow: DFlash's measured round plus the extra weight bytes
    (`t1_bytes_per_round`) read at `bandwidth`."""
    extra_bytes = t1_bytes_per_round(target, mtp)
    extra = extra_bytes / bandwidth * 1e3
    return ratio(setup, f"{name}, weight-read floor", 1 + extra / dflash_round_ms, condition=condition,
                 note=f"{dflash_round_ms:.3f} ms DFlash round + {extra_bytes / 1e9:.3f} GB (MTP head + T1 LM head) at "
                      f"{bandwidth / 1e12:.1f} TB/s = {extra:.3f} ms")


ROUND_GOAL = {"mini": 1.10}  # DMTP round / DFlash round at a small target's shape (latency-bound stages)
ROUND_AR_GOAL = 1.5  # DMTP round / AR step at batch 8: speculation pays only when a round costs few AR steps
DRAFT_SHARE_GOAL = 0.15  # draft side / verify at batch 8: the paper's cost regime (5 + 1 layers against 64)
DRAFT_STAGES = ("mtp_chain", "t1_prep", "drafter", "mtp", "drafter_ctx")  # a round's draft side (mtp_chain: `given`'s)


def round_goal(profile: str) -> float:
    """The goal of DMTP's round / DFlash's round on `profile`'s target shape (1.04: the blog's 8B figure)."""
    return ROUND_GOAL.get(profile, 1.04)


KINDS = {"flex": "", "dense": "+dense"}  # the compiled engine's attention kernels (`EngineConfig.attention`): suffix
LABEL_OPTIONS = {"dense": "dense attention", "gw": "K/V write in the graph", "tuned": "autotuned kernels",
                 "timed": "Inductor's timed kernel choices"}


def label_words(label: str) -> str:
    """The suffix of a record's name for engine label `label`: ", dense attention, K/V write in the graph" for
    "compiled+dense+gw", "" for a plain engine."""
    opts = label.split("+")[1:]
    return "".join(f", {words}" for opt, words in LABEL_OPTIONS.items() if opt in opts)


def engine_setting(label: str, base: EngineConfig | None = None) -> EngineConfig:
    """An engine label "<engine>[+dense][+gw][+tuned|+timed]" as the `EngineConfig` it names, derived from `base`
    (default: the default config): flex attention, the K/V write outside the graphs, fixed kernel choices, unless an
    option (`LABEL_OPTIONS`) says otherwise."""
    engine, *opts = label.split("+")
    unknown = set(opts) - set(LABEL_OPTIONS)
    require(not unknown, f"engine label {label!r}: unknown option(s) {sorted(unknown)} (known: dense, gw, tuned)")
    write = "graph" if "gw" in opts else "eager" if engine != "hf" else "auto"
    tuning = "autotune" if "tuned" in opts else "default" if "timed" in opts else "fixed"
    return (base or EngineConfig()).with_(engine=engine, attention="dense" if "dense" in opts else "flex",
                                          cache_write=write, tuning=tuning)


def label_of(eng: EngineConfig) -> str:
    """The engine label of a config (`engine_setting`'s inverse on the settings labels name)."""
    if eng.kind("cuda") == "hf":
        return "hf"
    return eng.kind("cuda") + "+dense" * (eng.attention == "dense") + "+gw" * (eng.write("cuda") == "graph") \
        + "+tuned" * (eng.tuning == "autotune") + "+timed" * (eng.tuning == "default")


# the batch-1 engines: the library's default first, then autotuned kernels, each attention kernel and write, HF layers
B1_ENGINES = ("compiled", "compiled+tuned", "compiled+dense", "compiled+dense+gw", "hf")


def b1_engines(base: EngineConfig | None = None) -> tuple[str, ...]:
    """The batch-1 engine labels of a run: its own engine (`base`, default `EngineConfig()`) first, then the others of
    `B1_ENGINES`."""
    first = label_of(base if base is not None else EngineConfig())
    return (first,) + tuple(x for x in B1_ENGINES if x != first)


def merge_overhead(path: Path, rows: list[dict]):
    """Write overhead rows, keeping stored rows of the other setups (`<setup>:<name>`, e.g. `8b-shape:dflash`, vs
    plain names: the trained target)."""
    def setup(m):
        return m.partition(":")[0] if ":" in m else ""

    new = pd.DataFrame(rows)
    old = pd.read_csv(path) if path.exists() else pd.DataFrame(columns=new.columns)
    old = old[~old.method.map(setup).isin(set(new.method.map(setup)))]
    write_csv(path, pd.concat([new, old] if (new.method.map(setup) == "").any() else [old, new]))


def merge_rows(path: Path, rows: list[dict]):
    """Write `rows` (each with a `setup`) over the stored rows of the same setups, keeping the others."""
    new = pd.DataFrame(rows)
    old = pd.read_csv(path) if path.exists() else pd.DataFrame(columns=new.columns)
    write_csv(path, pd.concat([old[~old.setup.isin(set(new.setup))], new]))
