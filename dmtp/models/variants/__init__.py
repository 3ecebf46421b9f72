"""Injection variants: one file each in this folder, found and imported here (there is no list to edit), each
registered by name with `@register` (which works from any module: a variant may live outside the package, imported
before use). `dmtp variants` lists them.

    NAMES                  # the variants of this package, by name
    get_variant("fusion")  # the class; REGISTRY also holds variants registered from other modules
"""
import importlib
import pkgutil

from dmtp.models.variants.base import REGISTRY, Layout, Variant, get_variant, register  # noqa: F401

for _mod in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if _mod != "base":
        importlib.import_module(f"{__name__}.{_mod}")

NAMES = sorted(REGISTRY)  # the package's own variants, by name (not those registered later by other modules)
