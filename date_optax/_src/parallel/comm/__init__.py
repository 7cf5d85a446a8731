"""How gradients travel between replicas.

Open `sync_config.py` and `grad_sync.py` first: `GradSync` (which all-reduce,
which payload) and `sync_gradients`. Below them: `collectives.py` (psum, ring
and 2-D torus all-reduces over named mesh axes, and the reduce-scatter that
weight-update sharding uses), `rounds.py` (the ring and torus rounds of
neighbour exchanges, run as loops), `two_shot.py` (1-bit Adam's compressed
reduce-scatter), `hierarchical.py` (Multislice: exact in a slice, compressed
across slices), `low_bit_sum.py` (the same sums with a low-bit payload),
`low_precision.py` (payload formats, Auto-Precision Scaling, block scales,
stochastic rounding), `error_feedback.py` (the worker and hop residuals of
two-stage error feedback), `update_sharding.py` (which replica owns which slice
of each leaf), `cost_model.py` (bytes and rounds of each algorithm) and
`hlo.py` (collective rounds read back from compiled HLO).

Nothing here imports `step/`, `layout/` or `data/`.
"""
