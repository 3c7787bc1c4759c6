// Fakes for the runtime's parts, used by the unit tests of the executor,
// the set controller and the point-to-point engine: a RequestSink that records what the threads
// hand back, and a Backend whose collectives are scripted (a fixed "peer contribution", injected
// failures) so a test knows every element of the expected result.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/tensor_entry.h"

namespace hora {
namespace {

using namespace std::chrono_literals;

// Records completions, outputs, splits and the joined rank; waitable.
class RecordingSink : public RequestSink {
 public:
  Result<void*> allocateOutput(const std::vector<int64_t>& shape, DataType dtype,
                               const Device& device, DeviceMemory*) override {
    std::lock_guard<std::mutex> lk(mu_);
    shape_ = shape;
    dtype_ = dtype;
    ++allocations_;
    if (!allocError_.isOk()) return allocError_;
    output_.assign(static_cast<size_t>(numElements(shape)) * dataTypeSize(dtype) + 1, 0);
    return static_cast<void*>(output_.data());
  }
  void setReceivedSplits(std::vector<int64_t> rows) override {
    std::lock_guard<std::mutex> lk(mu_);
    splits_ = std::move(rows);
  }
  void setLastJoinedRank(int32_t rank) override {
    std::lock_guard<std::mutex> lk(mu_);
    lastJoined_ = rank;
  }
  void completeEntry(const Status& s) override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      ++completions_;
      status_ = s;
    }
    cv_.notify_all();
  }

  void failAllocations(Status why) { allocError_ = std::move(why); }
  // Waits for the first completion; false after `timeout`.
  bool waitDone(std::chrono::milliseconds timeout = 10s) {
    std::unique_lock<std::mutex> lk(mu_);
    return cv_.wait_for(lk, timeout, [&] { return completions_ > 0; });
  }
  bool done() {
    std::lock_guard<std::mutex> lk(mu_);
    return completions_ > 0;
  }
  Status status() {
    std::lock_guard<std::mutex> lk(mu_);
    return status_;
  }
  int completions() {
    std::lock_guard<std::mutex> lk(mu_);
    return completions_;
  }
  int allocations() {
    std::lock_guard<std::mutex> lk(mu_);
    return allocations_;
  }
  std::vector<int64_t> shape() {
    std::lock_guard<std::mutex> lk(mu_);
    return shape_;
  }
  DataType dtype() {  // of the last allocation
    std::lock_guard<std::mutex> lk(mu_);
    return dtype_;
  }
  std::vector<int64_t> splits() {
    std::lock_guard<std::mutex> lk(mu_);
    return splits_;
  }
  int32_t lastJoined() {
    std::lock_guard<std::mutex> lk(mu_);
    return lastJoined_;
  }
  template <typename T>
  std::vector<T> output() {
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<T> v((output_.size() - 1) / sizeof(T));
    if (!v.empty()) std::memcpy(v.data(), output_.data(), v.size() * sizeof(T));
    return v;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int completions_ = 0;
  int allocations_ = 0;
  Status status_;
  Status allocError_;
  std::vector<char> output_;
  std::vector<int64_t> shape_, splits_;
  DataType dtype_ = DataType::kUint8;
  int32_t lastJoined_ = -1;
};

// An entry of `kind` named `name` over `in`/`out`, completing into `sink`.
inline EntryPtr makeEntry(CollectiveKind kind, const std::string& name, DataType dtype,
                          std::vector<int64_t> shape, const void* in, void* out,
                          std::shared_ptr<RecordingSink> sink) {
  auto e = std::make_shared<TensorEntry>();
  e->request.kind = kind;
  e->request.name = name;
  e->request.dtype = dtype;
  e->request.shape = std::move(shape);
  e->in = in;
  e->out = out;
  e->sink = std::move(sink);
  return e;
}

// The response every rank would get for `e`'s request (no joined ranks).
inline Response responseFor(const TensorEntry& e) {
  Response r;
  r.kind = static_cast<ResponseKind>(e.request.kind);
  r.name = e.request.name;
  r.dtype = e.request.dtype;
  r.op = e.request.op;
  r.device = e.request.device;
  r.root = e.request.root;
  r.prescale = e.request.prescale;
  r.postscale = e.request.postscale;
  r.shape = e.request.shape;
  r.signature = e.request.signature();
  return r;
}

// A float32 backend standing in for a set of two ranks: the "other rank"
// contributes `peer` to every element of a sum. It records what this rank
// contributed (after pack) and fails on request.
class FakeBackend : public Backend {
 public:
  explicit FakeBackend(int rank = 0, int size = 2) : rank_(rank), size_(size) {}
  std::string name() const override { return "fake"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  Status allreduce(void* data, size_t count, DataType dtype, ReduceOp op) override {
    std::lock_guard<std::mutex> lk(mu_);
    ++calls_;
    if (!failWith_.isOk()) return failWith_;
    if (dtype != DataType::kFloat32 || op != ReduceOp::kSum)
      return Status(Code::kNotSupported, "fake backend: float32 sums only");
    auto* f = static_cast<float*>(data);
    contributed_.assign(f, f + count);
    for (size_t i = 0; i < count; ++i) f[i] += peer_;
    return Status::ok();
  }
  Status allgatherv(const void* in, void* out, const std::vector<size_t>& counts,
                    DataType dtype) override {
    std::lock_guard<std::mutex> lk(mu_);
    ++calls_;
    if (!failWith_.isOk()) return failWith_;
    // This rank's part from `in`, every other rank's filled with `peer`.
    size_t at = 0;
    const size_t esz = dataTypeSize(dtype);
    for (size_t r = 0; r < counts.size(); ++r) {
      char* dst = static_cast<char*>(out) + at * esz;
      if (static_cast<int>(r) == rank_) {
        if (counts[r]) std::memcpy(dst, in, counts[r] * esz);
      } else {
        for (size_t i = 0; i < counts[r]; ++i) reinterpret_cast<float*>(dst)[i] = peer_;
      }
      at += counts[r];
    }
    return Status::ok();
  }
  Status broadcast(void*, size_t, DataType, int) override { return record(); }
  Status alltoallv(const void* in, const std::vector<int64_t>& send, void* out,
                   const std::vector<int64_t>& recv, DataType dtype) override {
    return record();
  }
  Status reducescatter(void* inout, const std::vector<size_t>& counts, DataType dtype,
                       ReduceOp op) override {
    return record();
  }
  Status barrier() override { return record(); }
  void abort() noexcept override { aborted_ = true; }

  void failWith(Status s) {
    std::lock_guard<std::mutex> lk(mu_);
    failWith_ = std::move(s);
  }
  int calls() {
    std::lock_guard<std::mutex> lk(mu_);
    return calls_;
  }
  std::vector<float> contributed() {
    std::lock_guard<std::mutex> lk(mu_);
    return contributed_;
  }
  bool aborted() const { return aborted_; }
  float peer_ = 1.0f;

 private:
  Status record() {
    std::lock_guard<std::mutex> lk(mu_);
    ++calls_;
    return failWith_;
  }
  const int rank_, size_;
  std::mutex mu_;
  int calls_ = 0;
  Status failWith_;
  std::vector<float> contributed_;
  std::atomic<bool> aborted_{false};
};

}  // namespace
}  // namespace hora
