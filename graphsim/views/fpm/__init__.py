"""Forward Pass Metrics: whole-forward samples, their identity, per-partition fits on SOL and held-out error (docs/fpm.md)."""
