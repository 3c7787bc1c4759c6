// libhora_cuda.so through its C table, the way libhora uses it: dlopen,
// hora_gpu_plugin_get, then only table calls. Without a CUDA device the
// device tests skip ("no CUDA device: ..."); the table and the argument
// checks are tested everywhere.
//
// On a GPU: batched_scale_copy for every dtype and several scales against
// hora's CPU scaleCopy (copy_cases.h), the ResNet-50 gradients through a
// fusion buffer, memory/stream/event functions, NCCL at world size 1 (and 2
// when two devices are visible), comm_abort, and a comm_init that times out.
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "copy_cases.h"
#include "ops/gpu/hora_gpu_plugin.h"

#ifndef HORA_CUDA_PLUGIN_PATH
#error "HORA_CUDA_PLUGIN_PATH must name the built libhora_cuda.so"
#endif

namespace hora {
namespace {

using gputest::CopyCase;

const hora_gpu_plugin_v1_t* loadPlugin(std::string* why) {
  static void* handle = nullptr;
  static const hora_gpu_plugin_v1_t* table = nullptr;
  static std::string error;
  if (handle == nullptr && error.empty()) {
    handle = dlopen(HORA_CUDA_PLUGIN_PATH, RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      error = std::string("dlopen(") + HORA_CUDA_PLUGIN_PATH + "): " + dlerror();
    } else {
      auto get = reinterpret_cast<hora_gpu_plugin_get_fn>(dlsym(handle, HORA_GPU_PLUGIN_ENTRY));
      if (get == nullptr) {
        error = std::string("dlsym(") + HORA_GPU_PLUGIN_ENTRY + "): not found";
      } else {
        table = get(HORA_GPU_PLUGIN_ABI_VERSION);
        if (table == nullptr) error = "hora_gpu_plugin_get(1) returned NULL";
      }
    }
  }
  *why = error;
  return table;
}

std::string lastError(const hora_gpu_plugin_v1_t* p) {
  const char* e = p->last_error();
  return e != nullptr ? e : "(null)";
}

// ------------------------------------------------------- no device needed

TEST(CudaPluginTable, LoadsAndIsComplete) {
  std::string why;
  const hora_gpu_plugin_v1_t* p = loadPlugin(&why);
  ASSERT_NE(p, nullptr) << why;
  EXPECT_EQ(p->abi_version, HORA_GPU_PLUGIN_ABI_VERSION);
  EXPECT_EQ(p->struct_size, sizeof(hora_gpu_plugin_v1_t));
  ASSERT_NE(p->name, nullptr);
  EXPECT_NE(std::string(p->name).find("nccl"), std::string::npos) << p->name;
  EXPECT_EQ(p->unique_id_bytes, 128u);  // sizeof(ncclUniqueId)
  // Every entry is filled.
#define HORA_SLOT(f) \
  { #f, reinterpret_cast < const void*>(p->f) }
  const std::pair<const char*, const void*> slots[] = {
      HORA_SLOT(last_error),         HORA_SLOT(device_count),
      HORA_SLOT(stream_create),      HORA_SLOT(stream_destroy),
      HORA_SLOT(stream_synchronize), HORA_SLOT(stream_wait_external_event),
      HORA_SLOT(event_create),       HORA_SLOT(event_destroy),
      HORA_SLOT(event_record),       HORA_SLOT(event_query),
      HORA_SLOT(device_alloc),       HORA_SLOT(device_free),
      HORA_SLOT(host_alloc_pinned),  HORA_SLOT(host_free_pinned),
      HORA_SLOT(memcpy_async),       HORA_SLOT(batched_scale_copy),
      HORA_SLOT(comm_unique_id),     HORA_SLOT(comm_init),
      HORA_SLOT(comm_destroy),       HORA_SLOT(comm_abort),
      HORA_SLOT(comm_async_error),   HORA_SLOT(allreduce),
      HORA_SLOT(broadcast),          HORA_SLOT(allgatherv),
      HORA_SLOT(alltoallv),          HORA_SLOT(reducescatter)};
#undef HORA_SLOT
  for (const auto& slot : slots) EXPECT_NE(slot.second, nullptr) << slot.first;
  void* handle = dlopen(HORA_CUDA_PLUGIN_PATH, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  ASSERT_NE(handle, nullptr);
  auto get = reinterpret_cast<hora_gpu_plugin_get_fn>(dlsym(handle, HORA_GPU_PLUGIN_ENTRY));
  EXPECT_EQ(get(HORA_GPU_PLUGIN_ABI_VERSION + 1), nullptr) << "an unknown ABI version is refused";
  dlclose(handle);
}

TEST(CudaPluginTable, BadArgumentsFailWithAMessage) {
  std::string why;
  const hora_gpu_plugin_v1_t* p = loadPlugin(&why);
  ASSERT_NE(p, nullptr) << why;
  hora_gpu_copy_t copy{nullptr, nullptr, 4};
  EXPECT_NE(p->batched_scale_copy(HORA_GPU_DTYPE_FLOAT32, &copy, 1, 1.0, nullptr), 0);
  EXPECT_NE(lastError(p).find("not a stream handle"), std::string::npos) << lastError(p);
  EXPECT_NE(
      p->allreduce(nullptr, nullptr, 4, HORA_GPU_DTYPE_INT16, HORA_GPU_OP_SUM, nullptr, nullptr),
      0);
  EXPECT_NE(lastError(p).find("int16 has no NCCL data type"), std::string::npos) << lastError(p);
  EXPECT_NE(
      p->reducescatter(nullptr, nullptr, HORA_GPU_DTYPE_BOOL, HORA_GPU_OP_MAX, nullptr, nullptr),
      0);
  EXPECT_NE(lastError(p).find("bool has no NCCL data type"), std::string::npos) << lastError(p);
  EXPECT_NE(p->allreduce(nullptr, nullptr, 4, HORA_GPU_DTYPE_FLOAT32, 1, nullptr, nullptr), 0);
  EXPECT_NE(lastError(p).find("average arrives as sum"), std::string::npos) << lastError(p);
  EXPECT_NE(p->comm_abort(nullptr), 0);
  EXPECT_NE(lastError(p).find("not a communicator handle"), std::string::npos) << lastError(p);
  EXPECT_EQ(p->comm_destroy(nullptr), 0);
  EXPECT_EQ(p->stream_destroy(nullptr), 0);
  EXPECT_NE(p->device_count(nullptr), 0);
}

// ------------------------------------------------------------ on a device

class CudaPluginTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    p_ = loadPlugin(&why);
    ASSERT_NE(p_, nullptr) << why;
    int n = 0;
    if (p_->device_count(&n) != 0) GTEST_SKIP() << "no CUDA device: " << lastError(p_);
    if (n == 0) GTEST_SKIP() << "no CUDA device: cudaGetDeviceCount() found none";
    devices_ = n;
    ASSERT_EQ(p_->stream_create(0, &stream_), 0) << lastError(p_);
  }
  void TearDown() override {
    for (void* ptr : allocations_) {
      EXPECT_EQ(p_->device_free(0, ptr), 0) << lastError(p_);
    }
    if (stream_ != nullptr) {
      EXPECT_EQ(p_->stream_destroy(stream_), 0) << lastError(p_);
    }
  }

  void* deviceAlloc(size_t bytes) {
    void* ptr = nullptr;
    EXPECT_EQ(p_->device_alloc(0, bytes, &ptr), 0) << lastError(p_);
    if (ptr != nullptr) allocations_.push_back(ptr);
    return ptr;
  }
  // Host <-> device through memcpy_async on the test stream, then a sync.
  void upload(void* dst, const void* src, size_t bytes) {
    ASSERT_EQ(p_->memcpy_async(dst, src, bytes, stream_), 0) << lastError(p_);
    ASSERT_EQ(p_->stream_synchronize(stream_), 0) << lastError(p_);
  }
  void download(void* dst, const void* src, size_t bytes) { upload(dst, src, bytes); }

  // Runs one copy case on the device and compares the whole destination arena.
  void runCase(const CopyCase& c, double scale) {
    void* src = deviceAlloc(c.src.size());
    void* dst = deviceAlloc(c.dst.size());
    ASSERT_TRUE(src != nullptr && dst != nullptr);
    upload(src, c.src.data(), c.src.size());
    upload(dst, c.dst.data(), c.dst.size());
    const auto copies = gputest::copiesFor(c, dst, src);
    ASSERT_EQ(p_->batched_scale_copy(c.dtype, copies.data(), copies.size(), scale, stream_), 0)
        << lastError(p_);
    std::vector<uint8_t> got(c.dst.size());
    download(got.data(), dst, got.size());
    EXPECT_EQ(gputest::firstDifference(c, got, gputest::expectedDst(c, scale)), "");
  }

  const hora_gpu_plugin_v1_t* p_ = nullptr;
  hora_gpu_stream_t stream_ = nullptr;
  int devices_ = 0;
  std::vector<void*> allocations_;
};

TEST_F(CudaPluginTest, BatchedScaleCopyMatchesCpuForEveryDtype) {
  for (int32_t dtype : gputest::kAllDtypes) {
    for (double scale : gputest::kScales) {
      SCOPED_TRACE(::testing::Message() << gputest::dtypeName(dtype) << " scale " << scale);
      runCase(gputest::makeCase(dtype, gputest::kCounts, 77 + dtype, true), scale);
    }
  }
}

// Every 16-bit pattern of float16 and bfloat16 (NaNs aside: their payloads
// need not survive a multiply alike) scaled on the device, through the
// vectorized path (aligned) and the byte-assembling one (destination one byte
// off), against the CPU's scaleCopy; the first mismatches are listed with
// their input, so a class of values (subnormals, rounding) shows at once.
TEST_F(CudaPluginTest, SixteenBitFloatsScaleLikeTheCpuForEveryPattern) {
  std::vector<uint16_t> in;
  for (uint32_t b = 0; b < 65536; ++b) in.push_back(static_cast<uint16_t>(b));
  const size_t n = in.size();
  const size_t bytes = n * 2;
  void* src = deviceAlloc(bytes);
  void* dst = deviceAlloc(bytes + 16);
  ASSERT_TRUE(src != nullptr && dst != nullptr);
  upload(src, in.data(), bytes);
  for (int32_t dtype : {HORA_GPU_DTYPE_FLOAT16, HORA_GPU_DTYPE_BFLOAT16}) {
    const bool half = dtype == HORA_GPU_DTYPE_FLOAT16;
    auto isNan = [&](uint16_t v) {
      return half ? ((v & 0x7c00) == 0x7c00 && (v & 0x3ff) != 0)
                  : ((v & 0x7f80) == 0x7f80 && (v & 0x7f) != 0);
    };
    for (double scale : {0.5, 1.0 / 3.0, 2.5, -0.75}) {
      std::vector<uint16_t> want(n);
      scaleCopy(static_cast<DataType>(dtype), want.data(), in.data(), n, scale);
      for (size_t offset : {size_t{0}, size_t{1}}) {
        std::vector<uint8_t> sentinel(bytes + 16, gputest::kSentinel);
        upload(dst, sentinel.data(), sentinel.size());
        hora_gpu_copy_t copy = {static_cast<char*>(dst) + offset, src, n};
        ASSERT_EQ(p_->batched_scale_copy(dtype, &copy, 1, scale, stream_), 0) << lastError(p_);
        std::vector<uint8_t> raw(bytes + 16);
        download(raw.data(), dst, raw.size());
        std::ostringstream bad;
        size_t mismatches = 0;
        for (size_t i = 0; i < n; ++i) {
          uint16_t got;
          std::memcpy(&got, raw.data() + offset + 2 * i, 2);
          if (got == want[i] || (isNan(got) && isNan(want[i]))) continue;
          if (++mismatches <= 8) {
            bad << std::hex << " [in 0x" << in[i] << ": got 0x" << got << ", want 0x" << want[i]
                << "]" << std::dec;
          }
        }
        EXPECT_EQ(mismatches, 0u) << gputest::dtypeName(dtype) << " scale " << scale
                                  << (offset ? " (byte path)" : " (vector path)") << ":"
                                  << bad.str();
      }
    }
  }
}

TEST_F(CudaPluginTest, BatchedScaleCopyWithManyCopiesTakesSeveralLaunches) {
  std::vector<size_t> counts;
  for (size_t i = 0; i < 2500; ++i) counts.push_back(i % 9 == 0 ? 0 : 1 + (i * 37) % 300);
  runCase(gputest::makeCase(HORA_GPU_DTYPE_FLOAT32, counts, 5, false), 0.5);
  runCase(gputest::makeCase(HORA_GPU_DTYPE_BFLOAT16, counts, 6, false), 1.0);
}

TEST_F(CudaPluginTest, ResNet50GradientsThroughAFusionBuffer) {
  const std::vector<size_t> counts =
      gputest::readShapeCounts(std::string(HORA_SOURCE_DIR) + "/bench/resnet50_grad_shapes.txt");
  ASSERT_EQ(counts.size(), 161u);
  // Tensors 256-byte aligned (like a caching allocator); the fusion buffer
  // packs them back to back.
  std::vector<size_t> at;
  size_t arena = 0;
  size_t total = 0;
  for (size_t n : counts) {
    at.push_back(arena);
    arena += (n * 4 + 255) / 256 * 256;
    total += n;
  }
  std::vector<float> host(arena / 4);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i % 1021) - 510.0f;
  char* grads = static_cast<char*>(deviceAlloc(arena));
  char* fusion = static_cast<char*>(deviceAlloc(total * 4));
  char* out = static_cast<char*>(deviceAlloc(arena));
  ASSERT_TRUE(grads && fusion && out);
  upload(grads, host.data(), arena);
  // The output arena starts as sentinel bytes: the gaps between tensors must
  // keep them (and are initialized for compute-sanitizer's initcheck).
  const std::vector<uint8_t> sentinel(arena, gputest::kSentinel);
  upload(out, sentinel.data(), arena);
  std::vector<hora_gpu_copy_t> pack;
  std::vector<hora_gpu_copy_t> unpack;
  size_t offset = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    pack.push_back({fusion + offset, grads + at[i], counts[i]});
    unpack.push_back({out + at[i], fusion + offset, counts[i]});
    offset += counts[i] * 4;
  }
  ASSERT_EQ(p_->batched_scale_copy(HORA_GPU_DTYPE_FLOAT32, pack.data(), pack.size(), 1.0, stream_),
            0)
      << lastError(p_);
  ASSERT_EQ(
      p_->batched_scale_copy(HORA_GPU_DTYPE_FLOAT32, unpack.data(), unpack.size(), 0.25, stream_),
      0)
      << lastError(p_);
  std::vector<float> got(arena / 4);
  download(got.data(), out, arena);
  for (size_t i = 0; i < counts.size(); ++i) {
    for (size_t j = 0; j < counts[i]; ++j) {
      const size_t k = at[i] / 4 + j;
      ASSERT_EQ(got[k], host[k] * 0.25f) << "tensor " << i << " element " << j;
    }
    const size_t end = i + 1 < counts.size() ? at[i + 1] : arena;
    for (size_t b = at[i] + counts[i] * 4; b < end; ++b) {
      ASSERT_EQ(reinterpret_cast<const uint8_t*>(got.data())[b], gputest::kSentinel)
          << "stray write after tensor " << i;
    }
  }
}

TEST_F(CudaPluginTest, MemoryStreamsAndEvents) {
  const size_t bytes = (8 << 20) + 3;
  void* pinned = nullptr;
  ASSERT_EQ(p_->host_alloc_pinned(bytes, &pinned), 0) << lastError(p_);
  auto* in = static_cast<uint8_t*>(pinned);
  for (size_t i = 0; i < bytes; ++i) in[i] = static_cast<uint8_t>(i * 7 + 1);
  void* a = deviceAlloc(bytes);
  void* b = deviceAlloc(bytes);
  hora_gpu_event_t event = nullptr;
  ASSERT_EQ(p_->event_create(0, &event), 0) << lastError(p_);
  // H2D from pinned memory, D2D, D2H into a second pinned area, all async.
  std::vector<uint8_t> back(bytes);
  ASSERT_EQ(p_->memcpy_async(a, in, bytes, stream_), 0) << lastError(p_);
  ASSERT_EQ(p_->memcpy_async(b, a, bytes, stream_), 0) << lastError(p_);
  ASSERT_EQ(p_->memcpy_async(back.data(), b, bytes, stream_), 0) << lastError(p_);
  ASSERT_EQ(p_->event_record(event, stream_), 0) << lastError(p_);
  int done = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!done && std::chrono::steady_clock::now() < deadline) {
    ASSERT_EQ(p_->event_query(event, &done), 0) << lastError(p_);
    if (!done) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  ASSERT_EQ(done, 1);
  EXPECT_EQ(std::memcmp(back.data(), in, bytes), 0);
  // A second stream waits for a framework's (raw CUDA) event.
  hora_gpu_stream_t other = nullptr;
  ASSERT_EQ(p_->stream_create(0, &other), 0) << lastError(p_);
  cudaEvent_t external = nullptr;
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&external, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(external, nullptr), cudaSuccess);
  EXPECT_EQ(p_->stream_wait_external_event(other, external), 0) << lastError(p_);
  EXPECT_EQ(p_->stream_synchronize(other), 0) << lastError(p_);
  EXPECT_EQ(cudaEventDestroy(external), cudaSuccess);
  EXPECT_EQ(p_->stream_destroy(other), 0) << lastError(p_);
  EXPECT_EQ(p_->event_destroy(event), 0) << lastError(p_);
  EXPECT_EQ(p_->host_free_pinned(pinned), 0) << lastError(p_);
  EXPECT_EQ(p_->memcpy_async(nullptr, nullptr, 0, stream_), 0) << "zero bytes is a no-op";
}

// ------------------------------------------------------------------ NCCL

class CudaPluginNcclTest : public CudaPluginTest {
 protected:
  hora_gpu_comm_t initWorldOfOne() {
    std::vector<char> id(p_->unique_id_bytes);
    EXPECT_EQ(p_->comm_unique_id(id.data()), 0) << lastError(p_);
    hora_gpu_comm_t comm = nullptr;
    EXPECT_EQ(p_->comm_init(0, 1, 0, id.data(), 60000, &comm), 0) << lastError(p_);
    return comm;
  }
  template <typename T>
  std::vector<T> roundTrip(const std::vector<T>& v, void* dev) {
    upload(dev, v.data(), v.size() * sizeof(T));
    std::vector<T> back(v.size());
    download(back.data(), dev, back.size() * sizeof(T));
    return back;
  }
};

TEST_F(CudaPluginNcclTest, CollectivesAtWorldSizeOne) {
  hora_gpu_comm_t comm = initWorldOfOne();
  ASSERT_NE(comm, nullptr);
  const size_t n = 1001;
  std::vector<float> values(n);
  for (size_t i = 0; i < n; ++i) values[i] = static_cast<float>(i) * 0.5f - 100.0f;
  const size_t bytes = n * sizeof(float);
  void* in = deviceAlloc(bytes);
  void* out = deviceAlloc(n * 8);  // also holds the 8-byte dtypes below
  upload(in, values.data(), bytes);
  for (int32_t op : {HORA_GPU_OP_SUM, HORA_GPU_OP_MIN, HORA_GPU_OP_MAX, HORA_GPU_OP_PRODUCT}) {
    std::vector<float> zeros(n, 0.0f);
    upload(out, zeros.data(), bytes);
    ASSERT_EQ(p_->allreduce(in, out, n, HORA_GPU_DTYPE_FLOAT32, op, comm, stream_), 0)
        << lastError(p_);
    std::vector<float> got(n);
    download(got.data(), out, bytes);
    EXPECT_EQ(got, values) << "op " << op;
  }
  // Other dtypes, in place.
  for (int32_t dtype :
       {HORA_GPU_DTYPE_UINT8, HORA_GPU_DTYPE_INT8, HORA_GPU_DTYPE_INT32, HORA_GPU_DTYPE_INT64,
        HORA_GPU_DTYPE_FLOAT16, HORA_GPU_DTYPE_BFLOAT16, HORA_GPU_DTYPE_FLOAT64}) {
    const size_t size = gputest::dtypeSize(dtype);
    std::vector<uint8_t> raw(n * size);
    for (size_t i = 0; i < raw.size(); ++i) raw[i] = static_cast<uint8_t>((i * 13) % 61);
    upload(out, raw.data(), raw.size());
    ASSERT_EQ(p_->allreduce(out, out, n, dtype, HORA_GPU_OP_SUM, comm, stream_), 0)
        << gputest::dtypeName(dtype) << ": " << lastError(p_);
    std::vector<uint8_t> got(raw.size());
    download(got.data(), out, got.size());
    EXPECT_EQ(got, raw) << gputest::dtypeName(dtype);
  }
  // Broadcast (any dtype moves as bytes, int16 and bool included).
  upload(out, values.data(), bytes);
  ASSERT_EQ(p_->broadcast(out, 2 * n, HORA_GPU_DTYPE_INT16, 0, comm, stream_), 0) << lastError(p_);
  std::vector<float> got(n);
  download(got.data(), out, bytes);
  EXPECT_EQ(got, values);
  // allgatherv, alltoallv and reducescatter with one rank: identity.
  const size_t counts[1] = {n};
  std::vector<float> zeros(n, 0.0f);
  upload(out, zeros.data(), bytes);
  ASSERT_EQ(p_->allgatherv(in, out, counts, HORA_GPU_DTYPE_FLOAT32, comm, stream_), 0)
      << lastError(p_);
  download(got.data(), out, bytes);
  EXPECT_EQ(got, values);
  upload(out, zeros.data(), bytes);
  ASSERT_EQ(p_->alltoallv(in, counts, out, counts, HORA_GPU_DTYPE_FLOAT32, comm, stream_), 0)
      << lastError(p_);
  download(got.data(), out, bytes);
  EXPECT_EQ(got, values);
  EXPECT_NE(p_->alltoallv(in, counts, in, counts, HORA_GPU_DTYPE_FLOAT32, comm, stream_), 0);
  EXPECT_NE(lastError(p_).find("overlap"), std::string::npos) << lastError(p_);
  upload(out, values.data(), bytes);
  ASSERT_EQ(p_->reducescatter(out, counts, HORA_GPU_DTYPE_FLOAT32, HORA_GPU_OP_SUM, comm, stream_),
            0)
      << lastError(p_);
  download(got.data(), out, bytes);
  EXPECT_EQ(got, values);
  // int16 / bool reductions are refused with a clear message.
  EXPECT_NE(p_->allreduce(in, out, n, HORA_GPU_DTYPE_INT16, HORA_GPU_OP_SUM, comm, stream_), 0);
  EXPECT_NE(lastError(p_).find("no NCCL data type"), std::string::npos) << lastError(p_);
  int failed = -1;
  ASSERT_EQ(p_->comm_async_error(comm, &failed), 0) << lastError(p_);
  EXPECT_EQ(failed, 0);
  EXPECT_EQ(p_->comm_destroy(comm), 0) << lastError(p_);
}

// p2p_group on a real communicator: with one rank, every send and receive is
// to and from itself, which NCCL allows inside one group. Several messages
// of different sizes in one group, then a second group, must arrive in the
// order they were enqueued (the order p2p_gpu.cc relies on within a channel).
TEST_F(CudaPluginNcclTest, P2pGroupToItselfAtWorldSizeOne) {
  if (!HORA_GPU_PLUGIN_HAS(p_, p2p_group)) GTEST_FAIL() << "this plugin has no p2p_group";
  hora_gpu_comm_t comm = initWorldOfOne();
  ASSERT_NE(comm, nullptr);
  const size_t sizes[3] = {4, 1000003, 64 << 10};  // bytes: tiny, odd and large, medium
  std::vector<void*> in(3), out(3);
  std::vector<std::vector<uint8_t>> sent(3);
  for (int i = 0; i < 3; ++i) {
    in[i] = deviceAlloc(sizes[i]);
    out[i] = deviceAlloc(sizes[i]);
    sent[i].resize(sizes[i]);
    for (size_t b = 0; b < sizes[i]; ++b) sent[i][b] = static_cast<uint8_t>((b * 7 + i * 31) % 251);
    upload(in[i], sent[i].data(), sizes[i]);
    std::vector<uint8_t> zeros(sizes[i], 0);
    upload(out[i], zeros.data(), sizes[i]);
  }
  // Group 1: messages 0 and 1, receives posted before the sends.
  std::vector<hora_gpu_p2p_op_t> ops = {
      {HORA_GPU_P2P_RECV, 0, out[0], sizes[0]},
      {HORA_GPU_P2P_RECV, 0, out[1], sizes[1]},
      {HORA_GPU_P2P_SEND, 0, in[0], sizes[0]},
      {HORA_GPU_P2P_SEND, 0, in[1], sizes[1]},
  };
  ASSERT_EQ(p_->p2p_group(ops.data(), ops.size(), comm, stream_), 0) << lastError(p_);
  // Group 2: message 2, send first.
  std::vector<hora_gpu_p2p_op_t> ops2 = {
      {HORA_GPU_P2P_SEND, 0, in[2], sizes[2]},
      {HORA_GPU_P2P_RECV, 0, out[2], sizes[2]},
  };
  ASSERT_EQ(p_->p2p_group(ops2.data(), ops2.size(), comm, stream_), 0) << lastError(p_);
  ASSERT_EQ(p_->stream_synchronize(stream_), 0) << lastError(p_);
  for (int i = 0; i < 3; ++i) {
    std::vector<uint8_t> got(sizes[i]);
    download(got.data(), out[i], sizes[i]);
    EXPECT_TRUE(got == sent[i]) << "message " << i << " (" << sizes[i] << " bytes) differs";
  }
  EXPECT_EQ(p_->p2p_group(ops.data(), 0, comm, stream_), 0) << "an empty group is a no-op";
  const hora_gpu_p2p_op_t bad = {HORA_GPU_P2P_SEND, 1, in[0], sizes[0]};
  EXPECT_NE(p_->p2p_group(&bad, 1, comm, stream_), 0) << "peer 1 of a world of one";
  EXPECT_FALSE(lastError(p_).empty());
  int failed = -1;
  ASSERT_EQ(p_->comm_async_error(comm, &failed), 0) << lastError(p_);
  EXPECT_EQ(failed, 0);
  EXPECT_EQ(p_->comm_destroy(comm), 0) << lastError(p_);
}

TEST_F(CudaPluginNcclTest, AbortThenCollectiveFails) {
  hora_gpu_comm_t comm = initWorldOfOne();
  ASSERT_NE(comm, nullptr);
  void* buf = deviceAlloc(1024);
  ASSERT_EQ(p_->allreduce(buf, buf, 256, HORA_GPU_DTYPE_FLOAT32, HORA_GPU_OP_SUM, comm, stream_), 0)
      << lastError(p_);
  ASSERT_EQ(p_->stream_synchronize(stream_), 0) << lastError(p_);
  // From another thread, as a watchdog would.
  int abortRc = -1;
  std::thread([&] { abortRc = p_->comm_abort(comm); }).join();
  EXPECT_EQ(abortRc, 0);
  EXPECT_NE(p_->allreduce(buf, buf, 256, HORA_GPU_DTYPE_FLOAT32, HORA_GPU_OP_SUM, comm, stream_),
            0);
  EXPECT_NE(lastError(p_).find("aborted"), std::string::npos) << lastError(p_);
  int failed = 0;
  EXPECT_EQ(p_->comm_async_error(comm, &failed), 0);
  EXPECT_EQ(failed, 1);
  EXPECT_EQ(p_->comm_abort(comm), 0) << "aborting twice is harmless";
  EXPECT_EQ(p_->comm_destroy(comm), 0) << lastError(p_);
}

TEST_F(CudaPluginNcclTest, InitGivesUpAfterTheTimeout) {
  // Rank 0 of 2; rank 1 never comes.
  std::vector<char> id(p_->unique_id_bytes);
  ASSERT_EQ(p_->comm_unique_id(id.data()), 0) << lastError(p_);
  hora_gpu_comm_t comm = nullptr;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_NE(p_->comm_init(0, 2, 0, id.data(), 2000, &comm), 0);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(comm, nullptr);
  EXPECT_NE(lastError(p_).find("rank 0 of 2"), std::string::npos) << lastError(p_);
  EXPECT_NE(lastError(p_).find("aborted"), std::string::npos) << lastError(p_);
  EXPECT_LT(seconds, 30.0);
}

// Two ranks as two threads on two devices: the uneven paths (grouped
// broadcasts, send/recv, per-root reduces).
TEST_F(CudaPluginNcclTest, UnevenCollectivesOnTwoDevices) {
  if (devices_ < 2) GTEST_SKIP() << "needs two CUDA devices, " << devices_ << " visible";
  std::vector<char> id(p_->unique_id_bytes);
  ASSERT_EQ(p_->comm_unique_id(id.data()), 0) << lastError(p_);
  const size_t counts[2] = {3, 1000};  // elements per rank
  std::string errors[2];
  auto rankMain = [&](int rank) {
    auto check = [&](int rc, const char* what) {
      if (rc != 0 && errors[rank].empty()) errors[rank] = std::string(what) + ": " + lastError(p_);
      return rc == 0;
    };
    hora_gpu_comm_t comm = nullptr;
    hora_gpu_stream_t s = nullptr;
    if (!check(p_->comm_init(rank, 2, rank, id.data(), 60000, &comm), "comm_init")) return;
    if (!check(p_->stream_create(rank, &s), "stream_create")) return;
    const size_t total = counts[0] + counts[1];
    void* a = nullptr;
    void* b = nullptr;
    check(p_->device_alloc(rank, total * 4, &a), "device_alloc");
    check(p_->device_alloc(rank, total * 4, &b), "device_alloc");
    // Element i of rank r's contribution is r * 10000 + i.
    std::vector<float> mine(total);
    for (size_t i = 0; i < total; ++i) mine[i] = static_cast<float>(rank * 10000 + i);
    const size_t first = rank == 0 ? 0 : counts[0];
    std::vector<float> got(total);
    auto sync = [&] { return check(p_->stream_synchronize(s), "stream_synchronize"); };
    // allgatherv: rank r contributes counts[r] elements.
    check(p_->memcpy_async(a, mine.data(), total * 4, s), "upload");
    check(p_->allgatherv(a, b, counts, HORA_GPU_DTYPE_FLOAT32, comm, s), "allgatherv");
    check(p_->memcpy_async(got.data(), b, total * 4, s), "download");
    if (sync()) {
      for (size_t i = 0; i < total; ++i) {
        const float want =
            i < counts[0] ? static_cast<float>(i) : static_cast<float>(10000 + (i - counts[0]));
        if (got[i] != want && errors[rank].empty()) errors[rank] = "allgatherv element wrong";
      }
    }
    // reducescatter (uneven): this rank's region holds the sum.
    check(p_->memcpy_async(a, mine.data(), total * 4, s), "upload");
    check(p_->reducescatter(a, counts, HORA_GPU_DTYPE_FLOAT32, HORA_GPU_OP_SUM, comm, s),
          "reducescatter");
    check(p_->memcpy_async(got.data(), a, total * 4, s), "download");
    if (sync()) {
      for (size_t i = first; i < first + counts[rank]; ++i) {
        if (got[i] != static_cast<float>(10000 + 2 * i) && errors[rank].empty()) {
          errors[rank] = "reducescatter element wrong";
        }
      }
    }
    // alltoallv: rank r sends counts[peer] elements to each peer.
    const size_t send[2] = {counts[0], counts[1]};
    const size_t recv[2] = {counts[rank], counts[rank]};
    check(p_->memcpy_async(a, mine.data(), total * 4, s), "upload");
    check(p_->alltoallv(a, send, b, recv, HORA_GPU_DTYPE_FLOAT32, comm, s), "alltoallv");
    check(p_->memcpy_async(got.data(), b, 2 * counts[rank] * 4, s), "download");
    if (sync()) {
      for (int from = 0; from < 2; ++from) {
        for (size_t i = 0; i < counts[rank]; ++i) {
          const float want = static_cast<float>(from * 10000 + first + i);
          if (got[from * counts[rank] + i] != want && errors[rank].empty()) {
            errors[rank] = "alltoallv element wrong";
          }
        }
      }
    }
    check(p_->comm_destroy(comm), "comm_destroy");
    p_->device_free(rank, a);
    p_->device_free(rank, b);
    p_->stream_destroy(s);
  };
  std::thread t0(rankMain, 0);
  std::thread t1(rankMain, 1);
  t0.join();
  t1.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

}  // namespace
}  // namespace hora
