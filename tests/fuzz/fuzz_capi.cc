// Fuzz target: the C ABI's argument checks, through the public entry points
// (hora.h) of a one-rank runtime: every collective and point-to-point call
// with a DLTensor (device, dtype, ndim, shape, strides, byte offset, data)
// and options (struct size, name, op, scales, root, splits) drawn from the
// input. Whatever the arguments, a call returns a documented status with a
// message, or succeeds and its request completes; nothing crashes, hangs or
// leaks a request.
//
// The one thing a caller must get right and hora cannot check is that the
// data pointer covers the declared bytes. So a call whose tensors would be
// valid but larger than this target's buffer is not made; a shape whose
// byte size overflows int64 is always passed, since hora must refuse it
// before reading anything.
#include <dlpack/dlpack.h>
#include <hora/hora.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_target.h"

namespace {

constexpr size_t kBufferBytes = 1 << 16;

// Bytes of the input, consumed front to back; zeros once they run out.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  uint8_t u8() { return p_ < end_ ? *p_++ : 0; }
  uint64_t u64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = (v << 8) | u8();
    return v;
  }
  std::string text(size_t n) {
    std::string s;
    for (size_t i = 0; i < n; ++i) s.push_back(static_cast<char>(u8()));
    return s;
  }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

// A dimension: mostly small, sometimes a value chosen to break arithmetic.
int64_t dimension(Reader& r) {
  static const int64_t kEdges[] = {0,
                                   1,
                                   -1,
                                   2,
                                   3,
                                   7,
                                   int64_t{1} << 31,
                                   int64_t{1} << 32,
                                   int64_t{1} << 40,
                                   int64_t{1} << 62,
                                   (int64_t{1} << 62) + 1,
                                   std::numeric_limits<int64_t>::max(),
                                   std::numeric_limits<int64_t>::min()};
  uint8_t k = r.u8();
  if (k < 160) return k % 9;
  if (k < 240) return kEdges[k % (sizeof(kEdges) / sizeof(kEdges[0]))];
  return static_cast<int64_t>(r.u64());
}

double scale(Reader& r) {
  static const double kScales[] = {1.0, 0.5, -2.0, 0.0, NAN, INFINITY, -INFINITY, 1e300, 1e-300};
  return kScales[r.u8() % (sizeof(kScales) / sizeof(kScales[0]))];
}

// Bytes the tensor declares, or -1 when the count or size overflows (hora
// must refuse those) or a dimension is negative.
int64_t declaredBytes(const DLTensor& t) {
  if (t.ndim < 0 || t.ndim > 64 || (t.ndim > 0 && !t.shape)) return -1;
  int64_t bytes = (t.dtype.bits + 7) / 8 * std::max<int64_t>(t.dtype.lanes, 1);
  for (int i = 0; i < t.ndim; ++i) {
    if (t.shape[i] < 0) return -1;
    if (t.shape[i] != 0 && bytes > std::numeric_limits<int64_t>::max() / t.shape[i]) return -1;
    bytes *= t.shape[i];
  }
  return bytes;
}

struct FuzzTensor {
  DLTensor t{};
  std::vector<int64_t> shape, strides;
};

void drawTensor(Reader& r, char* buffer, FuzzTensor* f) {
  // 6: kDLBool (DLPack 0.8; Debian ships 0.6)
  static const uint8_t kCodes[] = {kDLInt, kDLUInt, kDLFloat, kDLBfloat, 6, kDLComplex, 99};
  static const uint8_t kBits[] = {8, 16, 32, 64, 1, 0, 128};
  static const DLDeviceType kDevices[] = {kDLCPU, kDLCPU, kDLCPU, kDLCUDAHost, kDLCUDA, kDLOpenCL};
  DLTensor& t = f->t;
  t.device.device_type = kDevices[r.u8() % (sizeof(kDevices) / sizeof(kDevices[0]))];
  t.device.device_id = static_cast<int8_t>(r.u8());
  t.dtype.code = kCodes[r.u8() % sizeof(kCodes)];
  t.dtype.bits = kBits[r.u8() % sizeof(kBits)];
  t.dtype.lanes = (r.u8() & 7) == 7 ? 2 : 1;
  uint8_t nd = r.u8();
  t.ndim = nd < 200 ? nd % 5 : (nd < 250 ? 33 + nd % 4 : -1 - nd % 3);
  f->shape.clear();
  for (int i = 0; i < std::max(t.ndim, 0) && i < 40; ++i) f->shape.push_back(dimension(r));
  uint8_t layout = r.u8();
  t.shape = (layout & 0x40) && t.ndim > 0 ? nullptr : f->shape.data();
  f->strides.assign(f->shape.size(), 1);
  int64_t expect = 1;
  for (int i = static_cast<int>(f->shape.size()) - 1; i >= 0; --i) {
    f->strides[i] = (layout & 0x10) ? dimension(r) : expect;  // compact, or garbage
    if (expect < (int64_t{1} << 40))  // this target's own product must not overflow
      expect *= f->shape[i] > 0 && f->shape[i] < 1000 ? f->shape[i] : 1;
  }
  t.strides = (layout & 0x01) ? f->strides.data() : nullptr;
  t.data = (layout & 0x80) ? nullptr : buffer;
  t.byte_offset = (layout & 0x20) ? r.u8() : 0;
}

// Valid-looking and larger than the buffer: making the call would read past it.
bool tooBigToPass(const DLTensor& t) {
  int64_t bytes = declaredBytes(t);
  return bytes >= 0 && static_cast<uint64_t>(bytes) + t.byte_offset > kBufferBytes;
}

hora_runtime_t runtime() {
  static hora_runtime_t rt = [] {
    hora_config_t c;
    hora_config_init(&c);
    c.rank = 0;
    c.size = 1;
    c.log_level = "off";
    c.stall_shutdown_time_s = 30;
    hora_runtime_t out = nullptr;
    if (hora_init(&c, &out) != HORA_SUCCESS) {
      std::fprintf(stderr, "fuzz_capi: hora_init failed: %s\n", hora_last_error_message());
      std::abort();
    }
    return out;
  }();
  return rt;
}

void finish(hora_status_t s, hora_request_t req) {
  if (s != HORA_SUCCESS) {
    const char* msg = hora_last_error_message();
    HORA_FUZZ_CHECK(msg != nullptr && msg[0] != '\0');  // every refusal says why
    HORA_FUZZ_CHECK(req == nullptr);                    // and creates no request
    return;
  }
  HORA_FUZZ_CHECK(req != nullptr);
  // One rank: every accepted collective completes, well within this bound.
  hora_status_t w = hora_wait(req, 20.0);
  HORA_FUZZ_CHECK(w != HORA_ERR_TIMEOUT);
  HORA_FUZZ_CHECK(hora_request_free(req) == HORA_SUCCESS);
}

}  // namespace

std::vector<std::string> horaFuzzSeeds() {
  // In drawTensor's byte order: call, device, device id, dtype code index,
  // bits index, lanes, ndim, dimensions, layout; then 1 = in place.
  auto seed = [](uint8_t call, uint8_t code, uint8_t bits, std::vector<uint8_t> dims,
                 uint8_t layout) {
    std::string s{
        static_cast<char>(call),       0, 0, static_cast<char>(code), static_cast<char>(bits), 1,
        static_cast<char>(dims.size())};
    for (uint8_t d : dims) s.push_back(static_cast<char>(d));
    s.push_back(static_cast<char>(layout));
    s.push_back(1);
    return s;
  };
  return {
      seed(0, 2, 2, {4}, 0),         // allreduce float32 [4]
      seed(0, 2, 2, {2, 3}, 1),      // with compact strides
      seed(1, 0, 3, {4, 2}, 0),      // allgather int64
      seed(2, 1, 0, {7}, 0x20),      // broadcast uint8 at an offset
      seed(3, 2, 2, {4}, 0),         // alltoall
      seed(4, 3, 1, {6}, 0),         // reducescatter bfloat16
      seed(5, 2, 2, {4}, 0),         // send
      seed(6, 2, 2, {4}, 0),         // recv
      seed(7, 2, 3, {3}, 0),         // grouped allreduce float64
      seed(0, 2, 2, {169, 4}, 0),    // 2^62 + 1 x 4 float32: wraps
      seed(0, 2, 2, {168, 168}, 0),  // 2^40 x 2^40
      seed(0, 2, 2, {2, 2}, 0x11),   // garbage strides
      seed(0, 2, 2, {0}, 0xa0),      // empty, NULL data, a byte offset (UB once, under UBSan)
      seed(0, 2, 2, {4}, 0x20),      // float32 at byte_offset 1: misaligned, refused
  };
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static char* buffer = new char[kBufferBytes]();
  static char* outBuffer = new char[kBufferBytes]();
  static uint64_t calls = 0;
  Reader r(data, size);
  uint8_t call = r.u8() % 8;
  FuzzTensor in, out;
  drawTensor(r, buffer, &in);
  const bool inPlace = (r.u8() & 1) != 0;
  if (!inPlace) drawTensor(r, outBuffer, &out);

  hora_options_t o;
  hora_options_init(&o);
  uint8_t of = r.u8();
  if (of & 0x01) o.struct_size = r.u8();  // too small, or an unknown bigger version
  o.op = static_cast<hora_reduce_op_t>(static_cast<int8_t>(r.u8()));
  if (of & 0x02) o.prescale = scale(r);
  if (of & 0x04) o.postscale = scale(r);
  o.root = static_cast<int8_t>(r.u8());
  std::string name;
  if (of & 0x08) {
    name = r.text(r.u8() % 40);
  } else {
    name = "fuzz." + std::to_string(calls++);  // a fresh name: an old one may still be in flight
  }
  o.name = (of & 0x10) ? nullptr : name.c_str();
  const int32_t peer = static_cast<int8_t>(r.u8());
  const int64_t tag = static_cast<int64_t>(r.u64());

  if (tooBigToPass(in.t) || (!inPlace && tooBigToPass(out.t))) return 0;

  hora_runtime_t rt = runtime();
  hora_request_t req = nullptr;
  hora_status_t s;
  switch (call) {
    case 0:
      s = hora_allreduce_async(rt, &in.t, inPlace ? &in.t : &out.t, &o, &req);
      break;
    case 1:
      s = hora_allgather_async(rt, &in.t, &o, &req);
      break;
    case 2:
      s = hora_broadcast_async(rt, &in.t, &o, &req);
      break;
    case 3: {
      int64_t splits[2] = {dimension(r), dimension(r)};
      int32_t n = static_cast<int8_t>(r.u8()) % 3;
      s = hora_alltoall_async(rt, &in.t, (of & 0x20) ? nullptr : splits, n, &o, &req);
      break;
    }
    case 4:
      s = hora_reducescatter_async(rt, &in.t, &o, &req);
      break;
    case 5:
      s = hora_send_async(rt, &in.t, peer, tag, &o, &req);
      break;
    case 6:
      s = hora_recv_async(rt, (of & 0x40) ? nullptr : &in.t, peer, tag, &o, &req);
      break;
    default: {
      // n may be negative, zero, or more than the tensors drawn (repeated)
      DLTensor* second = inPlace ? &in.t : &out.t;
      const DLTensor* ins[3] = {&in.t, second, &in.t};
      DLTensor* outs[3] = {&in.t, second, &in.t};
      int32_t n = static_cast<int8_t>(r.u8()) % 4;
      s = hora_grouped_allreduce_async(rt, n, ins, outs, &o, &req);
      break;
    }
  }
  // A send or receive to ourselves (the only peer of a one-rank set) that was
  // accepted would wait for its partner: post the partner, as a user would.
  if (s == HORA_SUCCESS && (call == 5 || call == 6)) {
    int32_t done = 0;
    hora_test(req, &done);
    if (!done) {
      std::vector<char> echo(kBufferBytes);
      DLTensor partner = in.t;
      partner.data = echo.data();
      partner.byte_offset = 0;
      hora_request_t other = nullptr;
      hora_options_t po;
      hora_options_init(&po);
      hora_status_t ps = call == 5 ? hora_recv_async(rt, nullptr, peer, tag, &po, &other)
                                   : hora_send_async(rt, &partner, peer, tag, &po, &other);
      finish(ps, other);
    }
  }
  finish(s, req);
  return 0;
}
