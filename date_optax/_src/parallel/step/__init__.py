"""The training step, built on `comm/`, `layout/` and `data/`.

Open `train_step.py` first: `make_train_step` chooses between the builders
in `replicated_step.py` (parameters replicated, gradients through
`comm.grad_sync`, optionally weight-update sharding) and `sharded_step.py`
(GSPMD over FSDP/tensor-parallel parameters); `pmap_step.py` is the `pmap`
builder. They share `step_base.py` (the `TrainStep` object: init, call,
metrics), `step_checks.py` (what every builder validates) and
`step_config.py` (`StepConfig`). What one replica computes is
in `local_grads.py` (loss, microbatches, keys, model state) and
`replica_step.py`; `train_state.py` holds `TrainState`, the update with its
exact non-finite skip and the metrics; `grad_stats.py` measures the
gradient-noise statistics inside the step; `compile_report.py` and
`roofline.py` read a compiled program's memory, collectives and time.
"""
