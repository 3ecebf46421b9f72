from dmtp.models.variants.base import Variant, register


@register
class TokenOnly(Variant):
    """[T1, M x6]: T1 from the MTP as a token only (the ablation's reference row)."""

    name = "token_only"
    description = "single anchor [T1, M x6]: MTP's T1 as a token only"
    anchor, t1 = False, True
