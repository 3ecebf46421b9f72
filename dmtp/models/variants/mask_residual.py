from dmtp.models.variants.base import LowRankVariant, register


@register
class MaskResidual(LowRankVariant):
    """[E(T1), E(M) + LowRank(sg h_MTP) x6] (supplementary)."""

    name = "mask_residual"
    description = "single anchor, LowRank(sg h_MTP) added to each of the six MASK slots (supp.)"

    def mask_embed(self, e_mask, h_mtp):
        return e_mask + self.lowrank(h_mtp)
