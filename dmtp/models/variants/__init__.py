"""Injection variants: one file each, registered by name (in SPEC §4 order). `dmtp variants` lists them."""
# ruff: noqa: I001  (the import order is the registry order)
from dmtp.models.variants import dflash  # noqa: F401
from dmtp.models.variants import token_only  # noqa: F401
from dmtp.models.variants import t1_residual  # noqa: F401
from dmtp.models.variants import mask_residual  # noqa: F401
from dmtp.models.variants import context_fusion  # noqa: F401
from dmtp.models.variants import mtp_context  # noqa: F401
from dmtp.models.variants import fusion  # noqa: F401
from dmtp.models.variants import double_anchor_fusion  # noqa: F401
from dmtp.models.variants import zero_init_residual  # noqa: F401
from dmtp.models.variants.base import REGISTRY, Layout, Variant, get_variant, register  # noqa: F401

NAMES = list(REGISTRY)
