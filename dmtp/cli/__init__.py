"""The command layer (orchestration): the `dmtp` CLI (`main`), the pipeline stages, benchmarks, the paper-scale dry
run, the losslessness check and the report renderer. It imports the library; the library never imports it."""
