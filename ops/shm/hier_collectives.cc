// HierBackend's allgatherv and reducescatter (ops/shm/hier_backend.h): the
// hierarchical paths from HierBackendOptions::collectiveMinBytes up, the
// flat backend below. Executor thread; the cross thread is idle meanwhile
// (an allreduce waits for all of its cross-host parts before it returns), so
// the cross communicator is called from here directly.
#include <cstring>
#include <new>

#include "core/reduce.h"
#include "ops/shm/hier_backend.h"

namespace hora {

namespace {
// Scratch above this is given back after the call: one large collective
// must not hold its memory for the life of the set.
constexpr size_t kKeepScratchBytes = size_t{64} << 20;
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
  // (1) Across hosts: this local index's blocks, host by host.
  if (scratchA_.size() < crossTotal * es + 1) scratchA_.resize(crossTotal * es + 1);
  Status s = cross_->allgatherv(in, scratchA_.data(), byHost, dtype);
  if (!s.isOk()) return s.withContext(what + ": across hosts");
  // (2) Inside the host: every local index's blocks, local index by local
  // index (each of them host by host).
  if (scratchB_.size() < total * es + 1) scratchB_.resize(total * es + 1);
  s = local_->allgatherv(scratchA_.data(), scratchB_.data(), byLocal, dtype);
  if (!s.isOk()) return s.withContext(what + ": inside the host");
  // (3) Into set-rank order.
  auto* dst = static_cast<uint8_t*>(out);
  size_t at = 0;
  for (size_t l = 0; l < byLocal.size(); ++l) {
    for (size_t h = 0; h < at_.size(); ++h) {
      const int r = at_[h][l];
      const size_t bytes = counts[r] * es;
      if (bytes > 0) copyBytes(dst + offset[r], scratchB_.data() + at, bytes);
      at += bytes;
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
  // (1) The input by local index (each host by host), so that the host's
  // reduce-scatter leaves local rank l the blocks of local index l.
  if (scratchB_.size() < total * es + 1) scratchB_.resize(total * es + 1);
  auto* src = static_cast<uint8_t*>(inout);
  size_t at = 0, mine = 0;
  for (size_t l = 0; l < byLocal.size(); ++l) {
    if (static_cast<int>(l) == myLocal_) mine = at;
    for (size_t h = 0; h < at_.size(); ++h) {
      const int r = at_[h][l];
      const size_t bytes = counts[r] * es;
      if (bytes > 0) copyBytes(scratchB_.data() + at, src + offset[r], bytes);
      at += bytes;
    }
  }
  // (2) Inside the host: this local index's blocks, reduced over the host.
  Status s = local_->reducescatter(scratchB_.data(), byLocal, dtype, op);
  if (!s.isOk()) return s.withContext(what + ": inside the host");
  // (3) Across hosts: this rank's block, reduced over every host.
  uint8_t* part = scratchB_.data() + mine;
  s = cross_->reducescatter(part, byHost, dtype, op);
  if (!s.isOk()) return s.withContext(what + ": across hosts");
  size_t within = 0;
  for (int h = 0; h < myHost_; ++h) within += byHost[h] * es;
  if (counts[rank_] > 0) copyBytes(src + offset[rank_], part + within, counts[rank_] * es);
  return Status::ok();
}

}  // namespace hora
