from dmtp.models.variants.base import register
from dmtp.models.variants.fusion import Fusion


@register
class DoubleAnchorFusion(Fusion):
    """[A, W[RMS_e(E(T1)) ; RMS_m(sg h_MTP)], M x6]: as `fusion`, A kept."""

    name = "double_anchor_fusion"
    description = "double anchor [A, fused T1, M x6]"
    anchor = True
