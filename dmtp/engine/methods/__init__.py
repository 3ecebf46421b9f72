"""Drafting methods, one file each, built by name from one registry: `ar` (the target alone, ar.py), `mtp` (the
native MTP head chained k steps, mtp.py) and every injection variant of the drafter's registry (drafter.py, the
variant's own file under dmtp/models/variants/). Callers ask a method's class what it needs (`needs_drafter`,
`needs_mtp`, `uses_mtp_steps`) instead of comparing names.

    build_method("ar", tgt)                                          # the target alone: k = 0
    build_method("mtp", tgt, mtp=head, mtp_steps=4)                  # MTP415
    build_method("zero_init_residual", tgt, drafter=d, mtp=head)     # a variant with its drafter
    load_method("zero_init_residual_from_dflash", tgt, head, "work/mini/drafters")   # a run, by its folder
    method_class("mtp").needs_mtp()                                  # True: what to load before building it
"""
from __future__ import annotations

from dmtp.engine.methods.ar import AR
from dmtp.engine.methods.base import METHODS, Method, State, no_timer, register_method
from dmtp.engine.methods.drafter import DrafterMethod
from dmtp.engine.methods.mtp import MTPMethod, MTPState

__all__ = ["AR", "METHODS", "DrafterMethod", "MTPMethod", "MTPState", "Method", "State", "build_method",
           "load_method", "method_class", "no_timer", "register_method"]


def method_class(name: str) -> type[Method]:
    """The class that runs `name`: a registered method (`ar`, `mtp`), else `DrafterMethod` — a variant's name, or a
    trained drafter run's (its checkpoint names the variant; `DrafterMethod.build` checks the variant exists)."""
    return METHODS.get(name, DrafterMethod)


def build_method(name: str, target, drafter=None, mtp=None, mtp_steps: int = 4, screen=None,
                 label: str | None = None) -> Method:
    """The method `name` (`ar`, `mtp` or a variant's name) on `target` with the models it needs; `label`: the name
    its records carry (default: `name`); `screen`: an optional `screen.T1Screen` replacing the full LM head for T1."""
    return method_class(name).build(name, target, drafter=drafter, mtp=mtp, mtp_steps=mtp_steps, screen=screen,
                                    label=label)


def load_method(name: str, target, mtp=None, drafters=None, mtp_steps: int = 4, screen=None,
                label: str | None = None) -> Method:
    """A method by its run name: `ar`, `mtp`, or the name of a trained drafter's folder `<drafters>/<name>/drafter`
    (e.g. `zero_init_residual_from_dflash`; its config says the variant), loaded in the target's precision."""
    return method_class(name).load(name, target, mtp=mtp, drafters=drafters, mtp_steps=mtp_steps, screen=screen,
                                   label=label)
