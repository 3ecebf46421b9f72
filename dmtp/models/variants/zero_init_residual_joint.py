"""`zero_init_residual_joint`: the MTP head trained with the drafter (the blog's closing direction "联合训练"). The
drafter is `zero_init_residual`'s; beside it a trainable copy of the target's MTP head learns its own next-token loss
on the same on-policy batches,

    L = L_drafter(h_MTP = sg g of the copy) + mtp_weight * CE(LMHead(g_i), x_{i+2})   (every position of a sequence)

and the drafter reads the copy's hidden as it trains (stop-gradient, as every variant: the head learns from its own
loss only). The tuned head is saved with the checkpoint (`drafter/mtp.safetensors`, the target's `mtp.*` layout) and
decodes T1 in place of the target's (`DrafterMethod.load`); `mtp.<run>` decodes MTP415 with it, the control that
separates what tuning the head buys from what the drafter buys. `training/drafters.py` attaches the copy
(`attach_head`) and adds the loss; the checkpoint's own architecture name already keeps public readers away.
"""
from __future__ import annotations

from dataclasses import dataclass

from dmtp.checks import check, non_negative
from dmtp.models.variants.base import register
from dmtp.models.variants.zero_init_residual import ZeroInitResidual


@dataclass
class JointConfig:
    mtp_weight: float = 0.1  # weight of the MTP head's own next-token loss beside the drafter's (DeepSeek-V3's late
    # lambda)

    def __post_init__(self):
        check(self, mtp_weight=non_negative)


@register
class ZeroInitResidualJoint(ZeroInitResidual):
    """zero_init_residual with the MTP head trained beside it on its own weighted loss (the tuned head saved with the
    drafter)."""

    name = "zero_init_residual_joint"
    description = "zero_init_residual with a copy of the MTP head trained jointly (its own loss, weighted; saved)"
    trains_mtp = True
    Config = JointConfig
