"""What every drafting method implements, what it sees of its batch (`State`), and the registry of the methods that
draft without a trained drafter (`register_method`; dmtp/engine/methods/__init__.py looks names up).

A method declares what it needs, so that callers ask it instead of comparing names: a trained drafter checkpoint
(`needs_drafter`), the target's native MTP head (`needs_mtp`), whether `mtp_steps` sets what it drafts
(`uses_mtp_steps`); an instance says how many candidates it drafts per round (`k`).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from dmtp.config import EngineConfig
from dmtp.engine import verify as V

METHODS: dict[str, type["Method"]] = {}  # name -> class of the methods without a drafter of their own (ar, mtp)


def register_method(cls):
    """Class decorator: make a method known by its `name`."""
    if not cls.name or cls.name in METHODS:
        raise ValueError(f"method class {cls.__name__}: no name, or {cls.name!r} registered twice")
    METHODS[cls.name] = cls
    return cls


@dataclass
class State:
    lens: torch.Tensor  # [B] positions the target has processed (= anchor position a)
    anchor: torch.Tensor  # [B] A, the last committed token
    done: torch.Tensor  # [B] bool
    capacity: int = 0  # cache rows per request
    engine: str = "hf"  # where the method's own caches run (`slots.engine_for`): "hf", "fast-eager" or "compiled"
    eng: EngineConfig = field(default_factory=EngineConfig)  # the batch's engine settings


def no_timer(stage: str):
    """Stage timer hook (`bench.StageTimer` replaces it): a context manager per named stage."""
    return contextlib.nullcontext()


class Method:
    """A drafting method. The loop calls prefill once, then propose / commit every round. Work that should be timed
    or captured as a CUDA graph goes through `self.run(stage, fn, *tensors)` (see `graphs.py` for what a stage may
    do); the batch that owns the method's state replaces `run` on its copy with its timed, graphed version. This
    base drafts nothing (k = 0): every round verifies the anchor alone."""
    name = ""  # the name its records carry: the registered name, or a drafter run's (`build(..., label=)`)
    k = 0  # candidates per round
    taps = None  # target layers the method needs
    needs_drafter = False  # built from a trained drafter checkpoint (`--drafter`, <drafters>/<run>/drafter)
    uses_mtp_steps = False  # `mtp_steps` (`eval.mtp_steps`, `--mtp-steps`) sets how many candidates it drafts
    timer = staticmethod(no_timer)  # stage timer (benchmarks set it)
    draw = V.Draw()  # argmax drafts; the owning batch sets its own (`verify.Draw`: samples when verifying by sampling)
    graphable = True  # every stage obeys graphs.py's rules (a wrapper that inspects state on the host: False)

    @classmethod
    def needs_mtp(cls, drafter=None) -> bool:
        """Whether it runs the target's native MTP head (`drafter`: the checkpoint a drafter method is built from)."""
        return False

    @classmethod
    def build(cls, name: str, target, drafter=None, mtp=None, mtp_steps: int = 4, screen=None,
              label: str | None = None) -> "Method":
        """The method `name` on `target`, complete: `label` is the name its records carry (default: `name`);
        `screen`: a `screen.T1Screen` replacing the full LM head for T1 (methods that draft T1 from the MTP)."""
        raise NotImplementedError

    @classmethod
    def load(cls, run: str, target, mtp=None, drafters=None, mtp_steps: int = 4, screen=None,
             label: str | None = None) -> "Method":
        """The method of a run by its name (a drafter method: the checkpoint <drafters>/<run>/drafter)."""
        return cls.build(run, target, mtp=mtp, mtp_steps=mtp_steps, screen=screen, label=label)

    def limit(self, drafts: int) -> "Method":
        """Verify only the first `drafts` candidates of each round (run name `<run>-k<drafts>`, `split_drafts`): the
        same drafts, fewer of them, so each verify forward carries drafts + 1 rows per request instead of k + 1.
        Lossless like the method itself (a prefix of its drafts is verified as any draft is). A method that drafts
        nothing has nothing to limit."""
        raise ValueError(f"method {self.name!r}: its run drafts nothing (k = {self.k}), so it has no drafts to "
                         f"limit to {drafts}")

    def rule(self, threshold: float | None = None, most: int | None = None) -> "Method":
        """How many MTP-chain tokens a round's block is given (run names `<run>-p<threshold>`, `<run>-g<count>`): only
        a variant with given slots takes one (`DrafterMethod.rule`)."""
        raise ValueError(f"method {self.name!r} takes no count of MTP-given tokens (a -p<threshold> / -g<count> run "
                         "name is for the variant 'given')")

    def compiles(self, eng: EngineConfig) -> bool:
        """Every model it runs has a compiled-engine forward (`fast.py`) under `eng`: its stages compile whole."""
        return True

    def run(self, stage, fn, *inputs):
        with self.timer(stage):
            return fn(*inputs)

    def prefill(self, st: State, ids, plen, out):
        pass

    def buffers(self) -> list[torch.Tensor]:
        """State tensors (after prefill) that live as long as the batch and are only updated in place."""
        mtp = getattr(self, "mtp", None)
        return [mtp.h, mtp.t1] if mtp is not None else []

    def propose(self, st: State) -> torch.Tensor:
        return st.lens.new_zeros(st.lens.shape[0], 0)

    def commit(self, st: State, out, emitted, n_acc):
        pass

    def absorb(self, dst, other: "Method", src):
        """Take rows `src` (indices, or a slice of them) of another batch's state of this method into rows `dst`
        (dynamic batching)."""
