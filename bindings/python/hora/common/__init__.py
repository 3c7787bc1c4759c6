"""Horovod's ``horovod.common`` import paths, for scripts that use them:
``hora.common.exceptions`` and ``hora.common.elastic`` re-export
``hora.exceptions`` and ``hora.elastic``."""
