"""``horovod.common.elastic``'s names; the code lives in ``hora.elastic``."""
from ..elastic import ObjectState, State, run_fn  # noqa: F401
