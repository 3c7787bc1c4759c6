// What both point-to-point benches time (hora-p2p-bench, p2p_bench.cc, and
// hora-mpi-p2p-bench, p2p_interleaved_bench.cc): a 1-D uint8 CPU tensor over
// a caller's buffer, and a blocking send or receive through hora's C ABI
// (post, hora_wait, free), so that both measure the same calls.
// Header-only; main thread.
#pragma once

#include <hora/hora.h>

#include <cstdint>

#include "bench_util.h"

namespace p2p_bench {

struct ByteTensor : bench_util::Tensor1d {
  ByteTensor(void* data, size_t bytes) : Tensor1d(data, bytes, DLDataType{kDLUInt, 8, 1}) {}
};

inline hora_request_t postRecv(const bench_util::Who& who, hora_runtime_t rt, ByteTensor& b,
                               int peer, int64_t tag) {
  hora_request_t r = nullptr;
  bench_util::check(who, hora_recv_async(rt, &b.t, peer, tag, nullptr, &r), "hora_recv_async");
  return r;
}

inline void sendWait(const bench_util::Who& who, hora_runtime_t rt, ByteTensor& b, int peer,
                     int64_t tag) {
  hora_request_t r = nullptr;
  bench_util::check(who, hora_send_async(rt, &b.t, peer, tag, nullptr, &r), "hora_send_async");
  bench_util::check(who, hora_wait(r, -1), "hora_wait (send)");
  hora_request_free(r);
}

inline void recvWait(const bench_util::Who& who, hora_runtime_t rt, ByteTensor& b, int peer,
                     int64_t tag) {
  hora_request_t r = postRecv(who, rt, b, peer, tag);
  bench_util::check(who, hora_wait(r, -1), "hora_wait (recv)");
  hora_request_free(r);
}

}  // namespace p2p_bench
