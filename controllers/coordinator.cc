#include "controllers/coordinator.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "core/reduce.h"

namespace hora {
namespace {

std::string rankList(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(ranks[i]);
  }
  return s;
}

// Renders "rank 2 has X, rank 0 has Y" grouping ranks with equal values.
std::string describeDisagreement(const std::vector<std::pair<int, std::string>>& values) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (const auto& [rank, value] : values) {
    const std::string& v = value;  // clang 14 cannot capture a structured binding
    auto it = std::find_if(groups.begin(), groups.end(), [&](auto& g) { return g.first == v; });
    if (it == groups.end())
      groups.push_back({v, {rank}});
    else
      it->second.push_back(rank);
  }
  // Minority values first: they are usually the culprit.
  std::stable_sort(groups.begin(), groups.end(),
                   [](auto& a, auto& b) { return a.second.size() < b.second.size(); });
  std::string s;
  for (size_t i = 0; i < groups.size(); ++i) {
    if (i) s += ", ";
    const auto& ranks = groups[i].second;
    s += (ranks.size() == 1 ? "rank " : "ranks ") + rankList(ranks) +
         (ranks.size() == 1 ? " has " : " have ") + groups[i].first;
  }
  return s;
}

std::string shapeText(const Request& r) { return describeTensor(r.dtype, r.shape); }

std::string trailingShape(const Request& r) {
  std::vector<int64_t> rest(r.shape.size() > 1 ? r.shape.begin() + 1 : r.shape.end(),
                            r.shape.end());
  std::string s = dataTypeName(r.dtype);
  s += "[*";
  for (int64_t d : rest) s += "," + std::to_string(d);
  return s + "]";
}

std::string scaleNumberText(double v) {
  std::ostringstream os;
  os.precision(17);  // 1.0 and 1.0000001 must not look equal
  os << v;
  return os.str();
}

std::string scaleText(const Request& r) {
  return "prescale " + scaleNumberText(r.prescale) + " postscale " + scaleNumberText(r.postscale);
}

// A request as it came off the wire, before the coordinator combines it with the others: what
// the C entry points refuse at submission cannot come from a correct peer, so it is a protocol
// error (the sender is treated as broken), never something to compute sizes with.
Status checkRequest(const Request& r, int globalRank, int setSize) {
  auto bad = [&](const std::string& why) {
    return protocolError("rank " + std::to_string(globalRank) + " sent a malformed " +
                         collectiveName(r.kind) + " request for \"" + r.name + "\" (" +
                         describeTensor(r.dtype, r.shape) + "): " + why +
                         "; hora refuses that at submission, so the sender is corrupt or runs "
                         "another hora version");
  };
  if (int dim = shapeOverflowDim(r.shape, dataTypeSize(r.dtype)); dim >= 0)
    return bad("dimension " + std::to_string(dim) + " (" + std::to_string(r.shape[dim]) + ")" +
               (r.shape[dim] < 0 ? " is negative" : " makes its size pass 2^63-1 bytes"));
  // An alltoall without a dimension becomes an error response in constructResponse.
  if (r.kind == CollectiveKind::kAlltoall && !r.shape.empty()) {
    if (r.splits.size() != static_cast<size_t>(setSize))
      return bad(std::to_string(r.splits.size()) + " splits in a set of " +
                 std::to_string(setSize) + " ranks");
    int64_t sum = 0;
    for (size_t i = 0; i < r.splits.size(); ++i) {
      if (r.splits[i] < 0)
        return bad("split " + std::to_string(i) + " is negative (" + std::to_string(r.splits[i]) +
                   ")");
      if (__builtin_add_overflow(sum, r.splits[i], &sum))
        return bad("the splits overflow int64 at split " + std::to_string(i));
    }
    if (sum != r.shape[0])
      return bad("the splits sum to " + std::to_string(sum) + ", not to dimension 0");
  }
  return Status::ok();
}

// A payload (Request::payload) must hold exactly the rank's tensor, in host
// memory, of a kind the coordinator combines (allreduce, reducescatter,
// allgather, alltoall; broadcast from its root only). Anything else cannot
// come from a correct peer.
Status checkPayload(const Request& r, int rank, int globalRank) {
  if (r.payload.empty()) return Status::ok();
  const int64_t bytes = numElements(r.shape) * static_cast<int64_t>(dataTypeSize(r.dtype));
  const bool carries =
      r.kind == CollectiveKind::kAllreduce || r.kind == CollectiveKind::kReducescatter ||
      r.kind == CollectiveKind::kAllgather || r.kind == CollectiveKind::kAlltoall ||
      (r.kind == CollectiveKind::kBroadcast && r.root == rank);
  if (carries && r.device.kind == DeviceKind::kCpu &&
      static_cast<int64_t>(r.payload.size()) == bytes)
    return Status::ok();
  return protocolError("rank " + std::to_string(globalRank) + " sent " +
                       std::to_string(r.payload.size()) + " bytes of inline data with " +
                       r.describe() + " (" + std::to_string(bytes) +
                       " bytes, host memory; broadcast from its root only); the sender is "
                       "corrupt or runs another hora version");
}

struct FusionKey {
  DataType dtype;
  ReduceOp op;
  double pre, post;
  Device device;
  std::vector<int32_t> joined;
  bool operator==(const FusionKey& o) const {
    return dtype == o.dtype && op == o.op && pre == o.pre && post == o.post && device == o.device &&
           joined == o.joined;
  }
};

FusionKey keyOf(const Response& r) {
  // Device kind only, as validation compares it: indexes differ between ranks.
  return FusionKey{r.dtype, r.op, r.prescale, r.postscale, Device{r.device.kind, 0}, r.joined};
}

}  // namespace

Coordinator::Coordinator(CoordinatorOptions options, ResponseCache* cache, Logger logger)
    : opts_(std::move(options)),
      cache_(cache),
      logger_(std::move(logger)),
      joined_(opts_.size, false) {}

Status Coordinator::onRequests(int rank, const RequestList& list, Clock::time_point now,
                               std::vector<CacheHit>* nacks) {
  if (rank < 0 || rank >= opts_.size)
    return protocolError("request list from unknown rank " + std::to_string(rank));
  // Full requests come off the wire: checked before anything is recorded or computed from them.
  // (A hit is rebuilt from this coordinator's own cache, from requests that passed this.)
  for (const auto& r : list.requests)
    HORA_RETURN_IF_ERROR(checkRequest(r, global(rank), opts_.size));
  std::vector<Request> requests = list.requests;
  for (const auto& hit : list.hits) {
    const Response* cached = cache_ ? cache_->peek(hit.bit, hit.signature) : nullptr;
    if (!cached) {
      nacks->push_back(hit);
      continue;
    }
    // Rebuild the request the hit stands for; it then goes through the same
    // validation as a full request, so a hit can never hide a mismatch.
    Request r;
    r.kind = static_cast<CollectiveKind>(cached->kind);
    r.dtype = cached->dtype;
    r.op = cached->op;
    r.device = cached->device;
    r.root = cached->root;
    r.prescale = cached->prescale;
    r.postscale = cached->postscale;
    r.name = cached->name;
    r.shape = cached->shape;
    r.payload = hit.payload;
    requests.push_back(std::move(r));
  }
  for (const auto& r : requests) HORA_RETURN_IF_ERROR(checkPayload(r, rank, global(rank)));
  for (auto& r : requests) {
    r.rank = rank;
    if (r.kind == CollectiveKind::kJoin) {
      if (!joined_[rank]) {
        joined_[rank] = true;
        ++joinedCount_;
      }
      lastJoined_ = rank;
      // Tensors that waited only for this rank are now ready; they run
      // before the join completes, so earlier joiners' tensors finish too.
      std::vector<std::string> names;
      for (auto& kv : table_) names.push_back(kv.first);
      std::sort(names.begin(), names.end());  // deterministic order
      for (const auto& n : names) markReadyIfComplete(n);
      if (joinedCount_ == opts_.size) {
        Response j;
        j.kind = ResponseKind::kJoin;
        j.name = r.name;
        j.lastJoinedRank = lastJoined_;
        ready_.push_back(j);
        std::fill(joined_.begin(), joined_.end(), false);
        joinedCount_ = 0;
      }
      continue;
    }
    auto [it, inserted] = table_.try_emplace(r.name);
    Pending& p = it->second;
    if (inserted) {
      p.byRank.resize(opts_.size);
      p.first = now;
    }
    if (p.byRank[rank]) {
      return protocolError("rank " + std::to_string(rank) + " submitted \"" + r.name +
                           "\" twice before it completed");
    }
    p.byRank[rank] = std::move(r);
    ++p.count;
    // This rank completed the tensor: the others waited for it since the first arrival.
    if (opts_.telemetry && opts_.size > 1 && complete(p))
      opts_.telemetry->lastArrival(rank, now - p.first, it->first);
    markReadyIfComplete(it->first);
  }
  return Status::ok();
}

bool Coordinator::complete(const Pending& p) const {
  for (int r = 0; r < opts_.size; ++r)
    if (!p.byRank[r] && !joined_[r]) return false;
  return true;
}

void Coordinator::markReadyIfComplete(const std::string& name) {
  auto it = table_.find(name);
  if (it == table_.end() || !complete(it->second)) return;
  ready_.push_back(constructResponse(name, it->second));
  table_.erase(it);
  lastStallFailure_.clear();  // every rank took part since: the stall is over
}

Response Coordinator::constructResponse(const std::string& name, Pending& p) {
  const Request* first = nullptr;
  std::vector<const Request*> present;
  std::vector<int32_t> joined;
  for (int r = 0; r < opts_.size; ++r) {
    if (p.byRank[r]) {
      present.push_back(&*p.byRank[r]);
      if (!first) first = &*p.byRank[r];
    } else {
      joined.push_back(r);
    }
  }
  Response resp;
  resp.name = name;
  resp.kind = static_cast<ResponseKind>(first->kind);
  resp.dtype = first->dtype;
  resp.op = first->op;
  resp.device = first->device;
  resp.root = first->root;
  resp.prescale = first->prescale;
  resp.postscale = first->postscale;
  resp.shape = first->shape;
  resp.joined = joined;
  resp.signature = first->signature();

  auto fail = [&](Code code, const std::string& what) {
    Response e;
    e.kind = ResponseKind::kError;
    e.name = name;
    e.errorCode = static_cast<int32_t>(code);
    e.error = what;
    return e;
  };
  // Compare one field across ranks: `same(q, *first)` decides, and only when some rank differs
  // is each rank's value rendered with `show` for the message. The coordinator runs this for
  // every tensor of every step on its control thread, on the critical path of every rank's
  // collective, so the common case (all equal) builds no strings (a scale's ostringstream and
  // the tensor descriptions cost more than the rest of a 4-byte allreduce's validation).
  // Returns the error text or "".
  auto compareBy = [&](const char* field, auto same, auto show) -> std::string {
    bool differ = false;
    for (const Request* q : present) differ |= !same(*q, *first);
    if (!differ) return "";
    std::vector<std::pair<int, std::string>> values;
    for (const Request* q : present) values.push_back({global(q->rank), show(*q)});
    return std::string(collectiveName(first->kind)) + " \"" + name + "\" in process set " +
           opts_.setName + ": mismatched " + field + ": " + describeDisagreement(values) +
           ". Every rank must submit the same " + field +
           " for a tensor name; check for rank-dependent code paths or data shapes.";
  };
  // Equality as the rendered text sees it (scale factors: 17 digits tell every double apart,
  // and NaNs print alike), cheap when the bits are equal.
  auto sameScale = [](double a, double b) {
    return std::memcmp(&a, &b, sizeof(a)) == 0 || scaleNumberText(a) == scaleNumberText(b);
  };
  // The dimensions after the first (none for a rank-0 or rank-1 shape), as trailingShape
  // shows them, compared without copying them.
  auto sameTrailing = [](const Request& a, const Request& b) {
    auto rest = [](const Request& q) {
      return q.shape.size() > 1 ? q.shape.begin() + 1 : q.shape.end();
    };
    return std::equal(rest(a), a.shape.end(), rest(b), b.shape.end());
  };
  std::string err;
  err = compareBy(
      "operation", [](const Request& a, const Request& b) { return a.kind == b.kind; },
      [](const Request& q) { return std::string(collectiveName(q.kind)); });
  // The kind only: the index is each rank's own business (rank i on cuda:i).
  auto isCuda = [](const Request& q) { return q.device.kind == DeviceKind::kCuda; };
  if (err.empty())
    err = compareBy(
        "device", [&](const Request& a, const Request& b) { return isCuda(a) == isCuda(b); },
        [&](const Request& q) { return std::string(isCuda(q) ? "cuda" : "cpu"); });
  auto sameDtype = [](const Request& a, const Request& b) { return a.dtype == b.dtype; };
  if (err.empty()) {
    switch (first->kind) {
      case CollectiveKind::kAllreduce:
      case CollectiveKind::kBroadcast:
      case CollectiveKind::kReducescatter:
        // Each rank's whole tensor shown for both, named by what differs.
        err = compareBy("dtype", sameDtype, shapeText);
        if (err.empty())
          err = compareBy(
              "shape", [](const Request& a, const Request& b) { return a.shape == b.shape; },
              shapeText);
        break;
      case CollectiveKind::kAllgather:
      case CollectiveKind::kAlltoall:
        err = compareBy("dtype", sameDtype, trailingShape);
        if (err.empty()) err = compareBy("trailing shape", sameTrailing, trailingShape);
        if (err.empty()) {
          for (const Request* q : present)
            if (q->shape.empty())
              err = std::string(collectiveName(q->kind)) + " \"" + name + "\": rank " +
                    std::to_string(global(q->rank)) +
                    " submitted a rank-zero tensor; it needs at least one dimension.";
        }
        break;
      default:
        break;
    }
  }
  if (err.empty() && (first->kind == CollectiveKind::kAllreduce ||
                      first->kind == CollectiveKind::kReducescatter)) {
    err = compareBy(
        "reduction op", [](const Request& a, const Request& b) { return a.op == b.op; },
        [](const Request& q) { return std::string(reduceOpName(q.op)); });
    if (err.empty())
      err = compareBy(
          "scale factors",
          [&](const Request& a, const Request& b) {
            return sameScale(a.prescale, b.prescale) && sameScale(a.postscale, b.postscale);
          },
          scaleText);
  }
  if (err.empty() && first->kind == CollectiveKind::kBroadcast)
    err = compareBy(
        "root rank", [](const Request& a, const Request& b) { return a.root == b.root; },
        [](const Request& q) { return "root " + std::to_string(q.root); });
  if (!err.empty()) return fail(Code::kMismatch, err);

  if (!joined.empty()) {
    // Join (docs/architecture.md): allreduce and reducescatter take the op's identity from a
    // joined rank, allgather zero rows, broadcast from a root that did not join goes on. What
    // cannot run fails on every rank that submitted it, naming the joined ranks.
    std::vector<int> joinedGlobal;
    for (int j : joined) joinedGlobal.push_back(global(j));
    const std::string joinedText =
        (joined.size() == 1 ? "rank " : "ranks ") + rankList(joinedGlobal) +
        (joined.size() == 1 ? " has" : " have") + " already joined (hora_join / hvd.join)";
    if (first->kind == CollectiveKind::kAlltoall)
      return fail(Code::kInvalidUsage,
                  "alltoall \"" + name + "\" in process set " + opts_.setName +
                      " cannot run: " + joinedText +
                      " and would have to send and receive rows. Run the alltoall before the "
                      "first rank joins, or on every rank.");
    if (first->kind == CollectiveKind::kBroadcast &&
        std::find(joined.begin(), joined.end(), first->root) != joined.end())
      return fail(Code::kInvalidUsage,
                  "broadcast \"" + name + "\" in process set " + opts_.setName + ": root rank " +
                      std::to_string(global(first->root)) +
                      " has already joined (hora_join / hvd.join) and cannot send it. Broadcast "
                      "before the root joins, or from a rank that has not joined.");
  }

  // Every rank's tensor is within kMaxTensorBytes (checkRequest); what several ranks' rows add
  // up to may not be. Such a combination is the callers' doing, reported like a mismatch.
  const size_t esz = dataTypeSize(first->dtype);
  auto tooLarge = [&](const std::string& what, std::vector<std::pair<int, std::string>> rows,
                      const std::string& hint) {
    return fail(Code::kInvalidArgument,
                std::string(collectiveName(first->kind)) + " \"" + name + "\" in process set " +
                    opts_.setName + ": " + what + " would pass 2^63-1 bytes (rows of " +
                    trailingShape(*first) + "): " + describeDisagreement(rows) + ". " + hint);
  };
  if (first->kind == CollectiveKind::kAllgather) {
    resp.sizes.assign(opts_.size, 0);
    int64_t total = 0;
    bool overflow = false;
    std::vector<std::pair<int, std::string>> rows;
    for (const Request* q : present) {
      resp.sizes[q->rank] = q->shape[0];
      overflow |= __builtin_add_overflow(total, q->shape[0], &total);
      rows.push_back({global(q->rank), std::to_string(q->shape[0]) + " rows"});
    }
    resp.shape[0] = total;
    if (overflow || shapeOverflowDim(resp.shape, esz) >= 0)
      return tooLarge("the gathered tensor", rows,
                      "Gather fewer rows per call (split the tensor along dimension 0).");
  } else if (first->kind == CollectiveKind::kAlltoall) {
    // The splits were checked in onRequests (one per rank, >= 0, summing to dimension 0).
    resp.sizes.assign(static_cast<size_t>(opts_.size) * opts_.size, 0);
    for (const Request* q : present)
      for (int d = 0; d < opts_.size; ++d) resp.sizes[q->rank * opts_.size + d] = q->splits[d];
    // What each rank receives: its column of the matrix.
    for (int d = 0; d < opts_.size; ++d) {
      std::vector<int64_t> out = first->shape;
      bool overflow = false;
      out[0] = 0;
      std::vector<std::pair<int, std::string>> rows;
      for (const Request* q : present) {
        overflow |= __builtin_add_overflow(out[0], q->splits[d], &out[0]);
        rows.push_back({global(q->rank), std::to_string(q->splits[d]) + " rows for it"});
      }
      if (overflow || shapeOverflowDim(out, esz) >= 0)
        return tooLarge("what rank " + std::to_string(global(d)) + " receives", rows,
                        "Send fewer rows per call (split the tensor along dimension 0).");
    }
  }
  if (joined.empty() && first->device.kind == DeviceKind::kCpu) combineInline(present, &resp);
  return resp;
}

void Coordinator::combineInline(const std::vector<const Request*>& present, Response* resp) const {
  // Every rank whose data the result needs must have sent it: one without
  // leaves the whole collective to the data plane, where every rank still
  // holds its input. A rank with nothing to send (zero rows) sent all of it.
  auto sent = [](const Request* q) {
    return !q->payload.empty() || numElements(q->shape) == 0 || dataTypeSize(q->dtype) == 0;
  };
  // Present is sorted by rank (every rank, none joined): results are in rank order.
  std::string result;
  switch (resp->kind) {
    case ResponseKind::kAllreduce:
    case ResponseKind::kReducescatter: {
      for (const Request* q : present)
        if (q->payload.empty()) return;
      // Averaging divides on each rank after the sum (reductionOf), as the data plane does.
      const ReduceOp op = resp->op == ReduceOp::kAverage ? ReduceOp::kSum : resp->op;
      const ReduceFn reduce = reduceFunction(resp->dtype, op);
      if (!reduce || !reduceOpSupported(resp->op, resp->dtype)) return;
      const size_t n = present.front()->payload.size() / dataTypeSize(resp->dtype);
      result = present.front()->payload;
      for (size_t i = 1; i < present.size(); ++i)
        reduce(&result[0], result.data(), present[i]->payload.data(), n);
      break;
    }
    case ResponseKind::kBroadcast:
      for (const Request* q : present)
        if (q->rank == resp->root) result = q->payload;
      break;
    case ResponseKind::kAllgather:
    case ResponseKind::kAlltoall: {
      // The concatenation of every rank's tensor: an allgather's output, or
      // every alltoall block, from which each rank takes its column.
      size_t total = 0;
      for (const Request* q : present) {
        if (!sent(q)) return;
        total += q->payload.size();
      }
      // The response list repeats it to every rank: a result past the
      // per-tensor cap (ranks whose settings differ) takes the data plane.
      if (total > kMaxInlineBytes) return;
      result.reserve(total);
      for (const Request* q : present) result += q->payload;
      break;
    }
    default:
      return;
  }
  resp->inlineResult = std::move(result);
}

ResponseList Coordinator::emit(std::vector<std::vector<Response>>* resolved) {
  // Past the list's budget, inline results are dropped before fusion plans:
  // every rank still holds its input, so those tensors take the data plane.
  size_t inlineBytes = 0;
  for (auto& r : ready_)
    if (!r.inlineResult.empty() && (inlineBytes += r.inlineResult.size()) > kMaxInlineListBytes)
      r.inlineResult.clear();
  std::vector<std::vector<Response>> groups =
      planFusion(std::move(ready_), opts_.fusionThresholdBytes);
  ready_.clear();
  ResponseList list;
  list.groups.reserve(groups.size());
  for (auto& g : groups) {
    ResponseGroup wire;
    for (auto& resp : g) {
      ResponseItem item;
      int32_t bit = -1;
      if (cache_ && resp.cacheable()) {
        bit = cache_->lookup(resp.name, resp.signature);
        if (bit >= 0) {
          cache_->touch(static_cast<uint32_t>(bit));
        } else if (resp.inlineResult.empty()) {
          cache_->put(resp);
        } else {
          Response kept = resp;  // the cache keeps what was agreed, not this step's data
          kept.inlineResult.clear();
          cache_->put(kept);
        }
      }
      item.cacheBit = bit;
      if (bit < 0) {
        item.response = resp;
        item.response.inlineResult.clear();  // it travels as item.result
      }
      item.result = resp.inlineResult;
      wire.items.push_back(std::move(item));
    }
    list.groups.push_back(std::move(wire));
  }
  if (resolved) *resolved = std::move(groups);
  return list;
}

std::vector<int> Coordinator::missingRanks(const Pending& p) const {
  std::vector<int> missing;
  for (int r = 0; r < opts_.size; ++r)
    if (!p.byRank[r] && !joined_[r]) missing.push_back(global(r));
  return missing;
}

std::vector<std::string> Coordinator::inspectStalls(Clock::time_point now) {
  std::vector<std::string> warnings;
  std::vector<std::string> expired;
  for (auto& [name, p] : table_) {
    const Seconds waited = now - p.first;
    const Request& any =
        *std::find_if(p.byRank.begin(), p.byRank.end(), [](const auto& o) { return o.has_value(); })
             ->
             operator->();
    std::vector<int> have;
    for (int r = 0; r < opts_.size; ++r)
      if (p.byRank[r]) have.push_back(global(r));
    std::string report = std::string(collectiveName(any.kind)) + " \"" + name +
                         "\" in process set " + opts_.setName + " has waited " +
                         std::to_string(static_cast<int>(waited.count())) +
                         " s: submitted by ranks " + rankList(have) + ", missing on ranks " +
                         rankList(missingRanks(p));
    if (joinedCount_ > 0) {
      std::vector<int> j;
      for (int r = 0; r < opts_.size; ++r)
        if (joined_[r]) j.push_back(global(r));
      report += " (joined: " + rankList(j) + ")";
    }
    if (opts_.stallShutdown.count() > 0 && waited >= opts_.stallShutdown) {
      Response e;
      e.kind = ResponseKind::kError;
      e.name = name;
      e.errorCode = static_cast<int32_t>(Code::kTimeout);
      e.error = report + ". Failing it after HORA_STALL_SHUTDOWN_TIME_S=" +
                std::to_string(static_cast<int>(opts_.stallShutdown.count())) +
                ". The missing ranks never submitted it: look for rank-dependent control flow, "
                "uneven data (use join), or a rank that is stuck or slow.";
      ready_.push_back(e);
      expired.push_back(name);
      lastStallFailure_ = "\"" + name + "\" (missing on ranks " + rankList(missingRanks(p)) + ")";
    } else if (!p.warned && waited >= opts_.stallWarning) {
      p.warned = true;
      warnings.push_back(report + " (stall warning; fails after HORA_STALL_SHUTDOWN_TIME_S=" +
                         std::to_string(static_cast<int>(opts_.stallShutdown.count())) + ")");
    }
  }
  for (const auto& n : expired) table_.erase(n);
  return warnings;
}

std::string Coordinator::pendingSummary(size_t maxNames) const {
  if (table_.empty())
    return lastStallFailure_.empty() ? "no tensors pending"
                                     : "no tensors pending; the stall check had already failed " +
                                           lastStallFailure_ + " after HORA_STALL_SHUTDOWN_TIME_S";
  std::string s;
  size_t n = 0;
  for (const auto& [name, p] : table_) {
    if (n++ == maxNames) {
      s += ", ...";
      break;
    }
    if (!s.empty()) s += "; ";
    s += "\"" + name + "\" missing on ranks " + rankList(missingRanks(p));
  }
  return std::to_string(table_.size()) + " tensors pending: " + s;
}

std::string Coordinator::hangReport(Clock::time_point now, size_t maxTensors) const {
  if (table_.empty()) return "";
  // Oldest first: the first tensor nobody can get past is the cause.
  std::vector<const std::pair<const std::string, Pending>*> pending;
  for (const auto& kv : table_) pending.push_back(&kv);
  std::sort(pending.begin(), pending.end(),
            [](const auto* a, const auto* b) { return a->second.first < b->second.first; });
  auto secs = [now](Clock::time_point t) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f s", Seconds(now - t).count());
    return std::string(buf);
  };
  auto kindOf = [](const Pending& p) {
    for (const auto& o : p.byRank)
      if (o) return std::string(collectiveName(o->kind));
    return std::string("?");
  };
  std::string out = "hora hang report for process set " + opts_.setName + " (" +
                    std::to_string(opts_.size) + " ranks), written by its coordinator (rank " +
                    std::to_string(global(0)) + "): " + std::to_string(table_.size()) +
                    " tensors pending\n\nBy rank:\n";
  for (int r = 0; r < opts_.size; ++r) {
    std::string waits, never;
    size_t nw = 0, nn = 0;
    for (const auto* kv : pending) {
      const Pending& p = kv->second;
      const std::string t = kindOf(p) + " \"" + kv->first + "\"";
      if (p.byRank[r]) {
        if (nw++ < 3) waits += (waits.empty() ? "" : ", ") + t;
      } else if (!joined_[r]) {
        if (nn++ < 3)
          never += (never.empty() ? "" : ", ") + t + " (others waiting " + secs(p.first) + ")";
      }
    }
    out += "  rank " + std::to_string(global(r)) + ": ";
    if (joined_[r]) out += "joined (contributes nothing until the others join); ";
    if (nw)
      out +=
          "stuck waiting in " + waits + (nw > 3 ? " and " + std::to_string(nw - 3) + " more" : "");
    if (nw && nn) out += "; ";
    if (nn)
      out +=
          "never submitted " + never + (nn > 3 ? " and " + std::to_string(nn - 3) + " more" : "");
    if (!nw && !nn) out += "nothing pending";
    out += "\n";
  }
  out += "\nBy tensor (oldest first):\n";
  size_t n = 0;
  for (const auto* kv : pending) {
    if (n++ == maxTensors) {
      out += "  ... " + std::to_string(pending.size() - maxTensors) + " more\n";
      break;
    }
    const Pending& p = kv->second;
    std::vector<int> have;
    const Request* any = nullptr;
    for (int r = 0; r < opts_.size; ++r)
      if (p.byRank[r]) {
        have.push_back(global(r));
        if (!any) any = &*p.byRank[r];
      }
    out += "  " + (any ? any->describe() : kv->first) + ": waiting " + secs(p.first) +
           "; submitted by ranks " + rankList(have) + "; missing on ranks " +
           rankList(missingRanks(p)) + "\n";
  }
  const auto& oldest = pending.front()->second;
  out += "\nLikely cause: ranks " + rankList(missingRanks(oldest)) + " never submitted \"" +
         pending.front()->first +
         "\", the oldest pending tensor: look at their stack (py-spy dump, gdb) and flight "
         "recorder dumps for what they do instead (rank-dependent control flow, uneven data: "
         "use join, a slow or stuck data loader).\n";
  return out;
}

std::vector<std::vector<Response>> planFusion(std::deque<Response> ready, int64_t thresholdBytes) {
  std::vector<std::vector<Response>> groups;
  std::vector<std::pair<size_t, int64_t>> open;  // (group index, bytes) of fusable groups
  for (auto& r : ready) {
    if (!r.fusable() || thresholdBytes <= 0 || r.byteSize() >= thresholdBytes) {
      groups.push_back({std::move(r)});
      continue;
    }
    FusionKey key = keyOf(r);
    bool placed = false;
    // Look back over open groups with the same key (Horovod's look-ahead:
    // mixed-precision tensors interleave without breaking fusion).
    for (auto& [gi, bytes] : open) {
      // bytes <= thresholdBytes, so the subtraction cannot overflow (a sum could).
      if (keyOf(groups[gi].front()) == key && r.byteSize() <= thresholdBytes - bytes) {
        bytes += r.byteSize();
        groups[gi].push_back(std::move(r));
        placed = true;
        break;
      }
    }
    if (!placed) {
      open.push_back({groups.size(), r.byteSize()});
      groups.push_back({std::move(r)});
    }
  }
  return groups;
}

}  // namespace hora
