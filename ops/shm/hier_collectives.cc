// HierBackend's allgatherv and reducescatter (ops/shm/hier_backend.h): the
// hierarchical paths from HierBackendOptions::collectiveMinBytes up, the
// flat backend below. Executor thread; their cross stage runs on the cross
// thread, piece by piece beside the local stage of the next piece (idle
// otherwise: an allreduce waits for all of its cross-host parts before it
// returns).
#include <algorithm>
#include <cstring>
#include <new>

#include "core/reduce.h"
#include "ops/shm/hier_backend.h"

namespace hora {

namespace {
// Scratch above this is given back after the call: one large collective
// must not hold its memory for the life of the set.
constexpr size_t kKeepScratchBytes = size_t{64} << 20;

// Every rank's block cut in `pieces` alike (its first elements in piece 0),
// and what each stage moves of piece k: crossCounts[k][h], piece k of the
// block of host h's rank with this local index (the cross stage);
// localCounts[k][l], piece k of the blocks of local index l over every host
// (the local stage).
struct Pieces {
  size_t pieces = 1;
  std::vector<std::vector<size_t>> crossCounts, localCounts;
  size_t cut(size_t n, size_t k) const { return n / pieces * k + n % pieces * k / pieces; }
  size_t piece(size_t n, size_t k) const { return cut(n, k + 1) - cut(n, k); }
};

Pieces cutPieces(size_t pieces, const std::vector<size_t>& counts,
                 const std::vector<std::vector<int>>& at, int myLocal) {
  Pieces p;
  p.pieces = pieces;
  const size_t hosts = at.size(), locals = hosts == 0 ? 0 : at[0].size();
  p.crossCounts.assign(pieces, std::vector<size_t>(hosts, 0));
  p.localCounts.assign(pieces, std::vector<size_t>(locals, 0));
  for (size_t k = 0; k < pieces; ++k)
    for (size_t h = 0; h < hosts; ++h)
      for (size_t l = 0; l < locals; ++l) {
        const size_t n = p.piece(counts[at[h][l]], k);
        p.localCounts[k][l] += n;
        if (static_cast<int>(l) == myLocal) p.crossCounts[k][h] = n;
      }
  return p;
}
}  // namespace

Status HierBackend::guarded(const std::string& what, const std::function<Status()>& call) {
  Status s;
  try {
    s = call();
  } catch (const std::bad_alloc&) {
    s = Status(Code::kSystemError,
               what + ": out of memory for the staging buffers (the payload over all ranks)");
  } catch (const std::exception& e) {
    s = internalError(what + ": " + e.what());
  }
  if (!s.isOk()) {
    // Cross jobs of the call may still use the scratch: ended (the cross
    // stage aborted) and waited for before it is given back.
    s = fail(s);
    crossDrain();
  }
  for (auto* v : {&scratchA_, &scratchB_})
    if (v->capacity() > kKeepScratchBytes) std::vector<uint8_t>().swap(*v);
  return s;
}

void HierBackend::layoutCounts(const std::vector<size_t>& counts, size_t es,
                               std::vector<size_t>* offset, std::vector<size_t>* byLocal,
                               std::vector<size_t>* byHost) const {
  const size_t locals = at_.empty() ? 0 : at_[0].size();
  offset->assign(counts.size() + 1, 0);
  for (size_t r = 0; r < counts.size(); ++r) (*offset)[r + 1] = (*offset)[r] + counts[r] * es;
  byLocal->assign(locals, 0);
  byHost->assign(at_.size(), 0);
  for (size_t h = 0; h < at_.size(); ++h) {
    for (size_t l = 0; l < locals; ++l) (*byLocal)[l] += counts[at_[h][l]];
    (*byHost)[h] = counts[at_[h][myLocal_]];
  }
}

Status HierBackend::allgatherv(const void* in, void* out, const std::vector<size_t>& counts,
                               DataType dtype) {
  size_t total = 0;
  for (size_t c : counts) total += c;
  const std::string what = "hier allgatherv(total=" + std::to_string(total) + ", " +
                           dataTypeName(dtype) + ", set rank " + std::to_string(rank_) + ")";
  if (counts.size() != static_cast<size_t>(size_) || total * dataTypeSize(dtype) == 0 ||
      total * dataTypeSize(dtype) < collectiveMinBytes_)
    return delegate(what, [&] { return flat_->allgatherv(in, out, counts, dtype); });
  HORA_RETURN_IF_ERROR(checkUsable(what));
  // Only this rank sees its own buffers: its peers go ahead, so fail the
  // backend for them too rather than leave them waiting.
  if (out == nullptr || (counts[rank_] > 0 && in == nullptr))
    return fail(invalidArgument(what + ": null buffer"));
  Status s = guarded(what, [&] { return hierAllgatherv(in, out, counts, dtype, what); });
  return s.isOk() ? s : fail(s);
}

Status HierBackend::hierAllgatherv(const void* in, void* out, const std::vector<size_t>& counts,
                                   DataType dtype, const std::string& what) {
  const size_t es = dataTypeSize(dtype);
  std::vector<size_t> offset, byLocal, byHost;
  layoutCounts(counts, es, &offset, &byLocal, &byHost);
  size_t crossTotal = 0, total = 0;
  for (size_t c : byHost) crossTotal += c;
  for (size_t c : byLocal) total += c;
  // Piece k crosses hosts on the cross thread while the executor gathers
  // piece k-1 inside the host.
  const Pieces p = cutPieces(collectivePieces(total * es), counts, at_, myLocal_);
  const size_t pieces = p.pieces, locals = byLocal.size();
  // Everything allocated before the first cross job starts: an allocation
  // that throws must not leave a job writing into freed scratch.
  if (scratchA_.size() < crossTotal * es + 1) scratchA_.resize(crossTotal * es + 1);
  size_t maxPiece = 0;
  std::vector<size_t> crossAt(pieces + 1, 0);  // bytes into scratchA_
  for (size_t k = 0; k < pieces; ++k) {
    size_t crossed = 0, gathered = 0;
    for (size_t c : p.crossCounts[k]) crossed += c;
    for (size_t c : p.localCounts[k]) gathered += c;
    crossAt[k + 1] = crossAt[k] + crossed * es;
    maxPiece = std::max(maxPiece, gathered);
  }
  if (scratchB_.size() < maxPiece * es + 1) scratchB_.resize(maxPiece * es + 1);
  // (1) Across hosts: this local index's blocks, host by host, piece by piece.
  const auto* mine = static_cast<const uint8_t*>(in);
  const size_t myCount = counts[rank_];
  for (size_t k = 0; k < pieces; ++k) {
    const void* from = mine == nullptr ? nullptr : mine + p.cut(myCount, k) * es;
    uint8_t* to = scratchA_.data() + crossAt[k];
    crossStartJob([this, from, to, c = p.crossCounts[k], dtype] {
      return cross_->allgatherv(from, to, c, dtype);
    });
  }
  auto* dst = static_cast<uint8_t*>(out);
  for (size_t k = 0; k < pieces; ++k) {
    Status s = crossWait();
    if (!s.isOk()) {
      s = fail(s.withContext(what + ": across hosts"));  // the jobs still queued end at once
      crossDrain();
      return s;
    }
    // (2) Inside the host: every local index's piece, local index by local
    // index (each of them host by host).
    s = local_->allgatherv(scratchA_.data() + crossAt[k], scratchB_.data(), p.localCounts[k],
                           dtype);
    if (!s.isOk()) {
      (void)fail(s);  // aborts the cross stage: the jobs still queued end at once
      crossDrain();
      return s.withContext(what + ": inside the host");
    }
    // (3) Into set-rank order.
    size_t at = 0;
    for (size_t l = 0; l < locals; ++l) {
      for (size_t h = 0; h < at_.size(); ++h) {
        const int r = at_[h][l];
        const size_t bytes = p.piece(counts[r], k) * es;
        if (bytes > 0)
          copyBytes(dst + offset[r] + p.cut(counts[r], k) * es, scratchB_.data() + at, bytes);
        at += bytes;
      }
    }
  }
  return Status::ok();
}

Status HierBackend::reducescatter(void* inout, const std::vector<size_t>& counts, DataType dtype,
                                  ReduceOp op) {
  size_t total = 0;
  for (size_t c : counts) total += c;
  const std::string what = "hier reducescatter(total=" + std::to_string(total) + ", " +
                           dataTypeName(dtype) + ", " + reduceOpName(op) + ", set rank " +
                           std::to_string(rank_) + ")";
  if (counts.size() != static_cast<size_t>(size_) || total * dataTypeSize(dtype) == 0 ||
      total * dataTypeSize(dtype) < collectiveMinBytes_ || !reduceOpSupported(op, dtype))
    return delegate(what, [&] { return flat_->reducescatter(inout, counts, dtype, op); });
  HORA_RETURN_IF_ERROR(checkUsable(what));
  if (inout == nullptr) return fail(invalidArgument(what + ": null buffer"));
  Status s = guarded(what, [&] { return hierReducescatter(inout, counts, dtype, op, what); });
  return s.isOk() ? s : fail(s);
}

Status HierBackend::hierReducescatter(void* inout, const std::vector<size_t>& counts,
                                      DataType dtype, ReduceOp op, const std::string& what) {
  const size_t es = dataTypeSize(dtype);
  std::vector<size_t> offset, byLocal, byHost;
  layoutCounts(counts, es, &offset, &byLocal, &byHost);
  size_t total = 0;
  for (size_t c : byLocal) total += c;
  // Piece k is reduced inside the host, then crosses hosts on the cross
  // thread while the executor reduces piece k+1 inside the host.
  const Pieces p = cutPieces(collectivePieces(total * es), counts, at_, myLocal_);
  const size_t pieces = p.pieces, locals = byLocal.size();
  // (1) The input piece by piece, each by local index (each host by host),
  // so that the host's reduce-scatter of a piece leaves local rank l the
  // piece of the blocks of local index l. Allocated before any job starts.
  if (scratchB_.size() < total * es + 1) scratchB_.resize(total * es + 1);
  std::vector<size_t> pieceAt(pieces, 0), mineAt(pieces, 0);  // bytes into scratchB_
  auto* src = static_cast<uint8_t*>(inout);
  size_t at = 0;
  for (size_t k = 0; k < pieces; ++k) {
    pieceAt[k] = at;
    for (size_t l = 0; l < locals; ++l) {
      if (static_cast<int>(l) == myLocal_) mineAt[k] = at;
      for (size_t h = 0; h < at_.size(); ++h) {
        const int r = at_[h][l];
        const size_t n = p.piece(counts[r], k);
        if (n > 0)
          copyBytes(scratchB_.data() + at, src + offset[r] + p.cut(counts[r], k) * es, n * es);
        at += n * es;
      }
    }
  }
  for (size_t k = 0; k < pieces; ++k) {
    // (2) Inside the host: this local index's piece, reduced over the host.
    Status s = local_->reducescatter(scratchB_.data() + pieceAt[k], p.localCounts[k], dtype, op);
    if (!s.isOk()) {
      (void)fail(s);
      crossDrain();
      return s.withContext(what + ": inside the host");
    }
    // (3) Across hosts: this rank's piece, reduced over every host.
    uint8_t* part = scratchB_.data() + mineAt[k];
    crossStartJob([this, part, c = p.crossCounts[k], dtype, op] {
      return cross_->reducescatter(part, c, dtype, op);
    });
  }
  Status s;
  for (size_t k = 0; k < pieces; ++k) {
    Status w = crossWait();
    // The first failure aborts the cross stage: the jobs still queued end at once.
    if (s.isOk() && !w.isOk()) s = fail(w.withContext(what + ": across hosts"));
  }
  if (!s.isOk()) return s;
  for (size_t k = 0; k < pieces; ++k) {
    size_t within = 0;  // this host's part of the piece
    for (int h = 0; h < myHost_; ++h) within += p.crossCounts[k][h] * es;
    const size_t n = p.piece(counts[rank_], k);
    if (n > 0)
      copyBytes(src + offset[rank_] + p.cut(counts[rank_], k) * es,
                scratchB_.data() + mineAt[k] + within, n * es);
  }
  return Status::ok();
}

}  // namespace hora
