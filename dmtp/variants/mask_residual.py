from .base import LowRank, Variant, register


@register
class MaskResidual(Variant):
    """[E(T1), E(M) + LowRank(sg h_MTP) x6] (supplementary)."""

    name = "mask_residual"
    description = "single anchor, LowRank(sg h_MTP) added to each of the six MASK slots (supp.)"
    anchor, t1 = False, True

    def __init__(self, cfg):
        super().__init__(cfg)
        self.lowrank = LowRank(cfg.hidden_size, cfg.lowrank_rank)

    def reset_parameters(self):
        self.lowrank.reset_parameters()

    def mask_embed(self, e_mask, h_mtp):
        return e_mask + self.lowrank(h_mtp)
