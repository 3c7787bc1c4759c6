"""``horovod.common.exceptions``'s names (``HorovodInternalError``,
``HostsUpdatedInterrupt``); the classes live in ``hora.exceptions``."""
from ..exceptions import *  # noqa: F401,F403
from ..exceptions import HorovodInternalError, HostsUpdatedInterrupt  # noqa: F401
