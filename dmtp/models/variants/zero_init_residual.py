from dmtp.models.variants.base import register
from dmtp.models.variants.fusion import Fusion


@register
class ZeroInitResidual(Fusion):
    """[A, E(T1) + W[RMS_e(E(T1)) ; RMS_m(sg h_MTP)], M x6], W initialised to zero (Nov 9 main method).

    At initialisation Delta = 0, i.e. exactly the double-anchor token-only drafter: it can continue from a DFlash
    checkpoint."""

    name = "zero_init_residual"
    description = "double anchor, T1 slot = E(T1) + zero-initialised W[RMS(E(T1)); RMS(sg h_MTP)] (Nov 9 main)"
    anchor = True
    zero_init = True
    residual = True
