"""`ar`: the target alone, through the same loop as every method (k = 0: each round verifies the anchor only, so
each emits the target's own next token). The reference every method's losslessness and speed-up are measured
against."""
from __future__ import annotations

from dmtp.engine.methods.base import Method, register_method


@register_method
class AR(Method):
    """The target alone: no drafts (k = 0); `Method`'s defaults are this method's rounds."""
    name = "ar"

    def __init__(self, label: str | None = None):
        if label:
            self.name = label

    @classmethod
    def build(cls, name, target, drafter=None, mtp=None, mtp_steps=4, screen=None, label=None):
        return cls(label)
