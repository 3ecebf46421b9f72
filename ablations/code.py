"""The Code ablation (SPEC §8): which methods run, which rows are main/supplementary, the reference row."""

BASELINES = ["ar", "mtp"]  # AR target alone; native MTP415 (4 chained steps)
MAIN = ["dflash", "token_only", "t1_residual", "double_anchor_fusion", "fusion", "zero_init_residual"]
SUPPLEMENTARY = ["mask_residual", "context_fusion", "mtp_context"]
CONTINUED = {"zero_init_residual_from_dflash": ("zero_init_residual", "dflash")}  # name -> (variant, init from)
BACKBONES = {"dflash2": ("dflash", "dflash2"), "dmtp_d2": ("zero_init_residual", "dflash2")}  # name -> (variant,
# backbone): the DFlash2 axis (SPEC §9), trained from scratch beside VARIANTS, evaluated with the main table
REFERENCE = "token_only"  # rows are reported relative to this one
MAIN_TABLE = ["ar", "mtp", "dflash", "zero_init_residual"]  # methods of the main (all-prompt) table
VARIANTS = MAIN + SUPPLEMENTARY  # drafters trained from scratch with identical data/budget/seed
