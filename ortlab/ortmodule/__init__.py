"""The real ORTModule (onnxruntime-training 1.19.2) driven and observed; ORT's own folder name.

    driver          train a module with the real ORTModule: its variables, logs, dumped graphs, fallback, profiles
    training_agent  one layer down: OrtModuleGraphBuilder builds the graphs, TrainingAgent runs them
    logger          ORTMODULE_LOG_LEVEL and the rank-0 filtering of ORTModule's logger
    fused_adam      ORT's FusedAdam and FP16_Optimizer on a CPU build: the closest real thing to each
    triton_codegen  ORT's Triton code generation family on a CPU build
    distributed     ORTModule with DDP, and ORT's load-balancing sampler

The mirror of the same machinery, written small, is ortlab.training (MiniORTModule and its managers).
"""
