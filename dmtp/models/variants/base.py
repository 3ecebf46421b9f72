"""The one interface every injection variant implements (docs/METHOD.md, "The injection variants").

A variant is an `nn.Module` stored as `drafter.injection` (its weights save under `injection.*`) and overrides at most
three hooks: `t1_embed` (what goes into the T1 slot), `mask_embed` (what goes into MASK slots) and `context` (the
context features). Two class flags give the block layout:
    anchor=True  -> slot for A at position a          t1=True -> slot for T1 (from the MTP) at position a+1
and MASK slots fill the rest up to `num_candidates` predicted-or-given candidates (7 by default). A variant whose
MTP head gives a per-block count of tokens (`given.py`) lays out "G" slots instead: slot j of them holds the MTP
chain's T_j where j <= the block's count, else MASK, and predicts in the second case (`Layout.given`, `given_counts`).

A variant's own hyperparameters are a dataclass `Config` on its class (e.g. `LowRankConfig.rank`): the drafter
config carries them as `variant_config` (saved in the checkpoint's `dmtp_config`), the variant reads `self.config`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import torch
import torch.nn as nn

from dmtp.checks import at_least, check
from dmtp.models.layers import RMSNorm

REGISTRY: dict[str, type["Variant"]] = {}


def register(cls):
    """Class decorator: make a variant known by its `name` (from any module; the package's own are found alone)."""
    if not cls.name:
        raise ValueError(f"variant class {cls.__name__} has no name")
    if cls.name in REGISTRY:
        raise ValueError(f"variant {cls.name!r} registered twice")
    REGISTRY[cls.name] = cls
    return cls


def get_variant(name: str) -> type["Variant"]:
    if name not in REGISTRY:
        raise KeyError(f"unknown variant {name!r}; known: {', '.join(REGISTRY)}")
    return REGISTRY[name]


@dataclass(frozen=True)
class Layout:
    kinds: tuple[str, ...]  # per slot: "A" (last committed token), "T1" (MTP proposal), "M" (MASK) or "G" (the MTP
    # chain's token at that offset where the block's given count reaches it, else MASK)
    offsets: tuple[int, ...]  # slot position relative to the anchor position a

    @property
    def slots(self) -> int:
        return len(self.kinds)

    @property
    def predict(self) -> tuple[int, ...]:
        """Slots whose output is a candidate: the MASK slots, and the "G" slots past the block's given count; slot
        with offset k predicts T_k = x_{a+k}."""
        return tuple(i for i, k in enumerate(self.kinds) if k in ("M", "G"))

    @property
    def given(self) -> int:
        """The most MTP-chain tokens a block holds ("G" slots; 0: a fixed layout)."""
        return self.kinds.count("G")


def given_counts(anchors: torch.Tensor, most: int) -> torch.Tensor:
    """The given count g of each training block, in 0..most: a fixed hash of its anchor position (Knuth's
    multiplicative one, high bits), so the host (loss normaliser) and the device (blocks) agree without drawing
    from the anchors' generator; anchors are uniform over a sequence, so g is near uniform over 0..most."""
    return ((anchors.long() % (1 << 20)) * 2654435761 % (1 << 32) >> 16) % (most + 1)


class _class_property:
    """A read-only property computed from the class, so `Cls.attr` and `obj.attr` agree."""

    def __init__(self, fn):
        self.fn = fn

    def __get__(self, obj, cls):
        return self.fn(cls)


@dataclass
class NoConfig:
    """A variant without hyperparameters of its own."""


class Variant(nn.Module):
    name: str = ""
    description: str = ""
    anchor: bool = True  # keep A in the block
    t1: bool = False  # T1 from the MTP is given (DMTP); else the drafter proposes T1 itself
    needs_mtp_context: bool = False  # context() reads the per-position MTP hidden g_i
    trains_mtp: bool = False  # a copy of the MTP head trains beside the drafter and is saved with it (its Config's
    # `mtp_weight`: the weight of the head's own loss); decoding reads T1 from that copy
    bypassed: tuple[str, ...] = ()  # drafter parameters (name prefixes) the variant never uses: frozen in training
    public: bool = False  # the public DFlash reference and the serving engines compute this variant exactly (plain
    # DFlash: block [A, M...], nothing injected): its checkpoints keep the public architecture name; any other variant
    # saves a name of its own, which those readers refuse (`DrafterConfig.to_hf_dict`)
    Config: type = NoConfig  # the variant's own hyperparameters (a dataclass with defaults)

    def __init__(self, cfg):
        """cfg: the DrafterConfig (widths, eps; `cfg.variant_config` holds this variant's own settings)."""
        super().__init__()
        self.config = self.make_config(cfg.variant_config)

    @classmethod
    def make_config(cls, settings: dict):
        """The variant's Config from a dict of settings (missing: the defaults; unknown keys are an error)."""
        known = {f.name for f in fields(cls.Config)}
        bad = sorted(set(settings) - known)
        if bad:
            raise ValueError(f"variant {cls.name!r}: unknown settings {bad}"
                             + (f" (known: {', '.join(sorted(known))})" if known else " (it has none)"))
        return cls.Config(**settings)

    @classmethod
    def settings(cls, settings: dict) -> dict:
        """Every setting of the variant, defaults filled in (what a checkpoint stores)."""
        return asdict(cls.make_config(settings))

    @_class_property
    def needs_mtp(cls) -> bool:
        """Whether the variant reads the target's MTP head; the same answer on the class (before any drafter exists,
        e.g. to decide whether to load the head) and on an instance."""
        return cls.t1 or cls.needs_mtp_context

    def layout(self, num_candidates: int) -> Layout:
        kinds = (["A"] if self.anchor else []) + (["T1"] if self.t1 else [])
        kinds += ["M"] * (num_candidates - (1 if self.t1 else 0))
        first = 0 if self.anchor else 1
        return Layout(tuple(kinds), tuple(range(first, first + len(kinds))))

    def reset_parameters(self):
        pass

    # --- hooks ----------------------------------------------------------------------------------------------------
    def t1_embed(self, e_t1: torch.Tensor, h_mtp: torch.Tensor) -> torch.Tensor:
        """[..., H] input of the T1 slot; h_mtp is the (stop-gradiented) MTP hidden that predicted T1."""
        return e_t1

    def mask_embed(self, e_mask: torch.Tensor, h_mtp: torch.Tensor | None) -> torch.Tensor:
        return e_mask

    def context(self, drafter, taps: torch.Tensor | None, g: torch.Tensor | None) -> torch.Tensor:
        return drafter.hidden_norm(drafter.fc(taps))

    # --- shared ---------------------------------------------------------------------------------------------------
    def block(self, e_anchor, e_t1, h_mtp, e_mask, num_candidates: int, given=None) -> torch.Tensor:
        """Block input embeddings [..., S, H] from E(A), E(T1), h_MTP (each [..., H]) and E(MASK) [H]; `given`: the
        per-block count of a "G" layout (`given.py`), None for the fixed layouts."""
        lay = self.layout(num_candidates)
        ref = e_anchor if e_anchor is not None else e_t1
        h = h_mtp.detach() if h_mtp is not None else None  # sg: no gradient reaches the MTP
        m = self.mask_embed(e_mask.expand_as(ref), h)
        parts = []
        for kind in lay.kinds:
            parts.append(e_anchor if kind == "A" else self.t1_embed(e_t1, h) if kind == "T1" else m)
        return torch.stack(parts, dim=-2)


class LowRank(nn.Module):
    """H -> r -> H MLP; the up-projection starts at zero so the residual starts at zero."""

    def __init__(self, hidden: int, rank: int):
        super().__init__()
        self.down = nn.Linear(hidden, rank, bias=False)
        self.up = nn.Linear(rank, hidden, bias=False)

    def reset_parameters(self):
        nn.init.normal_(self.down.weight, std=0.02)
        nn.init.zeros_(self.up.weight)

    def forward(self, x):
        return self.up(torch.nn.functional.silu(self.down(x)))


@dataclass
class LowRankConfig:
    rank: int = 64  # r of the H -> r -> H SiLU MLP

    def __post_init__(self):
        check(self, rank=at_least(1))


class LowRankVariant(Variant):
    """Single-anchor variants that inject LowRank(sg h_MTP) into one kind of slot."""
    anchor, t1 = False, True
    Config = LowRankConfig

    def __init__(self, cfg):
        super().__init__(cfg)
        self.lowrank = LowRank(cfg.hidden_size, self.config.rank)

    def reset_parameters(self):
        self.lowrank.reset_parameters()


class Fuse(nn.Module):
    """W [RMS_e(E(T1)) ; RMS_m(h_MTP)], W: 2H -> H."""

    def __init__(self, hidden: int, eps: float, zero_init: bool):
        super().__init__()

        self.norm_e = RMSNorm(hidden, eps)
        self.norm_m = RMSNorm(hidden, eps)
        self.proj = nn.Linear(2 * hidden, hidden, bias=False)
        self.zero_init = zero_init

    def reset_parameters(self):
        if self.zero_init:
            nn.init.zeros_(self.proj.weight)
        else:
            nn.init.normal_(self.proj.weight, std=0.02)

    def forward(self, e, h):
        return self.proj(torch.cat([self.norm_e(e), self.norm_m(h)], dim=-1))
