"""Engine: the one decode loop (`decode`), its CUDA graphs (`graphs`), opt-in kernel fusion (`fuse`) and the one
evaluation path from prompts to output records (`runner`). Imports models and data, never the command layer."""
