from .base import LowRank, Variant, register


@register
class T1Residual(Variant):
    """[E(T1) + LowRank(sg h_MTP), M x6]."""

    name = "t1_residual"
    description = "single anchor, T1 slot = E(T1) + LowRank(sg h_MTP)"
    anchor, t1 = False, True

    def __init__(self, cfg):
        super().__init__(cfg)
        self.lowrank = LowRank(cfg.hidden_size, cfg.lowrank_rank)

    def reset_parameters(self):
        self.lowrank.reset_parameters()

    def t1_embed(self, e_t1, h_mtp):
        return e_t1 + self.lowrank(h_mtp)
