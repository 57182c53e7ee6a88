"""Data pipeline: synthetic hierarchical/k-hop sources and local text corpora."""

from depthscale.data.pipeline import eval_batches
from depthscale.data.pipeline import train_iterator
from depthscale.data.pipeline import validate
from depthscale.data.sources import SOURCES
from depthscale.data.sources import hop_values
from depthscale.data.sources import measure
from depthscale.data.sources import required_vocab
