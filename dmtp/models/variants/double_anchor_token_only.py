from dmtp.models.variants.base import Variant, register


@register
class DoubleAnchorTokenOnly(Variant):
    """[A, E(T1), M x6]: the control of the main method. T1 from the MTP as a token only, A kept, no MTP hidden.

    `zero_init_residual` starts as exactly this drafter (its residual W is zero at initialisation), so the paired
    difference zero_init_residual - double_anchor_token_only isolates what the MTP hidden adds once trained."""

    name = "double_anchor_token_only"
    description = "double anchor [A, E(T1), M x6]: MTP's T1 as a token only (control: no MTP hidden)"
    anchor, t1 = True, True
