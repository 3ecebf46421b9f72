"""Drafting methods, one file each, built by name from one registry: `ar` (the target alone, ar.py), `mtp` (the
native MTP head chained k steps, mtp.py) and every injection variant of the drafter's registry (drafter.py, the
variant's own file under dmtp/models/variants/). Callers ask a method's class what it needs (`needs_drafter`,
`needs_mtp`, `uses_mtp_steps`) instead of comparing names.

    build_method("ar", tgt)                                          # the target alone: k = 0
    build_method("mtp", tgt, mtp=head, mtp_steps=4)                  # MTP415
    build_method("zero_init_residual", tgt, drafter=d, mtp=head)     # a variant with its drafter
    load_method("zero_init_residual_from_dflash", tgt, head, "work/mini/drafters")   # a run, by its folder
    method_class("mtp").needs_mtp()                                  # True: what to load before building it
    load_method("mtp.zero_init_residual_joint", tgt, head, "work/mini/drafters")  # MTP415 on that run's tuned head
    load_method("zero_init_residual-k4", tgt, head, "work/mini/drafters")  # its first 4 drafts verified (`limit`)
    load_method("given-p0.9", tgt, head, "work/mini/drafters")  # `given` at threshold 0.9; given-g2: 2 tokens always
"""
from __future__ import annotations

import re

from dmtp.engine.methods.ar import AR
from dmtp.engine.methods.base import METHODS, Method, State, no_timer, register_method
from dmtp.engine.methods.drafter import DrafterMethod
from dmtp.engine.methods.mtp import MTPMethod, MTPState

__all__ = ["AR", "METHODS", "DrafterMethod", "MTPMethod", "MTPState", "Method", "State", "build_method",
           "load_method", "method_class", "no_timer", "register_method", "run_of", "split_drafts", "split_rule"]


def split_drafts(name: str) -> tuple[str, int | None]:
    """A run name and the drafts it verifies per round: "zero_init_residual-k4" -> ("zero_init_residual", 4) (its
    first 4 drafts: `Method.limit`), "dflash" -> ("dflash", None) (all of them)."""
    m = re.fullmatch(r"(.+)-k([0-9]+)", name)
    if m is None:
        return name, None
    if int(m.group(2)) < 1:
        raise ValueError(f"method {name!r}: expected <run>-k<drafts>, drafts a whole number >= 1 (e.g. "
                         "zero_init_residual-k4: its first 4 drafts verified per round)")
    return m.group(1), int(m.group(2))


def split_rule(name: str) -> tuple[str, dict]:
    """A run name and the count rule it decodes with (`Method.rule`): "given-p0.9" -> ("given", {"threshold": 0.9})
    (the MTP chain gives its leading steps of top probability >= 0.9), "given-g2" -> ("given", {"threshold": 0.0,
    "most": 2}) (always 2), "given" -> ("given", {}) (its checkpoint's threshold)."""
    m = re.fullmatch(r"(.+)-(p|g)([0-9]+(?:\.[0-9]+)?)", name)
    if m is None:
        return name, {}
    if m.group(2) == "p":
        return m.group(1), {"threshold": float(m.group(3))}
    if "." in m.group(3):
        raise ValueError(f"method {name!r}: expected <run>-g<count>, a whole number of MTP-given tokens (given-g2)")
    return m.group(1), {"threshold": 0.0, "most": int(m.group(3))}


def run_of(name: str) -> str:
    """The run (or variant) a method name decodes: `<run>[-p<threshold>|-g<count>][-k<drafts>]` -> `<run>`."""
    return split_rule(split_drafts(name)[0])[0]


def method_class(name: str) -> type[Method]:
    """The class that runs `name` (`<run>[-k<drafts>]`): a registered method (`ar`, `mtp`; `mtp.<run>`: on the MTP head
    trained with <run>), else `DrafterMethod` — a
    variant's name, or a trained drafter run's (its checkpoint names the variant; `DrafterMethod.build` checks the
    variant exists)."""
    return METHODS.get(run_of(name).partition(".")[0], DrafterMethod)


def _by_name(make: str, name: str, target, label: str | None, **kw) -> Method:
    """`method_class(run).<make>(run, ...)` for `name` = `<run>[-p<threshold>|-g<count>][-k<drafts>]`, with its count
    rule (`Method.rule`) and limited to its drafts (`Method.limit`); such a run's records carry the whole name unless
    `label` says otherwise."""
    run, drafts = split_drafts(name)
    base, rule = split_rule(run)
    m = getattr(method_class(base), make)(base, target, label=label or (name if name != base else None), **kw)
    m = m.rule(**rule) if rule else m
    return m if drafts is None else m.limit(drafts)


def build_method(name: str, target, drafter=None, mtp=None, mtp_steps: int = 4, screen=None,
                 label: str | None = None) -> Method:
    """The method `name` (`ar`, `mtp` or a variant's name; `<name>-k<drafts>`: its first drafts verified) on `target`
    with the models it needs; `label`: the name its records carry (default: `name`); `screen`: an optional
    `screen.T1Screen` replacing the full LM head for T1."""
    return _by_name("build", name, target, label, drafter=drafter, mtp=mtp, mtp_steps=mtp_steps, screen=screen)


def load_method(name: str, target, mtp=None, drafters=None, mtp_steps: int = 4, screen=None,
                label: str | None = None) -> Method:
    """A method by its run name: `ar`, `mtp`, or the name of a trained drafter's folder `<drafters>/<name>/drafter`
    (e.g. `zero_init_residual_from_dflash`; its config says the variant), loaded in the target's precision;
    `<run>-k<drafts>` verifies the run's first `drafts` drafts per round (`Method.limit`)."""
    return _by_name("load", name, target, label, mtp=mtp, drafters=drafters, mtp_steps=mtp_steps, screen=screen)
