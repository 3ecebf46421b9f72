"""Engine: the one decode loop (`decode`), the drafting methods it runs, built by name (`methods`: ar, mtp, every
variant), its CUDA graphs (`graphs`), the verification rules at T > 0 (`verify`) and the one evaluation path from
prompts to output records (`runner`). Imports models and data, never the command layer."""
