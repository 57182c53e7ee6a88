"""Procedures on trained models: fine-tuning from a finished rung (init_from), layer pruning
with healing (prune) and least-squares maps between two models' residual streams
(linear_maps)."""
