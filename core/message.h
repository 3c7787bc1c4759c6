// The coordinator protocol's messages and their binary encoding.
//
// Rank r's control thread sends a RequestList to its process set's
// coordinator; the coordinator answers every rank with the same ResponseList
// (the total order in which all ranks execute). Steady state travels as cache
// references: a CacheHit names a response-cache bit plus a signature hash of
// the request, and a ResponseItem may be just a bit; see
// core/response_cache.h for why that is safe.
//
// Encoding: a magic/version byte, then fields in order (core/wire.h). Decoding
// validates enum ranges and lengths and returns kProtocolError on anything
// malformed. Pure values; no threads.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tuning.h"
#include "core/types.h"

namespace hora {

// 2: payloads in requests and cache hits, results in response items (3: of
// every collective but barrier and join, not only allreduce).
constexpr uint8_t kWireVersion = 3;

// The most bytes a collective's result may carry inside its negotiation
// (hard cap of HORA_INLINE_MAX_BYTES): the coordinator holds every rank's
// copy, and each response list repeats the result to every rank.
constexpr size_t kMaxInlineBytes = 64 * 1024;
// The most inline bytes (payloads, or results) one request or response list
// carries: far below the control plane's frame limit (64 MiB), and small
// enough that a list never holds heartbeats back for long. Tensors past it
// go without their data and take the data plane.
constexpr size_t kMaxInlineListBytes = size_t{8} << 20;

// What one rank submitted for one tensor.
struct Request {
  int32_t rank = 0;  // rank within the process set
  CollectiveKind kind = CollectiveKind::kAllreduce;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  Device device;
  int32_t root = 0;
  double prescale = 1.0;
  double postscale = 1.0;
  std::string name;
  std::vector<int64_t> shape;
  std::vector<int64_t> splits;  // alltoall: rows sent to each rank
  // This rank's input (prescaled for a reduction; a broadcast's from its
  // root only), when the collective is small enough to travel inside the
  // negotiation (HORA_INLINE_MAX_BYTES); empty otherwise. The coordinator
  // combines the payloads itself when every rank sent one, and the tensor
  // then needs no data plane (see ResponseItem::result).
  std::string payload;

  // Hash of every field but rank and payload: equal requests from two ranks hash equal.
  uint64_t signature() const;
  // "allreduce "name": float32[4,3] op=sum"
  std::string describe() const;
};

struct CacheHit {
  CacheHit() = default;
  CacheHit(uint32_t b, uint64_t sig, std::string data = std::string())
      : bit(b), signature(sig), payload(std::move(data)) {}
  uint32_t bit = 0;
  uint64_t signature = 0;
  std::string payload;  // as Request::payload
};

struct RequestList {
  std::vector<Request> requests;
  std::vector<CacheHit> hits;
};

enum class ResponseKind : uint8_t {
  kAllreduce = 0,
  kAllgather = 1,
  kBroadcast = 2,
  kAlltoall = 3,
  kReducescatter = 4,
  kBarrier = 5,
  kJoin = 6,
  kError = 7,
};

// What every rank runs for one tensor (or, for kJoin/kBarrier, one event).
struct Response {
  ResponseKind kind = ResponseKind::kAllreduce;
  std::string name;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  Device device;
  int32_t root = 0;
  double prescale = 1.0;
  double postscale = 1.0;
  // allreduce/broadcast/reducescatter: the tensor's shape (same on all ranks).
  // allgather: shape of rank 0's tensor with dim 0 replaced by the total.
  std::vector<int64_t> shape;
  // allgather: dim 0 of each rank. alltoall: size*size matrix, entry
  // [src*size+dst] = rows src sends to dst.
  std::vector<int64_t> sizes;
  // Ranks that have joined and contribute the op's identity / nothing.
  std::vector<int32_t> joined;
  int32_t lastJoinedRank = -1;  // kJoin
  int32_t errorCode = 0;        // kError: a hora::Code value
  std::string error;            // kError: the message every rank reports
  uint64_t signature = 0;       // Request::signature() of the requests it answers
  // In memory only (the wire carries it as ResponseItem::result): what the
  // coordinator combined from the ranks' payloads, in rank order: an
  // allreduce's or reducescatter's whole reduction (before postscale and
  // averaging), a broadcast's tensor, an allgather's output, or every
  // alltoall tensor one after another. Such a response needs no data plane
  // and is never fused.
  std::string inlineResult;

  bool fusable() const { return kind == ResponseKind::kAllreduce && inlineResult.empty(); }
  bool cacheable() const {
    return (kind == ResponseKind::kAllreduce || kind == ResponseKind::kBroadcast ||
            kind == ResponseKind::kReducescatter) &&
           joined.empty();
  }
  // Only for a shape within kMaxTensorBytes (core/types.h): the coordinator builds
  // responses from checked requests, workers check what they decode
  // (SetController::validateResponse) before anything computes with it.
  int64_t numElements() const;
  int64_t byteSize() const { return numElements() * static_cast<int64_t>(dataTypeSize(dtype)); }
};

// One item of a fused group: a full response, or a reference to a cached one.
struct ResponseItem {
  ResponseItem() = default;
  ResponseItem(int32_t bit, Response r, std::string res = std::string())
      : cacheBit(bit), response(std::move(r)), result(std::move(res)) {}
  int32_t cacheBit = -1;  // >= 0: take the response from the cache
  Response response;      // when cacheBit < 0
  std::string result;     // Response::inlineResult, for a cached response too
};

// Responses executed as one collective (one fused buffer).
struct ResponseGroup {
  std::vector<ResponseItem> items;
};

struct ResponseList {
  std::vector<ResponseGroup> groups;
  // Autotune (core/autotune.h): new values every rank applies before the
  // first data-plane group of this list (or of a later one, when this list
  // has none). Encoded after the groups only when present.
  std::optional<TuningValues> tuning;
};

std::string encode(const RequestList& list);
Status decode(const std::string& bytes, RequestList* out);
std::string encode(const ResponseList& list);
// A stale-hit notice to one rank: resend these requests in full. Encoded as a
// RequestList carrying only hits (the control plane's frame type tells them apart).
Status decode(const std::string& bytes, ResponseList* out);

// Field-level helpers, exposed for unit tests.
void encodeRequest(class ByteWriter& w, const Request& r);
Status decodeRequest(class ByteReader& r, Request* out);
void encodeResponse(class ByteWriter& w, const Response& r);
Status decodeResponse(class ByteReader& r, Response* out);

}  // namespace hora
