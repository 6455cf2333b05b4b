"""Memory analysis: live storages under a dispatch mode (`tracker`), saved-for-backward
(`saved`), optimizer state (`optimizer`), the training-step definition (`step`), batch
scaling (`scaling`), advice (`advice`) and the ground-truth measurement (`measure`).
`inspector.passes.memory` puts the results into the report."""
