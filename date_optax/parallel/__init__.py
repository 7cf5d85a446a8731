"""Data-parallel training on device meshes and TPU pods.

Meshes (`data_mesh`, `torus_mesh`), all-reduce algorithms over named axes
(`psum_all_reduce`, `ring_all_reduce`, `torus_all_reduce`) with their cost
model, low-precision gradient payloads with Auto-Precision Scaling, train
steps for `jit` over a mesh and for `pmap` (with weight-update sharding and
non-finite step skipping) built from two frozen configs (`GradSync`: how
gradients are reduced, by `sync_gradients`; `StepConfig`: the step's own
options), multi-host set-up, distributed evaluation and a per-host input
pipeline. Cloud TPU slices as compile targets (`tpu_slice`) and the
compiler's account of a step on them (`compile_report`) need no TPU.
"""

from date_optax._src.parallel.comm.collectives import (
    psum_all_reduce,
    ring_all_reduce,
    torus_all_reduce,
)
from date_optax._src.parallel.comm.cost_model import AllReduceCost, allreduce_cost
from date_optax._src.parallel.comm.error_feedback import ErrorFeedbackState
from date_optax._src.parallel.comm.grad_sync import all_reduce, sync_gradients
from date_optax._src.parallel.comm.hlo import collective_permute_rounds, collectives
from date_optax._src.parallel.comm.low_precision import COMM_DTYPES, ROUNDINGS
from date_optax._src.parallel.comm.sync_config import GradSync
from date_optax._src.parallel.comm.update_sharding import (
    bytes_per_device,
    update_shard_axis,
)
from date_optax._src.parallel.data.epoch_order import epoch_batches, epoch_permutation
from date_optax._src.parallel.data.evaluation import evaluate, pad_batch
from date_optax._src.parallel.data.input_pipeline import (
    ArraySource,
    GrowingBatches,
    data_loader,
    iterator_state,
    restore_iterator,
)
from date_optax._src.parallel.data.prefetch import DevicePrefetch, prefetch_to_device
from date_optax._src.parallel.layout.distributed import host_local_to_global, initialize
from date_optax._src.parallel.layout.mesh import data_mesh, torus_mesh
from date_optax._src.parallel.layout.tpu_generations import TpuGeneration
from date_optax._src.parallel.layout.tpu_generations import generation as tpu_generation
from date_optax._src.parallel.layout.tpu_slice import (
    TpuSlice,
    accelerator_types,
    multislice_mesh,
    tpu_slice,
)
from date_optax._src.parallel.step.compile_report import CompileReport, compile_report
from date_optax._src.parallel.step.grad_stats import GradStatsState
from date_optax._src.parallel.step.pmap_step import PmapTrainStep, make_pmap_train_step
from date_optax._src.parallel.step.replicated_step import (
    ReplicatedTrainStep,
    make_replicated_train_step,
)
from date_optax._src.parallel.step.roofline import Roofline, roofline
from date_optax._src.parallel.step.sharded_step import ShardedTrainStep, make_sharded_train_step
from date_optax._src.parallel.step.step_base import TrainStep
from date_optax._src.parallel.step.step_config import StepConfig
from date_optax._src.parallel.step.train_state import (
    NonFiniteError,
    TrainState,
    check_metrics,
)
from date_optax._src.parallel.step.train_step import make_train_step

__all__ = [
    "COMM_DTYPES",
    "ROUNDINGS",
    "AllReduceCost",
    "ArraySource",
    "CompileReport",
    "DevicePrefetch",
    "ErrorFeedbackState",
    "GradStatsState",
    "GradSync",
    "GrowingBatches",
    "NonFiniteError",
    "PmapTrainStep",
    "ReplicatedTrainStep",
    "Roofline",
    "ShardedTrainStep",
    "StepConfig",
    "TrainState",
    "TpuGeneration",
    "TpuSlice",
    "TrainStep",
    "accelerator_types",
    "all_reduce",
    "allreduce_cost",
    "bytes_per_device",
    "check_metrics",
    "collective_permute_rounds",
    "collectives",
    "compile_report",
    "data_loader",
    "data_mesh",
    "epoch_batches",
    "epoch_permutation",
    "evaluate",
    "host_local_to_global",
    "initialize",
    "iterator_state",
    "make_pmap_train_step",
    "make_replicated_train_step",
    "make_sharded_train_step",
    "make_train_step",
    "multislice_mesh",
    "pad_batch",
    "prefetch_to_device",
    "psum_all_reduce",
    "restore_iterator",
    "ring_all_reduce",
    "roofline",
    "sync_gradients",
    "torus_all_reduce",
    "torus_mesh",
    "tpu_generation",
    "tpu_slice",
    "update_shard_axis",
]
