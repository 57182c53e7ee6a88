"""Procedures on trained models: fine-tuning from a finished rung (init_from), layer pruning
with healing (prune), removing the norms by fine-tuning (ln_free) and least-squares maps
between two models' residual streams (linear_maps). Importing the package registers the
procedures a run's config can switch on (depthscale.training.procedures)."""

from depthscale.posthoc import init_from, ln_free  # registers them
