"""Local collection: measure the device graphsim runs on (``hw probe``), time its op families into measured
tables (``collect ops``) and run graphsim's own compiled graphs as JAX programs (``collect forward``), so the
SOL -> OP -> FPM loop can be checked end to end on a CPU and runs unchanged on a GPU (docs/fpm.md)."""
