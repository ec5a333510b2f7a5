"""Workloads: models, parallel layouts, FLOP/memory accounting and op-graph generators.

Hardware-independent: everything here speaks FLOPs and bytes. The simulator
turns the op graphs into time on a cluster.
"""

from .errors import ConfigError
from .flops import (
    LayerOp,
    PassOps,
    embedding_ops,
    hardware_flops_per_step,
    layer_ops,
    logits_ops,
    model_flops_per_step,
    narayanan_flops_per_step,
    optimizer_op,
)
from .memory import MemoryBreakdown, activation_bytes_per_layer, memory_per_gpu, micro_batches_in_flight
from .models import PRESETS, ModelSpec, get_preset, model_from_dict, preset_names
from .ops import Collective, Compute, Kernel, OpGraph, OpGraphError, Recv, Send
from .parallel import (
    ParallelConfig,
    RankLayout,
    TrainingSpec,
    num_micro_batches,
    parallel_from_dict,
    stage_layers,
    training_from_dict,
    validate,
)
from .schedules import PipeAction, pipeline_schedule
from .training import StepOptions, TrainingStep, training_step

__all__ = [
    "ConfigError", "LayerOp", "PassOps", "embedding_ops", "hardware_flops_per_step", "layer_ops", "logits_ops",
    "model_flops_per_step", "narayanan_flops_per_step", "optimizer_op", "MemoryBreakdown",
    "activation_bytes_per_layer", "memory_per_gpu", "micro_batches_in_flight", "PRESETS", "ModelSpec",
    "get_preset", "model_from_dict", "preset_names", "Collective", "Compute", "Kernel", "OpGraph", "OpGraphError",
    "Recv", "Send", "ParallelConfig", "RankLayout", "TrainingSpec", "num_micro_batches", "parallel_from_dict",
    "stage_layers", "training_from_dict", "validate", "PipeAction", "pipeline_schedule", "StepOptions",
    "TrainingStep", "training_step",
]
