import torch.nn as nn

from dmtp.models.variants.base import Variant, register


@register
class ContextFusion(Variant):
    """Context f_i = hidden_norm(proj_{(K+1)H->H}[K target feats ; g_i]) with the per-position MTP hidden g_i.

    The (K+1)H->H projection is stored as the public `fc` (K*H->H) plus `injection.g_proj` (H->H): a linear map of a
    concatenation is the sum of its blocks, so the checkpoint stays loadable as a plain DFlash drafter."""

    name = "context_fusion"
    description = "single anchor, context = proj[K target feats ; per-position MTP hidden g_i] (supp.)"
    anchor, t1 = False, True
    needs_mtp_context = True

    def __init__(self, cfg):
        super().__init__(cfg)
        self.g_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False)

    def reset_parameters(self):
        nn.init.normal_(self.g_proj.weight, std=0.02)

    def context(self, drafter, taps, g):
        return drafter.hidden_norm(drafter.fc(taps) + self.g_proj(g.detach()))
