"""Where arrays live: meshes, sharding rules, processes and TPU slices.

`mesh.py` builds data and torus meshes, `param_sharding.py` turns FSDP and
tensor-parallel rules into `PartitionSpec`s, and `distributed.py` sets up
multi-host runs and moves host-local arrays to global ones. `tpu_slice.py`
names Cloud TPU slices as compile targets (one or several joined over the
data-center network), with each generation's public facts in
`tpu_generations.py` and rings and tori laid along the chips' links in
`torus_order.py`. Imports only `comm/` (for the update-sharding layout).
"""
