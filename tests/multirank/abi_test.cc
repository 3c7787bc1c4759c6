// Bad input through the C ABI: every misuse returns an error status with a
// message on the calling thread, crashes nothing, and leaves the runtime
// working. Also the process-mode sweep (ranks as forked processes).
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "rank_harness.h"
#include "tensor_util.h"

using namespace htest;

namespace {

#define EXPECT_ERR(call, code)                                                             \
  do {                                                                                     \
    hora_status_t s_ = (call);                                                             \
    EXPECT_EQ(s_, code) << #call << ": " << hora_last_error_message();                     \
    EXPECT_GT(std::strlen(hora_last_error_message()), 10u) << #call << " gave no message"; \
  } while (0)

TEST(Abi, CallsWithoutARuntime) {
  int32_t v;
  hora_request_t req;
  std::vector<int64_t> shape = {4};
  float data[4] = {1, 2, 3, 4};
  DLTensor t = makeTensor(data, dlType(kDLFloat, 32), &shape);
  EXPECT_ERR(hora_rank(nullptr, &v), HORA_ERR_NOT_INITIALIZED);
  EXPECT_ERR(hora_allreduce_async(nullptr, &t, &t, nullptr, &req), HORA_ERR_NOT_INITIALIZED);
  EXPECT_ERR(hora_init(nullptr, nullptr), HORA_ERR_INVALID_ARGUMENT);
  hora_config_t c;
  std::memset(&c, 0, sizeof(c));  // not initialized with hora_config_init
  hora_runtime_t rt;
  EXPECT_ERR(hora_init(&c, &rt), HORA_ERR_INVALID_ARGUMENT);
  EXPECT_ERR(hora_init_versioned(nullptr, &rt, HORA_VERSION_MAJOR + 1, 0), HORA_ERR_INVALID_USAGE);
  hora_request_s* bogus = reinterpret_cast<hora_request_s*>(data);  // not a request
  EXPECT_ERR(hora_wait(bogus, 0), HORA_ERR_INVALID_ARGUMENT);
  EXPECT_ERR(hora_request_free(bogus), HORA_ERR_INVALID_ARGUMENT);
  EXPECT_STRNE(hora_status_string(HORA_ERR_REMOTE), hora_status_string(HORA_ERR_TIMEOUT));
  EXPECT_STREQ(hora_status_string(12345), "unknown status code");
  int32_t ma, mi, pa;
  hora_get_version(&ma, &mi, &pa);
  EXPECT_EQ(ma, HORA_VERSION_MAJOR);
}

// A program built against an older header has a smaller struct: the
// initializers write only the size they are told (the macros pass sizeof),
// and the unsized entry points of earlier headers only the 0.5.0 layout.
TEST(Abi, InitializersNeverWritePastTheCallersStruct) {
  constexpr unsigned char kCanary = 0xa5;
  struct Buf {
    unsigned char bytes[sizeof(hora_options_t) + sizeof(hora_config_t) + 64];
  };
  auto untouchedFrom = [&](const Buf& b, size_t from) {
    for (size_t i = from; i < sizeof(b.bytes); ++i)
      if (b.bytes[i] != kCanary) return false;
    return true;
  };
  const size_t optionsV050 = offsetof(hora_options_t, ready_event) + sizeof(void*);
  for (size_t size : {optionsV050, sizeof(hora_options_t), size_t{12}}) {
    alignas(hora_options_t) Buf b;
    std::memset(b.bytes, kCanary, sizeof(b.bytes));
    auto* o = reinterpret_cast<hora_options_t*>(b.bytes);
    hora_options_init_sized(o, size);
    EXPECT_TRUE(untouchedFrom(b, size)) << "options, size " << size;
    EXPECT_EQ(o->struct_size, size);
    if (size >= offsetof(hora_options_t, postscale) + sizeof(double)) {
      EXPECT_EQ(o->postscale, 1.0);
    }
  }
  {
    alignas(hora_options_t) Buf b;
    std::memset(b.bytes, kCanary, sizeof(b.bytes));
    auto* o = reinterpret_cast<hora_options_t*>(b.bytes);
    (hora_options_init)(o);  // the unsized entry point an older program calls
    EXPECT_TRUE(untouchedFrom(b, optionsV050));
    EXPECT_EQ(o->struct_size, optionsV050);
    EXPECT_EQ(o->op, HORA_OP_SUM);
  }
  {
    alignas(hora_config_t) Buf b;
    std::memset(b.bytes, kCanary, sizeof(b.bytes));
    auto* c = reinterpret_cast<hora_config_t*>(b.bytes);
    hora_config_init_sized(c, offsetof(hora_config_t, cache_capacity));
    EXPECT_TRUE(untouchedFrom(b, offsetof(hora_config_t, cache_capacity)));
    EXPECT_EQ(c->rank, -1);
    (hora_config_init)(c);
    EXPECT_EQ(c->struct_size, offsetof(hora_config_t, elastic_newcomer) + sizeof(int32_t));
  }
  hora_options_t full;
  hora_options_init(&full);  // the macro: the whole struct, alloc_event included
  EXPECT_EQ(full.struct_size, sizeof(hora_options_t));
  EXPECT_EQ(full.alloc_event, nullptr);
}

// Finite but huge times and capacities are refused naming the value, never
// wrapped or overflowed into a duration (issue 14).
// A struct_size that ends inside a pointer field took part of the caller's
// pointer and part of the default's, and the torn name pointer was read
// (found by fuzz_capi). Fields not whole inside struct_size keep their defaults.
TEST(Abi, StructSizeInsideAFieldDoesNotTearAPointer) {
  hora_config_t c;
  hora_config_init(&c);
  c.rank = 0;
  c.size = 1;
  c.log_level = "off";
  c.struct_size = offsetof(hora_config_t, store_addr) + 3;  // store_addr cut: its default
  hora_runtime_t rt = nullptr;
  ASSERT_EQ(hora_init(&c, &rt), HORA_SUCCESS) << hora_last_error_message();
  std::vector<int64_t> shape = {4};
  std::vector<float> data(4, 2.0f);
  DLTensor t = makeTensor(data.data(), dlType(kDLFloat, 32), &shape);
  hora_options_t o;
  hora_options_init(&o);
  o.name = reinterpret_cast<const char*>(uintptr_t{0x4141414141414141});  // never dereferenced
  o.struct_size = offsetof(hora_options_t, name) + 5;
  hora_request_t req = nullptr;
  ASSERT_EQ(hora_allreduce_async(rt, &t, &t, &o, &req), HORA_SUCCESS) << hora_last_error_message();
  EXPECT_EQ(hora_wait(req, 10.0), HORA_SUCCESS) << hora_last_error_message();
  EXPECT_EQ(hora_request_free(req), HORA_SUCCESS);
  EXPECT_EQ(data[0], 2.0f);
  // A float32 tensor whose first element is not 4-byte aligned is refused,
  // before anything reads it as floats (fuzz_capi, UBSan).
  DLTensor odd = t;
  odd.byte_offset = 1;
  hora_options_init(&o);
  EXPECT_EQ(hora_allreduce_async(rt, &odd, &odd, &o, &req), HORA_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hora_last_error_message()).find("not a multiple of its element size 4"),
            std::string::npos)
      << hora_last_error_message();
  EXPECT_EQ(hora_shutdown(rt), HORA_SUCCESS);
}

TEST(Abi, HugeTimesAndCapacitiesAreRefusedNotWrapped) {
  hora_config_t c;
  hora_config_init(&c);
  c.rank = 0;
  c.size = 1;
  c.log_level = "off";
  hora_runtime_t rt = nullptr;
  c.peer_timeout_s = 1e300;
  EXPECT_ERR(hora_init(&c, &rt), HORA_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hora_last_error_message()).find("at most 1e9 s"), std::string::npos)
      << hora_last_error_message();
  c.peer_timeout_s = -1;
  c.cycle_time_ms = 1e300;
  EXPECT_ERR(hora_init(&c, &rt), HORA_ERR_INVALID_ARGUMENT);
  c.cycle_time_ms = -1;
  setenv("HORA_CACHE_CAPACITY", "4294967296", 1);
  EXPECT_ERR(hora_init(&c, &rt), HORA_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hora_last_error_message()).find("4294967296"), std::string::npos)
      << hora_last_error_message();
  unsetenv("HORA_CACHE_CAPACITY");
  // Inline allreduces are capped at 64 KiB (the coordinator holds every rank's copy).
  for (const char* bad : {"65537", "-2"}) {
    setenv("HORA_INLINE_MAX_BYTES", bad, 1);
    EXPECT_ERR(hora_init(&c, &rt), HORA_ERR_INVALID_ARGUMENT);
    EXPECT_NE(
        std::string(hora_last_error_message()).find(std::string("HORA_INLINE_MAX_BYTES=") + bad),
        std::string::npos)
        << hora_last_error_message();
  }
  unsetenv("HORA_INLINE_MAX_BYTES");
  setenv("HORA_HIER_COLLECTIVE_MIN_BYTES", "-1", 1);
  EXPECT_ERR(hora_init(&c, &rt), HORA_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hora_last_error_message()).find("HORA_HIER_COLLECTIVE_MIN_BYTES=-1"),
            std::string::npos)
      << hora_last_error_message();
  unsetenv("HORA_HIER_COLLECTIVE_MIN_BYTES");
  // Polling windows: at most a second, never negative.
  for (const char* name : {"HORA_WAIT_SPIN_US", "HORA_SHM_WAIT_SPIN_US"}) {
    for (const char* bad : {"1000001", "-1"}) {
      setenv(name, bad, 1);
      EXPECT_ERR(hora_init(&c, &rt), HORA_ERR_INVALID_ARGUMENT);
      EXPECT_NE(std::string(hora_last_error_message()).find(std::string(name) + " must be"),
                std::string::npos)
          << hora_last_error_message();
    }
    unsetenv(name);
  }
  // An interface that does not exist: refused at init naming the ones that do.
  setenv("HORA_GLOO_IFACE", "nosuch0", 1);
  EXPECT_ERR(hora_init(&c, &rt), HORA_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hora_last_error_message()).find("'nosuch0' is not an interface"),
            std::string::npos)
      << hora_last_error_message();
  EXPECT_NE(std::string(hora_last_error_message()).find("lo"), std::string::npos)
      << hora_last_error_message();
  setenv("HORA_GLOO_IFACE", "lo", 1);
  ASSERT_EQ(hora_init(&c, &rt), HORA_SUCCESS) << hora_last_error_message();
  EXPECT_EQ(hora_shutdown(rt), HORA_SUCCESS);
  unsetenv("HORA_GLOO_IFACE");
  ASSERT_EQ(hora_init(&c, &rt), HORA_SUCCESS) << hora_last_error_message();
  EXPECT_EQ(hora_shutdown(rt), HORA_SUCCESS);
}

TEST(Abi, BadArgumentsAreRejectedAndNothingElseIsDisturbed) {
  runThreads(2, [&](int rank, hora_runtime_t rt) {
    std::vector<int64_t> shape = {4};
    std::vector<float> data(4, 1.0f);
    DLTensor good = makeTensor(data.data(), dlType(kDLFloat, 32), &shape);
    hora_request_t req = nullptr;
    hora_options_t o;
    hora_options_init(&o);
    o.name = "x";

    EXPECT_ERR(hora_allreduce_async(rt, nullptr, &good, &o, &req), HORA_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(hora_last_error_message())
                  .find("allreduce \"x\" on rank " + std::to_string(rank)),
              std::string::npos);
    EXPECT_ERR(hora_allreduce_async(rt, &good, &good, &o, nullptr), HORA_ERR_INVALID_ARGUMENT);
    DLTensor t = good;
    t.dtype = dlType(99, 32);
    EXPECT_ERR(hora_allreduce_async(rt, &t, &t, &o, &req), HORA_ERR_INVALID_ARGUMENT);
    t = good;
    t.dtype.lanes = 4;
    EXPECT_ERR(hora_allreduce_async(rt, &t, &t, &o, &req), HORA_ERR_INVALID_ARGUMENT);
    std::vector<int64_t> shape2 = {2, 2}, strides = {1, 2};  // column-major: not contiguous
    t = makeTensor(data.data(), dlType(kDLFloat, 32), &shape2);
    t.strides = strides.data();
    EXPECT_ERR(hora_allreduce_async(rt, &t, &t, &o, &req), HORA_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(hora_last_error_message()).find("contiguous"), std::string::npos);
    std::vector<int64_t> neg = {-3};
    t = makeTensor(data.data(), dlType(kDLFloat, 32), &neg);
    EXPECT_ERR(hora_allreduce_async(rt, &t, &t, &o, &req), HORA_ERR_INVALID_ARGUMENT);
    t = good;
    t.data = nullptr;
    EXPECT_ERR(hora_allreduce_async(rt, &t, &t, &o, &req), HORA_ERR_INVALID_ARGUMENT);
    t = good;
    t.device.device_type = kDLCUDA;
    EXPECT_ERR(hora_allreduce_async(rt, &t, &t, &o, &req), HORA_ERR_NOT_SUPPORTED);
    EXPECT_NE(std::string(hora_last_error_message()).find("GPU"), std::string::npos);
    std::vector<int64_t> other = {5};
    std::vector<float> d5(5);
    DLTensor out5 = makeTensor(d5.data(), dlType(kDLFloat, 32), &other);
    EXPECT_ERR(hora_allreduce_async(rt, &good, &out5, &o, &req), HORA_ERR_INVALID_ARGUMENT);
    o.op = 42;
    EXPECT_ERR(hora_allreduce_async(rt, &good, &good, &o, &req), HORA_ERR_INVALID_ARGUMENT);
    o.op = HORA_OP_MIN;
    EXPECT_ERR(hora_reducescatter_async(rt, &good, &o, &req), HORA_ERR_INVALID_ARGUMENT);
    std::vector<uint8_t> b(4, 1);
    DLTensor tb = makeTensor(b.data(), dlType(6, 8), &shape);
    o.op = HORA_OP_AVERAGE;
    EXPECT_ERR(hora_allreduce_async(rt, &tb, &tb, &o, &req), HORA_ERR_INVALID_ARGUMENT);
    o.op = HORA_OP_SUM;
    o.root = 7;
    EXPECT_ERR(hora_broadcast_async(rt, &good, &o, &req), HORA_ERR_INVALID_ARGUMENT);
    o.root = 0;
    int64_t splits[3] = {1, 1, 2};
    EXPECT_ERR(hora_alltoall_async(rt, &good, splits, 3, &o, &req), HORA_ERR_INVALID_ARGUMENT);
    int64_t badsum[2] = {1, 1};
    EXPECT_ERR(hora_alltoall_async(rt, &good, badsum, 2, &o, &req), HORA_ERR_INVALID_ARGUMENT);
    std::vector<int64_t> scalarShape;
    DLTensor scalar = makeTensor(data.data(), dlType(kDLFloat, 32), &scalarShape);
    EXPECT_ERR(hora_allgather_async(rt, &scalar, &o, &req), HORA_ERR_INVALID_ARGUMENT);
    int32_t ranks[2] = {1, 0};
    hora_process_set_t ps;
    EXPECT_ERR(hora_process_set_create(rt, ranks, 2, &ps), HORA_ERR_INVALID_ARGUMENT);
    int32_t outside[1] = {5};
    EXPECT_ERR(hora_process_set_create(rt, outside, 1, &ps), HORA_ERR_INVALID_ARGUMENT);
    o.process_set = reinterpret_cast<hora_process_set_t>(data.data());
    EXPECT_ERR(hora_allreduce_async(rt, &good, &good, &o, &req), HORA_ERR_INVALID_ARGUMENT);
    o.process_set = nullptr;
    EXPECT_EQ(req, nullptr);

    // Duplicate name in flight: rank 0 submits "dup" twice before rank 1 submits it once.
    if (rank == 0) {
      hora_request_t first;
      ASSERT_EQ(hora_allreduce_async(rt, &good, &good, &o, &first), HORA_SUCCESS);  // name "x"
      EXPECT_ERR(hora_allreduce_async(rt, &good, &good, &o, &req), HORA_ERR_INVALID_USAGE);
      EXPECT_NE(std::string(hora_last_error_message()).find("already in flight"),
                std::string::npos);
      ASSERT_EQ(waitAndFree(first), HORA_SUCCESS) << lastMessage();
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      hora_request_t first;
      ASSERT_EQ(hora_allreduce_async(rt, &good, &good, &o, &first), HORA_SUCCESS);
      ASSERT_EQ(waitAndFree(first), HORA_SUCCESS) << lastMessage();
    }
    EXPECT_EQ(data[0], 2.0f);  // the one valid allreduce ran exactly once

    // The last error is per thread.
    std::thread([&] { EXPECT_STREQ(hora_last_error_message(), ""); }).join();

    // hora_wait with a short timeout on a request that cannot complete yet.
    if (rank == 0) {
      o.name = "late";
      ASSERT_EQ(hora_allreduce_async(rt, &good, &good, &o, &req), HORA_SUCCESS);
      EXPECT_ERR(hora_wait(req, 0.05), HORA_ERR_TIMEOUT);
      const DLTensor* out;
      EXPECT_ERR(hora_request_output(req, &out), HORA_IN_PROGRESS);
      ASSERT_EQ(waitAndFree(req), HORA_SUCCESS) << lastMessage();
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      o.name = "late";
      ASSERT_EQ(hora_allreduce_async(rt, &good, &good, &o, &req), HORA_SUCCESS);
      ASSERT_EQ(waitAndFree(req), HORA_SUCCESS) << lastMessage();
    }
  });
}

// Issue 14: an output of another shape with the same element count ([4,4] for [16]) was
// accepted; docs/errors.md and Horovod require the input's shape.
TEST(Abi, AllreduceOutputOfAnotherShapeIsRefused) {
  runThreads(2, [&](int rank, hora_runtime_t rt) {
    std::vector<float> in(16, 1.0f), out(16, 0.0f);
    std::vector<int64_t> s16 = {16}, s4x4 = {4, 4}, s16x1 = {16, 1};
    DLTensor ti = makeTensor(in.data(), dlType(kDLFloat, 32), &s16);
    hora_options_t o;
    hora_options_init(&o);
    o.name = "reshaped";
    hora_request_t req = nullptr;
    for (std::vector<int64_t>* shape : {&s4x4, &s16x1}) {
      DLTensor to = makeTensor(out.data(), dlType(kDLFloat, 32), shape);
      EXPECT_ERR(hora_allreduce_async(rt, &ti, &to, &o, &req), HORA_ERR_INVALID_ARGUMENT);
      std::string m = hora_last_error_message();
      std::string outText = shape == &s4x4 ? "float32[4,4]" : "float32[16,1]";
      EXPECT_NE(
          m.find("allreduce \"reshaped\" on rank " + std::to_string(rank) + ": output " + outText +
                 " does not match input float32[16]; the output must have the "
                 "input's dtype and shape"),
          std::string::npos)
          << m;
      const DLTensor* ins[1] = {&ti};
      DLTensor* outs[1] = {&to};
      EXPECT_ERR(hora_grouped_allreduce_async(rt, 1, ins, outs, &o, &req),
                 HORA_ERR_INVALID_ARGUMENT);
      EXPECT_NE(std::string(hora_last_error_message()).find("output " + outText),
                std::string::npos);
    }
    EXPECT_EQ(req, nullptr);
    EXPECT_EQ(out[0], 0.0f) << "nothing was written";
    // The input's shape is fine.
    DLTensor to = makeTensor(out.data(), dlType(kDLFloat, 32), &s16);
    ASSERT_EQ(hora_allreduce_async(rt, &ti, &to, &o, &req), HORA_SUCCESS)
        << hora_last_error_message();
    ASSERT_EQ(waitAndFree(req), HORA_SUCCESS) << lastMessage();
    EXPECT_EQ(out[0], 2.0f);
    EXPECT_EQ(out[15], 2.0f);
  });
}

struct CallbackLog {
  std::atomic<int> calls{0};
  std::atomic<int> lastStatus{-1};
};

TEST(Abi, CallbackAndAllocatorOptions) {
  runThreads(2, [&](int rank, hora_runtime_t rt) {
    CallbackLog log;
    std::vector<int64_t> shape = {3};
    std::vector<int32_t> data(3, rank + 1);
    DLTensor t = makeTensor(data.data(), dlType(kDLInt, 32), &shape);
    hora_options_t o;
    hora_options_init(&o);
    o.name = "cb";
    o.callback = [](void* user, hora_request_t, hora_status_t s) {
      auto* l = static_cast<CallbackLog*>(user);
      l->lastStatus = s;
      ++l->calls;
    };
    o.callback_user = &log;
    std::vector<char> arena;
    o.alloc = [](void* user, int32_t, const int64_t*, DLDataType, size_t nbytes,
                 void** out) -> int {
      auto* a = static_cast<std::vector<char>*>(user);  // runs on a hora thread
      a->assign(nbytes, 0);
      *out = a->data();
      return 0;
    };
    o.alloc_user = &arena;
    hora_request_t req;
    ASSERT_EQ(hora_allgather_async(rt, &t, &o, &req), HORA_SUCCESS);
    ASSERT_EQ(hora_wait(req, 30), HORA_SUCCESS);
    const DLTensor* out;
    ASSERT_EQ(hora_request_output(req, &out), HORA_SUCCESS);
    EXPECT_EQ(out->data, arena.data());
    EXPECT_EQ(static_cast<int32_t*>(out->data)[5], 2);
    hora_request_free(req);
    for (int i = 0; i < 100 && log.calls == 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_EQ(log.calls, 1);
    EXPECT_EQ(log.lastStatus, HORA_SUCCESS);
  });
}

// Ranks as forked processes: a smaller sweep of the same checks.
class ProcessMode : public ::testing::TestWithParam<int> {};

TEST_P(ProcessMode, AllreduceAllgatherBroadcast) {
  int size = GetParam();
  auto results = runProcesses(
      size,
      [size](int rank) -> int {
        hora_runtime_t rt;
        CHILD_CHECK(hora_init(nullptr, &rt) == HORA_SUCCESS, "%s", hora_last_error_message());
        int32_t r = -1, n = -1, lr = -1, ls = -1;
        hora_rank(rt, &r);
        hora_size(rt, &n);
        hora_local_rank(rt, &lr);
        hora_local_size(rt, &ls);
        CHILD_CHECK(r == rank && n == size && lr == rank && ls == size,
                    "identity %d/%d local %d/%d", r, n, lr, ls);
        for (const DT& dt : allDtypes()) {
          for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{100003}}) {
            std::vector<char> buf(std::max<int64_t>(count, 1) * hora::dataTypeSize(dt.dt));
            for (int64_t i = 0; i < count; ++i)
              writeVal(dt.dt, buf.data(), i, inputValue(rank, i, hora::ReduceOp::kMax, dt.dt));
            std::vector<int64_t> shape = {count};
            DLTensor t = makeTensor(buf.data(), dt.dl, &shape);
            hora_options_t o;
            hora_options_init(&o);
            std::string name = std::string("p.") + dt.name + "." + std::to_string(count);
            o.name = name.c_str();
            o.op = HORA_OP_MAX;
            hora_request_t req;
            CHILD_CHECK(hora_allreduce_async(rt, &t, &t, &o, &req) == HORA_SUCCESS, "%s",
                        hora_last_error_message());
            CHILD_CHECK(waitAndFree(req) == HORA_SUCCESS, "%s", lastMessage().c_str());
            for (int64_t i = 0; i < count; ++i) {
              double want = reference(size, i, hora::ReduceOp::kMax, dt.dt);
              CHILD_CHECK(readVal(dt.dt, buf.data(), i) == want, "%s [%ld]", name.c_str(), (long)i);
            }
          }
        }
        std::vector<int64_t> shape = {rank + 1};
        std::vector<int64_t> mine(rank + 1, rank);
        DLTensor t = makeTensor(mine.data(), dlType(kDLInt, 64), &shape);
        hora_request_t req;
        CHILD_CHECK(hora_allgather_async(rt, &t, nullptr, &req) == HORA_SUCCESS, "%s",
                    hora_last_error_message());
        CHILD_CHECK(hora_wait(req, 60) == HORA_SUCCESS, "%s", hora_last_error_message());
        const DLTensor* out;
        CHILD_CHECK(hora_request_output(req, &out) == HORA_SUCCESS, "no output");
        CHILD_CHECK(out->shape[0] == size * (size + 1) / 2, "allgather rows %ld",
                    (long)out->shape[0]);
        hora_request_free(req);
        CHILD_CHECK(hora_shutdown(rt) == HORA_SUCCESS, "%s", hora_last_error_message());
        return 0;
      },
      120);
  for (int r = 0; r < size; ++r)
    EXPECT_EQ(results[r].exitCode, 0) << "rank " << r << ":\n" << results[r].output;
}

INSTANTIATE_TEST_SUITE_P(WorldSize, ProcessMode, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "np" + std::to_string(info.param); });

}  // namespace
