"""Allocator: output memory hora asks for once it knows a result's shape
(``options.alloc``, called on a hora thread), for every framework binding
(hora.torch, hora.jax). Framework-free: a subclass says how to make the
output (``_make``) and where its memory is (``_address``)."""
import weakref

from . import _lib


class Allocator:
    """``_make(dims, dl_dtype)`` returns the tensor to write into and
    ``_address(tensor)`` its memory's address. Whatever they raise fails the
    request and is chained onto the request's error (``cause``)."""
    __slots__ = ("tensor", "error", "cfunc", "__weakref__")

    def __init__(self):
        self.tensor = None
        self.error = None
        # The callback reaches the allocator weakly: a bound method would make
        # a cycle (allocator -> cfunc -> allocator) that keeps the output
        # tensor alive until the cyclic GC runs, long after the request
        # finished. The request's keep holds the allocator while in flight.
        me = weakref.ref(self)

        def alloc(user, ndim, shape, dtype, nbytes, data):
            a = me()
            return 1 if a is None else a._alloc(user, ndim, shape, dtype, nbytes, data)

        self.cfunc = _lib.ALLOC(alloc)

    def _make(self, dims, dl_dtype):
        raise NotImplementedError

    def _address(self, tensor):
        return tensor.data_ptr()

    def _alloc(self, _user, ndim, shape, dtype, _nbytes, data):
        try:
            self.tensor = self._make([shape[i] for i in range(ndim)], dtype)
            data[0] = self._address(self.tensor) or None
            return 0
        except BaseException as e:  # nothing may propagate into the hora thread
            self.error = e
            return 1

    def cause(self):
        """Why the allocation failed (chained onto the request's error), or None."""
        return self.error

    def result(self, _pending=None):
        return self.tensor
