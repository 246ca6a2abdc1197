"""Notebook helpers: what one walkthrough prints or draws, kept out of the mirrors.

One module per notebook, named after it (`welcome` for `00_welcome`, `execution_engine` for L2_01),
with more where a notebook's helpers would pass about 600 lines (`memory_recompute` beside `memory`;
`ortmodule_feature_models` and `ortmodule_input_features` beside `ortmodule_optimizations`). They sit on
the top floor: they may import any part of ortlab, and only the labs, the benchmarks and `ortlab compare`
import them.
"""
