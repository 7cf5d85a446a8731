"""Feeding and evaluating the step.

`input_pipeline.py` is the grain loader (`data_loader`, `ArraySource`, the
iterator state saved with checkpoints), `epoch_order.py` the deprecated
hand-written epoch order it replaced, `prefetch.py` puts batches on the
devices ahead of the step, and `evaluation.py` evaluates a padded dataset
exactly across replicas and processes. Imports `layout/` and `comm/`, never
`step/`.
"""
