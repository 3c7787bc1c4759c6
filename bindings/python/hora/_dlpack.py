"""DLPack structs and conversions: any framework's tensor -> a DLTensor hora can read.

Two ways in:

* ``from_capsule``: a PyCapsule named "dltensor" (``obj.__dlpack__()``,
  ``torch.utils.dlpack.to_dlpack``) holds a ``DLManagedTensor*``; its
  ``dl_tensor`` is copied into a struct we own (shape/strides still point into
  the producer's memory) and the capsule is kept alive with it. When the
  capsule is garbage-collected unconsumed, the producer's deleter runs, so
  the tensor memory lives exactly as long as the returned ``TensorRef``.
* ``from_numpy_buffer``: for NumPy arrays whose ``__dlpack__`` refuses (bool,
  read-only, NumPy < 1.22), a DLTensor built from the array's buffer.

The caller keeps the ``TensorRef`` (and so the producer's memory) alive until
the hora request using it has completed.
"""
import ctypes

kDLCPU = 1
kDLInt = 0
kDLUInt = 1
kDLFloat = 2
kDLBfloat = 4
kDLBool = 6  # DLPack >= 0.8; hora accepts it with bits 8


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_is_valid.restype = ctypes.c_int
_is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]


class TensorRef:
    """A DLTensor we own plus the objects that keep its memory alive."""
    __slots__ = ("dl", "keep", "ready_event")

    def __init__(self, dl, keep, ready_event=None):
        self.dl = dl
        self.keep = keep
        # GPU tensors: an object with a ``cuda_event`` handle (torch.cuda.Event)
        # recorded after the kernels producing the tensor; hora waits for it.
        self.ready_event = ready_event

    @property
    def pointer(self):
        return ctypes.pointer(self.dl)

    @property
    def shape(self):
        return tuple(self.dl.shape[i] for i in range(self.dl.ndim))


def from_capsule(capsule, keep=None, dtype_code=None):
    """TensorRef for a "dltensor" capsule; dtype_code overrides the dtype code
    (used to mark a bool tensor exported as uint8 by frameworks whose DLPack
    predates kDLBool)."""
    if not _is_valid(capsule, b"dltensor"):
        raise ValueError("hora: not an unconsumed DLPack capsule (name must be 'dltensor')")
    managed = DLManagedTensor.from_address(_get_pointer(capsule, b"dltensor"))
    dl = DLTensor.from_buffer_copy(managed.dl_tensor)
    if dtype_code is not None:
        dl.dtype.code = dtype_code
    return TensorRef(dl, (capsule, keep))


_NP_CODES = {"i": kDLInt, "u": kDLUInt, "f": kDLFloat, "b": kDLBool}


def from_numpy_buffer(arr):
    """TensorRef built from a C-contiguous NumPy array's buffer."""
    import numpy as np
    if not arr.flags["C_CONTIGUOUS"]:
        raise ValueError("hora: array is not C-contiguous; use numpy.ascontiguousarray first")
    kind = arr.dtype.kind
    if kind not in _NP_CODES:
        raise ValueError("hora: unsupported NumPy dtype %s" % arr.dtype)
    dl = DLTensor()
    dl.data = arr.ctypes.data if arr.size else None
    dl.device.device_type = kDLCPU
    dl.ndim = arr.ndim
    dl.dtype.code = _NP_CODES[kind]
    dl.dtype.bits = arr.dtype.itemsize * 8
    dl.dtype.lanes = 1
    shape = (ctypes.c_int64 * max(arr.ndim, 1))(*arr.shape)
    dl.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
    dl.strides = None
    dl.byte_offset = 0
    del np
    return TensorRef(dl, (arr, shape))


def nbytes(dl):
    n = 1
    for i in range(dl.ndim):
        n *= dl.shape[i]
    return n * ((dl.dtype.bits * dl.dtype.lanes + 7) // 8)


def shape_of(dl):
    return tuple(dl.shape[i] for i in range(dl.ndim))


def data_address(dl):
    return (dl.data or 0) + dl.byte_offset
