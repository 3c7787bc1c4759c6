// Backend: executes one collective on flat, already-fused buffers for one
// communicator (the ranks of one process set).
//
// A backend knows nothing about tensor names, fusion, negotiation or
// frameworks: the runtime has already agreed with every rank on what runs,
// in which order, with which sizes. All calls are synchronous and made only
// from the runtime's executor thread, in the same order on every rank,
// except abort(), which any thread may call and which must not block: it
// makes a call in progress (and every later call) fail promptly, used when
// the control plane has learned that a peer is lost.
//
// Errors: a failed call returns kBackendError (or kRemoteError/kTimeout when
// the library says a peer vanished or timed out); the message names the
// collective, the element count and dtype. Third-party exceptions never
// escape a backend.
//
// Implementations: ops/gloo (CPU memory, any hosts), ops/shm (allreduce
// through shared memory when every rank is on one host; the rest delegated
// to a Gloo backend; the hierarchy across hosts) and ops/tcp (every
// collective of a set across hosts on a ring over hora's own sockets, with a
// mesh beside it for alltoall). Buffers are CPU memory here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tuning.h"
#include "core/types.h"

namespace hora {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // In place over `count` elements. `op` is kSum, kMin, kMax or kProduct
  // (averaging is a sum plus a scale, done by the caller).
  virtual Status allreduce(void* data, size_t count, DataType dtype, ReduceOp op) = 0;
  // Writes input elements [begin, end) to `dst` (end - begin elements).
  using PackFn = std::function<void(size_t begin, size_t end, void* dst)>;
  // `src` holds the final reduced elements [begin, end); consumes them.
  using UnpackFn = std::function<void(size_t begin, size_t end, const void* src)>;

  // An allreduce whose input is produced and whose result is consumed piece by
  // piece, so that a backend can overlap those copies with its network waits
  // (GlooBackend's ring) or pack straight into memory its peers read and
  // unpack straight from theirs (ShmBackend), with no staging copy at all.
  // `staging` is scratch of `count` elements owned by the caller, which a
  // backend may use as the destination of pack and the source of unpack
  // (then dst/src == staging + begin elements, and the callbacks can tell).
  // The backend calls pack(b, e, dst) before it needs elements [b, e) of the
  // input, and unpack(b, e, src) once it has their final reduced values.
  // Every element is packed exactly once and unpacked exactly once; ranges
  // are non-empty and may come in any order and of any size, and pack(b, e)
  // always precedes unpack of any element of [b, e). With count == 0 neither
  // is called. `op` as for allreduce.
  // Thread: both callbacks run on the calling thread, inside this call; they
  // must not call back into the backend and must not throw. On failure some
  // ranges may have been packed and some unpacked, not all.
  // Default: pack all into staging, allreduce(staging, ...), unpack all.
  virtual Status allreduceGather(void* staging, size_t count, DataType dtype, ReduceOp op,
                                 const PackFn& pack, const UnpackFn& unpack) {
    if (count == 0) return allreduce(staging, count, dtype, op);
    pack(0, count, staging);
    Status s = allreduce(staging, count, dtype, op);
    if (s.isOk()) unpack(0, count, staging);
    return s;
  }
  // dst[k] = op(input element begin + k, other[k]) for k < end - begin
  // (otherFirst: op(other[k], input element)), where the input element is
  // what pack would have written (prescaled, or the op's identity for a rank
  // that joined) and op the allreduce's `op`, computed with
  // reduceFunction(dtype, op) in that operand order (so the bits equal
  // packing first, then reducing). dst may be the input itself (an in-place
  // allreduce's output); it never overlaps `other`. Returns false, writing
  // nothing, when it cannot (then the backend packs [begin, end), unless it
  // has already, and reduces).
  using CombineFn =
      std::function<bool(size_t begin, size_t end, void* dst, const void* other, bool otherFirst)>;
  // allreduceGather where a backend may skip packing some input elements and
  // instead combine them straight from the input with a peer's contribution
  // (ShmBackend: this rank's own part of each chunk, which only this rank
  // reads before it is reduced, is never copied into shared memory: a pass
  // over 1/n of the data less). Each element is packed at most once and
  // combined at most once, and at least one of the two (ShmBackend packs
  // every element of a small chunk for its peers, and ranks 0 and 1 also
  // combine it: their own operand then comes from the input, not from the
  // slot the peers are reading). Default: allreduceGather, combine unused.
  virtual Status allreduceGatherCombine(void* staging, size_t count, DataType dtype, ReduceOp op,
                                        const PackFn& pack, const UnpackFn& unpack,
                                        const CombineFn& combine) {
    (void)combine;
    return allreduceGather(staging, count, dtype, op, pack, unpack);
  }
  // `hook` (empty: none) is called now and then, about every few
  // milliseconds, by a collective waiting for a peer, on the waiting thread.
  // For the control thread when it runs a collective itself: it reads and
  // sends no frames meanwhile, and the hook tells its peers it is alive
  // (ControlPlane::markAlive). Set and cleared on the thread that calls the
  // collectives, between them. Default: ignored (waits too short to matter).
  virtual void setWaitHook(std::function<void()> hook) { (void)hook; }
  // Whether an allreduce of `count` elements of `dtype` would call that hook
  // while it waits (the control thread runs only those itself).
  virtual bool callsWaitHook(size_t count, DataType dtype) const {
    (void)count;
    (void)dtype;
    return false;
  }
  // Whether allreduceGather of `count` elements of `dtype` uses its staging
  // argument. The runtime skips allocating (and first touching) a staging
  // buffer when it does not: with ShmBackend the fusion buffer is the
  // shared segment itself.
  virtual bool needsStaging(size_t count, DataType dtype) const {
    (void)count;
    (void)dtype;
    return true;
  }
  // Packing ahead (HORA_PACK_AHEAD): while an allreduce still waits for its
  // negotiation's answer, packs what allreduceGatherCombine(count, dtype,
  // op, pack, ..., a combine function offered) would pack first, provided
  // that allreduce is this backend's next collective, and keeps it under
  // `token` (non-zero, never used twice). Returns whether it packed; false
  // (the default) costs nothing and changes nothing. Never waits: it packs
  // only when the memory is free now. `stop` (may be empty) is asked
  // between pieces of a few KiB: true makes it stop there and keep what it
  // packed so far (the caller has other work: the negotiation's answer).
  // `peerKey` (0: none): the same on every rank for this allreduce (its
  // Request::signature); with it, a complete pack is published to the peers,
  // which then need not wait for this rank to pack (expectPeersPrepacked).
  // Called on the thread that calls the collectives, between them.
  virtual bool prepackAllreduce(uint64_t token, uint64_t peerKey, size_t count, DataType dtype,
                                ReduceOp op, const PackFn& pack,
                                const std::function<bool()>& stop) {
    (void)token;
    (void)peerKey;
    (void)count;
    (void)dtype;
    (void)op;
    (void)pack;
    (void)stop;
    return false;
  }
  // The token of the allreduce that the next allreduceGather(Combine) call
  // runs (0: none): when it matches what prepackAllreduce kept, and nothing
  // ran in between, that call skips packing what was packed ahead (pack is
  // then not called for those elements: they count as packed). Any
  // collective drops what was packed ahead; a mismatch only costs the pack.
  virtual void expectPrepacked(uint64_t token) { (void)token; }
  // The peer key (prepackAllreduce) of the allreduce that the next
  // allreduceGather(Combine) call runs (0: none): a peer that published a
  // complete pack ahead of that key for that call counts as packed at once.
  // Called right before that call, on its thread.
  virtual void expectPeersPrepacked(uint64_t peerKey) { (void)peerKey; }
  // What this rank published with prepackAllreduce no longer counts. Any
  // thread. The set calls it before each of this rank's requests goes out:
  // a published pack names a tensor, not a submission of it, and a peer
  // cannot run a later submission before that request arrived, so no pack
  // outlives the submission it was made for (one that failed, ran through
  // another plane, or met a join).
  virtual void withdrawPrepacked() noexcept {}
  // How many allreduces so far skipped packing what was packed ahead for
  // them (all or part of their first chunk). Any thread.
  virtual uint64_t prepacksUsed() const { return 0; }
  // How many peers' packs ahead allreduces read so far without waiting for
  // those peers to pack (expectPeersPrepacked). Any thread.
  virtual uint64_t peerPrepacksRead() const { return 0; }
  // Rank r contributes counts[r] elements; `out` receives all of them in
  // rank order (sum(counts) elements). `in` may be null when counts[rank]==0.
  virtual Status allgatherv(const void* in, void* out, const std::vector<size_t>& counts,
                            DataType dtype) = 0;
  virtual Status broadcast(void* data, size_t count, DataType dtype, int root) = 0;
  // send[r] elements go to rank r from consecutive regions of `in`; recv[r]
  // elements arrive from rank r into consecutive regions of `out`.
  virtual Status alltoallv(const void* in, const std::vector<int64_t>& send, void* out,
                           const std::vector<int64_t>& recv, DataType dtype) = 0;
  // `inout` holds sum(counts) elements; on return its region for this rank
  // (offset sum(counts[0..rank)), counts[rank] elements) holds the reduction.
  // Other regions are clobbered. `op` as for allreduce.
  virtual Status reducescatter(void* inout, const std::vector<size_t>& counts, DataType dtype,
                               ReduceOp op) = 0;
  virtual Status barrier() = 0;
  virtual void abort() noexcept = 0;
  // Autotune (core/tuning.h): the data-plane values (shm chunk, shm cut-over,
  // Gloo cut-over), applied by every rank between the same two collectives,
  // on the executor thread. A backend takes what applies to it and clamps it
  // to what it can do (the shm chunk to its slot). Default: nothing to tune.
  virtual void tune(const TuningValues& values) { (void)values; }
};

}  // namespace hora
