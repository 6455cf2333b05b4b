"""Per-rank training memory under data parallelism, from one process.

- `world`: a fake process group and device mesh of any size (no other process).
- `shardtracker`: the live-storage tracker taught DTensors and FSDP2's storage resizes.
- `rankstep`: one tracked training step as one rank (local shards, gathered params).
- `inflight`: the buffers a real process group holds past a collective's wait.
- `fsdp`: FSDP2 (`fully_shard` per repeated block + root) run for real on fake tensors.
- `offload`: FSDP2's CPU offload: the device's peak and the host's share, apart.
- `ddp`: DistributedDataParallel: the one-process step plus its gradient buckets.
- `zero`: ZeRO-1: DDP with `ZeroRedundancyOptimizer`, run in the fake world.
- `zero2`: ZeRO-2: gradients reduce-scattered as autograd makes them, state sharded.
- `tpplan`: the tensor-parallel plan derived from the model's blocks (parallelize_module's).
- `tp`: TP and FSDP x TP (a 2-D mesh) run for real on fake tensors.
- `layerscale`: a deep stack of identical blocks run at two short depths and scaled.
- `plan`: one `--parallel` spec -> the heaviest rank's memory (`RankMemory`).
- `gpus`: the fewest ranks whose heaviest rank fits each accelerator size, verified.
"""
