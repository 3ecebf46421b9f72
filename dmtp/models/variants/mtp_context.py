import torch.nn as nn

from dmtp.models.variants.base import Variant, register


@register
class MTPContext(Variant):
    """Context f_i = hidden_norm(fc_{H->H}(g_i)) from the per-position MTP hidden alone (no target features)."""

    name = "mtp_context"
    description = "single anchor, context from the per-position MTP hidden alone (supp.)"
    anchor, t1 = False, True
    needs_mtp_context = True
    bypassed = ("fc.",)  # the target-feature projection: replaced by injection.fc

    def __init__(self, cfg):
        super().__init__(cfg)
        self.fc = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False)

    def reset_parameters(self):
        nn.init.normal_(self.fc.weight, std=0.02)

    def context(self, drafter, taps, g):
        return drafter.hidden_norm(self.fc(g.detach()))
