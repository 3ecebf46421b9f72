from dmtp.models.variants.base import LowRankVariant, register


@register
class T1Residual(LowRankVariant):
    """[E(T1) + LowRank(sg h_MTP), M x6]."""

    name = "t1_residual"
    description = "single anchor, T1 slot = E(T1) + LowRank(sg h_MTP)"

    def t1_embed(self, e_t1, h_mtp):
        return e_t1 + self.lowrank(h_mtp)
