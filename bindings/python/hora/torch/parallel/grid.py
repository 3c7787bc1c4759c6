"""The hybrid-parallel process grid: data x pipeline x context x tensor parallel.

``grid(tp, pp, cp)`` factors the world into a 4-dimensional grid of ranks and
creates, on every rank, one hora process set per line of the grid along each
dimension. Rank ``r`` has coordinates ``(tp_rank, cp_rank, pp_rank, dp_rank)``;
with the default order ``"tp-cp-pp-dp"`` the tensor-parallel coordinate varies
fastest, so consecutive global ranks share a TP group (Megatron's convention:
TP, the most communication-hungry dimension, stays within a host):

    r = tp_rank + tp * (cp_rank + cp * (pp_rank + pp * dp_rank))

Process-set creation in hora is collective: ``add_process_set`` is called by
every rank for every set (non-members only record it), and the members of a
set block until all of them arrived. ``grid()`` therefore creates every set of
every dimension in one fixed order on all ranks, which can never deadlock: the
first set in that order not yet created has all of its members waiting on it.

Groups of one rank (``dp`` when the grid fills the world, ``cp=1``, ...) are real
process sets too, since hora accepts them; the collectives of
``hora.torch.parallel`` skip them without a request, so they cost nothing.
"""
from ... import basics

_DIMS = ("tp", "cp", "pp", "dp")


class Grid:
    """This rank's place in a DP x PP x CP x TP grid and the process sets of its groups.

    Attributes (all ints unless noted):
      rank, size                 global rank and world size
      tp_size, pp_size, cp_size, dp_size
      tp_rank, pp_rank, cp_rank, dp_rank     coordinates; each equals this rank's
                                 rank within the matching group's process set
      tp_group, pp_group, cp_group, dp_group   hora.torch ProcessSets this rank is in
      dp_cp_group                ranks that share tp and pp (the data x context
                                 replicas of a weight shard: gradients of weights
                                 replicated over CP are reduced over it); equal to
                                 dp_group when cp_size is 1
      tp_ranks, pp_ranks, cp_ranks, dp_ranks  global ranks of this rank's groups,
                                 in set-rank order
      pp_next_rank, pp_prev_rank set ranks (within pp_group) of the next and the
                                 previous pipeline stage, wrapping around
      pp_next_global_rank, pp_prev_global_rank   the same as global ranks
      is_first_stage, is_last_stage   pp_rank == 0, pp_rank == pp_size - 1
      order                      the layout string, innermost dimension first
    """

    def __init__(self, rank, size, sizes, order):
        self.rank, self.size, self.order = rank, size, order
        self._dim_order = tuple(order.split("-"))
        self._sizes = dict(sizes)
        self._strides = {}
        stride = 1
        for d in self._dim_order:
            self._strides[d] = stride
            stride *= self._sizes[d]
        coords = self.coords_of(rank)
        for d in _DIMS:
            setattr(self, d + "_size", self._sizes[d])
            setattr(self, d + "_rank", coords[d])
            setattr(self, d + "_ranks", self.group_ranks(d))
        self._sets = []  # every set this rank added, in creation order (destroy() removes them)
        self.tp_group = self.pp_group = self.cp_group = self.dp_group = self.dp_cp_group = None
        pp = self.pp_size
        self.pp_next_rank = (self.pp_rank + 1) % pp
        self.pp_prev_rank = (self.pp_rank - 1) % pp
        self.pp_next_global_rank = self.pp_ranks[self.pp_next_rank]
        self.pp_prev_global_rank = self.pp_ranks[self.pp_prev_rank]
        self.is_first_stage = self.pp_rank == 0
        self.is_last_stage = self.pp_rank == pp - 1

    # ---- pure layout arithmetic (no communication)
    def coords_of(self, global_rank):
        """{"tp": .., "cp": .., "pp": .., "dp": ..} of any global rank."""
        if not 0 <= global_rank < self.size:
            raise ValueError("hora.torch.parallel: rank %d is outside the world (size %d)" % (global_rank, self.size))
        return {d: (global_rank // self._strides[d]) % self._sizes[d] for d in _DIMS}

    def rank_of(self, tp=0, cp=0, pp=0, dp=0):
        """The global rank at the given coordinates."""
        coords = {"tp": tp, "cp": cp, "pp": pp, "dp": dp}
        r = 0
        for d in _DIMS:
            if not 0 <= coords[d] < self._sizes[d]:
                raise ValueError("hora.torch.parallel: %s coordinate %d outside [0, %d)" % (d, coords[d],
                                                                                          self._sizes[d]))
            r += coords[d] * self._strides[d]
        return r

    def group_ranks(self, dims, global_rank=None):
        """Global ranks (ascending) that share every coordinate of ``global_rank``
        (default: this rank) except the dimensions in ``dims`` ("tp", or a tuple
        such as ("dp", "cp")). Ascending order is set-rank order, and for a single
        dimension it is also coordinate order, since the global rank grows with
        each coordinate."""
        dims = (dims,) if isinstance(dims, str) else tuple(dims)
        base = self.coords_of(self.rank if global_rank is None else global_rank)
        ranks = [0]
        for d in dims:
            ranks = [r + c * self._strides[d] for r in ranks for c in range(self._sizes[d])]
        offset = sum(base[d] * self._strides[d] for d in _DIMS if d not in dims)
        return sorted(offset + r for r in ranks)

    def all_groups(self, dims):
        """Every group along ``dims`` in the world, as lists of global ranks, ordered
        by their lowest rank (the order in which grid() creates them)."""
        seen, groups = set(), []
        for r in range(self.size):
            g = tuple(self.group_ranks(dims, r))
            if g not in seen:
                seen.add(g)
                groups.append(list(g))
        return groups

    # ---- process sets
    def _create_sets(self):
        """Adds every group's process set on this rank, in the same order on all
        ranks, and keeps the ones this rank belongs to."""
        wanted = [("tp", ("tp",)), ("cp", ("cp",)), ("pp", ("pp",)), ("dp", ("dp",))]
        if self.cp_size > 1:
            wanted.append(("dp_cp", ("dp", "cp")))
        try:
            for attr, dims in wanted:
                for ranks in self.all_groups(dims):
                    ps = basics.add_process_set(ranks)
                    self._sets.append(ps)
                    if self.rank in ranks:
                        setattr(self, attr + "_group", ps)
        except BaseException:
            self.destroy()
            raise
        if self.dp_cp_group is None:
            self.dp_cp_group = self.dp_group

    def destroy(self):
        """Removes every process set this grid created (call it on every rank, as
        for creation). The Grid is unusable afterwards; calling it twice is harmless."""
        sets, self._sets = self._sets, []
        for ps in reversed(sets):
            basics.remove_process_set(ps)
        self.tp_group = self.pp_group = self.cp_group = self.dp_group = self.dp_cp_group = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.destroy()
        return False

    def __repr__(self):
        return ("Grid(rank=%d, size=%d, order=%r, tp=%d/%d, cp=%d/%d, pp=%d/%d, dp=%d/%d)"
                % (self.rank, self.size, self.order, self.tp_rank, self.tp_size, self.cp_rank, self.cp_size,
                   self.pp_rank, self.pp_size, self.dp_rank, self.dp_size))


def _check_order(order):
    parts = order.split("-") if isinstance(order, str) else None
    if not parts or sorted(parts) != sorted(_DIMS):
        raise ValueError("hora.torch.parallel: order %r must name tp, cp, pp and dp once each, joined by '-', "
                         "innermost first (e.g. 'tp-cp-pp-dp')" % (order,))
    return "-".join(parts)


def _sizes(world, tp, pp, cp, dp):
    for name, v in (("tp", tp), ("pp", pp), ("cp", cp)):
        if not isinstance(v, int) or v < 1:
            raise ValueError("hora.torch.parallel: %s=%r must be a positive integer" % (name, v))
    model = tp * pp * cp
    if world % model:
        raise ValueError("hora.torch.parallel: world size %d is not divisible by tp*pp*cp = %d*%d*%d = %d"
                         % (world, tp, pp, cp, model))
    want = world // model
    if dp is not None and dp != want:
        raise ValueError("hora.torch.parallel: dp=%r but world size %d / (tp*pp*cp = %d) = %d"
                         % (dp, world, model, want))
    return {"tp": tp, "pp": pp, "cp": cp, "dp": want}


def layout(size, rank, tp=1, pp=1, cp=1, dp=None, order="tp-cp-pp-dp"):
    """A Grid without process sets (its *_group attributes are None), for any
    world size and rank: the layout arithmetic alone, with no hora runtime."""
    return Grid(rank, size, _sizes(size, tp, pp, cp, dp), _check_order(order))


def grid(tp=1, pp=1, cp=1, dp=None, order="tp-cp-pp-dp"):
    """Builds this rank's DP x PP x CP x TP Grid over the world and creates its
    process sets. Call it on every rank with the same arguments, after
    ``hvd.init()``. ``dp`` defaults to size / (tp*pp*cp); a size that does not
    divide, or a ``dp`` that disagrees, raises ValueError naming the numbers.
    ``order``: the dimensions innermost (fastest-varying rank) first. Call
    ``Grid.destroy()`` (or use the Grid as a context manager) on every rank to
    remove the sets again."""
    g = layout(basics.size(), basics.rank(), tp, pp, cp, dp, order)
    g._create_sets()
    return g
