"""Injection variants: one file each, registered by name (in SPEC §4 order). `dmtp variants` lists them."""
from . import dflash  # noqa: F401
from . import token_only  # noqa: F401
from . import t1_residual  # noqa: F401
from . import mask_residual  # noqa: F401
from . import context_fusion  # noqa: F401
from . import mtp_context  # noqa: F401
from . import fusion  # noqa: F401
from . import double_anchor_fusion  # noqa: F401
from . import zero_init_residual  # noqa: F401
from .base import REGISTRY, Layout, Variant, get_variant, register  # noqa: F401

NAMES = list(REGISTRY)
