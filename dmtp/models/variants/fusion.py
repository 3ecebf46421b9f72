from dmtp.models.variants.base import Fuse, Variant, register


@register
class Fusion(Variant):
    """[W[RMS_e(E(T1)) ; RMS_m(sg h_MTP)], M x6]: the T1 slot is REPLACED by the fusion (Oct main method)."""

    name = "fusion"
    description = "single anchor, T1 slot replaced by W[RMS(E(T1)); RMS(sg h_MTP)] (Oct main)"
    anchor, t1 = False, True
    zero_init = False
    residual = False

    def __init__(self, cfg):
        super().__init__(cfg)
        self.fuse = Fuse(cfg.hidden_size, cfg.rms_norm_eps, zero_init=self.zero_init)

    def reset_parameters(self):
        self.fuse.reset_parameters()

    def t1_embed(self, e_t1, h_mtp):
        d = self.fuse(e_t1, h_mtp)
        return e_t1 + d if self.residual else d
