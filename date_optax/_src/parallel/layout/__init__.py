"""Where arrays live: meshes, sharding rules and processes.

`mesh.py` builds data and torus meshes, `param_sharding.py` turns FSDP and
tensor-parallel rules into `PartitionSpec`s, and `distributed.py` sets up
multi-host runs and moves host-local arrays to global ones. Imports only
`comm/` (for the update-sharding layout).
"""
