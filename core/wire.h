// Bounds-checked little-endian byte encoding for hora's own messages: the
// control plane, the coordinator protocol and the store's wire
// (core/tcp_store_wire.h). One codec, one byte order.
//
// Every read checks the remaining length first, so a truncated or hostile
// buffer yields a kProtocolError naming the field, never an out-of-bounds
// read. Pure value types; no threads.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/status.h"

namespace hora {

class ByteWriter {
 public:
  void u8(uint8_t v) { buf_.push_back(static_cast<char>(v)); }
  void u32(uint32_t v) { raw(&v, 4); }
  void i32(int32_t v) { raw(&v, 4); }
  void u64(uint64_t v) { raw(&v, 8); }
  void i64(int64_t v) { raw(&v, 8); }
  void f64(double v) { raw(&v, 8); }
  void str(const std::string& s) {
    u32(static_cast<uint32_t>(s.size()));
    buf_.append(s);
  }
  void i64s(const std::vector<int64_t>& v) {
    u32(static_cast<uint32_t>(v.size()));
    raw(v.data(), v.size() * 8);
  }
  void i32s(const std::vector<int32_t>& v) {
    u32(static_cast<uint32_t>(v.size()));
    raw(v.data(), v.size() * 4);
  }
  std::string& buffer() { return buf_; }
  std::string take() { return std::move(buf_); }

 private:
  void raw(const void* p, size_t n) { buf_.append(static_cast<const char*>(p), n); }
  std::string buf_;
};

class ByteReader {
 public:
  ByteReader(const char* data, size_t size) : p_(data), end_(data + size) {}
  explicit ByteReader(const std::string& s) : ByteReader(s.data(), s.size()) {}

  Status u8(uint8_t* v, const char* what) { return raw(v, 1, what); }
  Status u32(uint32_t* v, const char* what) { return raw(v, 4, what); }
  Status i32(int32_t* v, const char* what) { return raw(v, 4, what); }
  Status u64(uint64_t* v, const char* what) { return raw(v, 8, what); }
  Status i64(int64_t* v, const char* what) { return raw(v, 8, what); }
  Status f64(double* v, const char* what) { return raw(v, 8, what); }
  Status str(std::string* s, const char* what, size_t maxLen = 1 << 20) {
    uint32_t n = 0;
    HORA_RETURN_IF_ERROR(u32(&n, what));
    if (n > maxLen || n > remaining()) return tooShort(what, n);
    s->assign(p_, n);
    p_ += n;
    return Status::ok();
  }
  Status i64s(std::vector<int64_t>* v, const char* what, size_t maxCount = 1 << 24) {
    uint32_t n = 0;
    HORA_RETURN_IF_ERROR(u32(&n, what));
    if (n > maxCount || static_cast<size_t>(n) * 8 > remaining()) return tooShort(what, n);
    v->resize(n);
    if (n) std::memcpy(v->data(), p_, static_cast<size_t>(n) * 8);
    p_ += static_cast<size_t>(n) * 8;
    return Status::ok();
  }
  Status i32s(std::vector<int32_t>* v, const char* what, size_t maxCount = 1 << 24) {
    uint32_t n = 0;
    HORA_RETURN_IF_ERROR(u32(&n, what));
    if (n > maxCount || static_cast<size_t>(n) * 4 > remaining()) return tooShort(what, n);
    v->resize(n);
    if (n) std::memcpy(v->data(), p_, static_cast<size_t>(n) * 4);
    p_ += static_cast<size_t>(n) * 4;
    return Status::ok();
  }
  // `n` raw bytes (n checked against what is left).
  Status bytes(std::string* s, size_t n, const char* what) {
    if (n > remaining()) return tooShort(what, n);
    s->assign(p_, n);
    p_ += n;
    return Status::ok();
  }
  size_t remaining() const { return static_cast<size_t>(end_ - p_); }
  bool done() const { return p_ == end_; }

 private:
  Status raw(void* v, size_t n, const char* what) {
    if (remaining() < n) return tooShort(what, n);
    std::memcpy(v, p_, n);
    p_ += n;
    return Status::ok();
  }
  Status tooShort(const char* what, size_t n) const {
    return protocolError(std::string("message truncated or corrupt while reading ") + what + " (" +
                         std::to_string(n) + " units wanted, " + std::to_string(remaining()) +
                         " bytes left)");
  }
  const char* p_;
  const char* end_;
};

}  // namespace hora
