"""coverpruner.testing: random-weight checkpoints for tests, demos and benchmarks."""
