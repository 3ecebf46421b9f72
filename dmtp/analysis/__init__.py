"""Analysis: pure metrics over raw counts (`metrics`), the blog's reference numbers (`reference`), the losslessness
comparison (`lossless`) and the tables, figures and REPORT.md rendered from artifacts (`report`)."""
