"""The Code ablation (docs/METHOD.md, "The blog's numbers"): which runs are trained and evaluated, how the rows are
grouped, the reference row.

    from ablations.code import code
    code().runs()      # ar, mtp, the main variants, the continued run, the supplementary variants, the backbones
"""
from dmtp.config import AblationSpec


def code(**over) -> AblationSpec:
    return AblationSpec(**{**dict(
        name="code",
        baselines=("ar", "mtp"),  # AR target alone; native MTP415 (4 chained steps)
        main=("dflash", "token_only", "t1_residual", "double_anchor_fusion", "fusion", "zero_init_residual"),
        supplementary=("mask_residual", "context_fusion", "mtp_context"),
        # zero_init_residual as initialised: [A, E(T1), MASK x6] without the MTP hidden (isolates what the hidden adds)
        controls=("double_anchor_token_only",),
        continued={"zero_init_residual_from_dflash": ("zero_init_residual", "dflash")},
        # the DFlash2 axis (docs/METHOD.md, "The injection variants"): trained from scratch beside the variants,
        # evaluated with the main table
        backbones={"dflash2": ("dflash", "dflash2"), "dmtp_d2": ("zero_init_residual", "dflash2")},
        reference="token_only",  # the blog's ablation reports every row relative to this one
        main_method="zero_init_residual",  # DMTP (Nov 9 main method)
        # every DMTP number of the blog predates the updates ("existing data unchanged", Nov 4): single-anchor fusion
        blog_method="fusion",
        drafter_baseline="dflash",
        main_table=("ar", "mtp", "dflash", "zero_init_residual"),
        bench=("ar", "mtp", "dflash", "t1_residual", "zero_init_residual"),
        seeds=(0, 1, 2),  # main and control runs; the others: the first seed
    ), **over})
