"""TorchState: models, optimizers and samplers as elastic state (Horovod's
horovod.torch.elastic.state)."""
import collections
import copy

import torch

from ...elastic import ObjectState
from ..functions import allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters
from ...basics import rank
from ..local_sgd import LocalSGD
from .sampler import ElasticSampler


def _host_copy(obj):
    """A deep copy of a state_dict with every tensor copied to CPU memory: a
    commit must not keep GPU memory, and must not share storage with the live
    tensors it protects. Keeps the ``_metadata`` that Module.state_dict()
    attaches (load_state_dict uses it for version upgrades)."""
    if torch.is_tensor(obj):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        out = collections.OrderedDict() if isinstance(obj, collections.OrderedDict) else {}
        for k, v in obj.items():
            out[k] = _host_copy(v)
        meta = getattr(obj, "_metadata", None)
        if meta is not None:
            out._metadata = copy.deepcopy(meta)
        return out
    if isinstance(obj, list):
        return [_host_copy(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_host_copy(v) for v in obj)
    return copy.deepcopy(obj)


class StateHandler:
    """Saves, restores and syncs one attribute of a TorchState."""

    def __init__(self, value):
        self.value = value

    def save(self):
        raise NotImplementedError("%s must implement save()" % type(self).__name__)

    def restore(self):
        raise NotImplementedError("%s must implement restore()" % type(self).__name__)

    def sync(self):
        raise NotImplementedError("%s must implement sync()" % type(self).__name__)

    def set_value(self, value):
        self.value = value
        self.save()

    def reset(self):
        """Called after the job re-formed, before the callbacks and sync."""
        pass


class ModelStateHandler(StateHandler):
    def __init__(self, model):
        super().__init__(model)
        self.save()

    def save(self):
        self._saved = _host_copy(self.value.state_dict())

    def restore(self):
        # load_state_dict copies into the live parameters (onto their device),
        # so the saved copy stays untouched for the next restore.
        self.value.load_state_dict(self._saved)

    def sync(self):
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class OptimizerStateHandler(StateHandler):
    def __init__(self, optimizer):
        super().__init__(optimizer)
        self.save()

    def save(self):
        self._saved = _host_copy(self.value.state_dict())

    def restore(self):
        # Optimizer.load_state_dict keeps the given tensors when they already
        # have the parameter's device and dtype, and later steps update them in
        # place; a fresh copy keeps the commit intact for a second restore.
        self.value.load_state_dict(_host_copy(self._saved))

    def sync(self):
        broadcast_optimizer_state(self.value, root_rank=0)

    def reset(self):
        # A DistributedOptimizer may hold the failed step's allreduces (from
        # gradient hooks) and their countdowns; drop them, or the next backward
        # or zero_grad would trip over them.
        abandon = getattr(self.value, "_abandon_step", None)
        if abandon is not None:
            abandon()


class LocalSGDStateHandler(OptimizerStateHandler):
    """hvd.LocalSGD: saved and restored through its state_dict() like an
    optimizer, but its state is more than the inner optimizer's (the step
    counters that decide when ranks synchronize, the synchronized point and
    the outer momentum), and all of it must be rank 0's after a re-form, or
    the survivors would average from different points."""

    def sync(self):
        self.value.broadcast_state(root_rank=0)

    def reset(self):
        abandon = getattr(self.value.optimizer, "_abandon_step", None)
        if abandon is not None:
            abandon()


class SamplerStateHandler(StateHandler):
    def __init__(self, sampler):
        super().__init__(sampler)
        self.save()

    def save(self):
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(copy.deepcopy(self._saved))

    def sync(self):
        # Indices each rank recorded itself (record_indices) are merged first;
        # then rank 0's record, with the merge, goes to every rank, and
        # load_state_dict re-shards the rest of the epoch over the new size.
        state_dict = self.value.state_dict()
        merged = set()
        for indices in allgather_object(state_dict["processed_indices"], name="elastic_sampler.indices"):
            merged.update(indices)
        state_dict["processed_indices"] = sorted(merged)
        self.value.load_state_dict(broadcast_object(state_dict, root_rank=0, name="elastic_sampler.state"))


_handler_registry = [
    (torch.nn.Module, ModelStateHandler),
    (LocalSGD, LocalSGDStateHandler),
    (torch.optim.Optimizer, OptimizerStateHandler),
    (ElasticSampler, SamplerStateHandler),
]


def get_handler_registry():
    """The (type, handler class) list TorchState picks handlers from, first match wins."""
    return _handler_registry


def set_handler_registry(registry):
    global _handler_registry
    _handler_registry = registry


def _get_handler(value):
    for handler_type, handler_cls in _handler_registry:
        if isinstance(value, handler_type):
            return handler_cls(value)
    return None


class TorchState(ObjectState):
    """Elastic state of a PyTorch training process.

    Keyword arguments become attributes. Models (``torch.nn.Module``),
    optimizers and ``ElasticSampler``s are handled by type, any number of each:
    ``commit()`` copies their ``state_dict()`` to host memory (a deep copy, on
    CPU), ``restore()`` loads the copy back, ``sync()`` broadcasts rank 0's
    parameters, optimizer state and sampler record. Every other attribute (epoch,
    batch counters, ...) is a plain object, broadcast from rank 0 by pickling.
    Assigning a new model/optimizer/sampler to an attribute saves it at once.

    Rank 0 of a re-formed job is the old rank 0 when it survived, else the
    lowest surviving old rank (docs/elastic.md); every survivor restored the same
    commit, so whichever it is, the broadcast carries the committed state.

    Args:
        model: optional model.
        optimizer: optional optimizer.
        kwargs: further attributes.
    """

    def __init__(self, model=None, optimizer=None, **kwargs):
        kwargs.update(dict(model=model, optimizer=optimizer))
        handlers, plain = {}, {}
        for name, value in kwargs.items():
            handler = _get_handler(value)
            if handler is not None:
                handlers[name] = handler
            else:
                plain[name] = value
        self._handlers = handlers
        for name, handler in self._handlers.items():
            setattr(self, name, handler.value)
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **plain)

    def save(self):
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self):
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self):
        for handler in self._handlers.values():
            handler.sync()
        super().sync()

    def reset(self):
        for handler in self._handlers.values():
            handler.reset()
        super().reset()

    def __setattr__(self, name, value):
        if name != "_handlers" and name in getattr(self, "_handlers", {}) and hasattr(self, name):
            self._handlers[name].set_value(value)
        super().__setattr__(name, value)
