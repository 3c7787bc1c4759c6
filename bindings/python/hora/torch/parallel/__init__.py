"""hora.torch.parallel: model-parallel layouts on hora's process sets and
send/recv (pipeline; tensor, context and hybrid grids in their modules)."""
from .pipeline import Pipeline, StepStats, gpipe_bubble  # noqa: F401
