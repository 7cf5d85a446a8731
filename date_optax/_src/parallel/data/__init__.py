"""Feeding and evaluating the step.

`input_pipeline.py` is the grain loader (`data_loader`, `ArraySource`,
iterator state for checkpoints, device prefetch); `evaluation.py` evaluates
a padded dataset exactly across replicas and processes. Imports `layout/`
and `comm/`, never `step/`.
"""
