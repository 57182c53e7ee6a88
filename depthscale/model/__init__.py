"""The architecture: the scanned Transformer and its method tables (placements, residual
designs, norms), parametrizations, compute primitives and the per-layer recording site.
Imports nothing from depthscale.training or depthscale.results."""
