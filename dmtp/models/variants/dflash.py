from dmtp.models.variants.base import Variant, register


@register
class DFlash(Variant):
    """Baseline: [A, M x7]; the drafter proposes T1..T7 itself, nothing injected."""

    name = "dflash"
    description = "baseline DFlash: [A, M x7], drafter proposes T1..T7"
    anchor, t1 = True, False
    public = True
