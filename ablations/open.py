"""The open reproduction's runs (the blog's 27B table: docs/METHOD.md, "The blog's numbers"): MTP415 beside
DFlash, DMTP(D) and the DFlash2 pair.

    from ablations.open import open_reproduction
    open_reproduction().runs()   # mtp, dflash, fusion, zero_init_residual, dflash2, dmtp_d2
"""
from dmtp.config import AblationSpec


def open_reproduction(**over) -> AblationSpec:
    return AblationSpec(**{**dict(
        name="open",
        baselines=("mtp",),  # native MTP415 (4 chained steps): the blog's baseline column
        # dflash: the DFlash column; fusion: single-anchor T1 fusion, the model the blog's DMTP numbers come from;
        # zero_init_residual: the Nov 9 main method (no number of its own in the blog: "close to fusion")
        main=("dflash", "fusion", "zero_init_residual"),
        # DFlash2 and DMTP(D2): zero_init_residual on the dflash2 backbone (docs/METHOD.md, "The injection variants")
        backbones={"dflash2": ("dflash", "dflash2"), "dmtp_d2": ("zero_init_residual", "dflash2")},
        reference="dflash",  # every row is also reported relative to DFlash
        main_method="zero_init_residual",
        blog_method="fusion",  # the open reproduction's "MTP representation fusion at the first slot"
        drafter_baseline="dflash",
        main_table=("mtp", "dflash", "fusion", "zero_init_residual", "dflash2", "dmtp_d2"),
        seeds=(0,),
    ), **over})
