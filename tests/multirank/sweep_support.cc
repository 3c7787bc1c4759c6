// Sweeps shared by the CPU collectives suite and the GPU-path suite (tensors
// described as CUDA memory whose bytes are host memory, for the mock plugin):
// allreduceSweep (every dtype, op and element count 0, 1, odd, 1001,
// submitted before any is waited for so they fuse, checked exactly against
// the local reference), allgatherSweep, alltoallCheck, reducescatterSweep.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "rank_harness.h"
#include "tensor_util.h"
#include "test_memory.h"

namespace htest {

namespace {
DeviceMemory deviceMemory;
}  // namespace

void setDeviceMemory(const DeviceMemory& m) { deviceMemory = m; }

TestBuffer::TestBuffer(size_t bytes, DLDeviceType device) {
  bytes = std::max<size_t>(bytes, 1);
  if (device == kDLCUDA && deviceMemory.alloc) {
    p_ = std::shared_ptr<char>(static_cast<char*>(deviceMemory.alloc(bytes)),
                               [](char* q) { deviceMemory.release(q); });
  } else {
    p_ = std::shared_ptr<char>(new char[bytes](), std::default_delete<char[]>());
  }
}

std::vector<char> outputBytes(const DLTensor* out) {
  size_t n = (out->dtype.bits * out->dtype.lanes + 7) / 8;
  for (int i = 0; i < out->ndim; ++i) n *= static_cast<size_t>(out->shape[i]);
  std::vector<char> host(std::max<size_t>(n, 1));
  if (n == 0) return host;
  const char* src = static_cast<const char*>(out->data) + out->byte_offset;
  if (out->device.device_type == kDLCUDA && deviceMemory.toHost)
    deviceMemory.toHost(host.data(), src, n);
  else
    std::memcpy(host.data(), src, n);
  return host;
}

void allreduceSweep(int rank, int size, hora_runtime_t rt, DLDeviceType device, int deviceId) {
  using hora::ReduceOp;
  const int64_t kCounts[] = {0, 1, 7, 1001};
  struct Pending {
    hora_request_t req;
    TestBuffer buf;
    std::vector<int64_t> shape;
    ReduceOp op;
    std::string name;
  };
  const std::string prefix = device == kDLCPU ? "ar." : "ar.dev.";
  for (const DT& dt : allDtypes()) {
    std::vector<Pending> pend;
    pend.reserve(64);
    for (int o = 0; o < 5; ++o) {
      auto op = static_cast<ReduceOp>(o);
      if (!hora::reduceOpSupported(op, dt.dt)) continue;
      for (int64_t n : kCounts) {
        Pending p{nullptr,
                  TestBuffer(std::max<int64_t>(n, 1) * hora::dataTypeSize(dt.dt), device),
                  {n},
                  op,
                  prefix + dt.name + "." + hora::reduceOpName(op) + "." + std::to_string(n)};
        for (int64_t i = 0; i < n; ++i)
          writeVal(dt.dt, p.buf.data(), i, inputValue(rank, i, op, dt.dt));
        pend.push_back(std::move(p));
      }
    }
    for (auto& p : pend) {
      DLTensor t = makeTensor(p.buf.data(), dt.dl, &p.shape);
      t.device.device_type = device;
      t.device.device_id = deviceId;
      hora_options_t o;
      hora_options_init(&o);
      o.name = p.name.c_str();
      o.op = static_cast<hora_reduce_op_t>(p.op);
      ASSERT_EQ(hora_allreduce_async(rt, &t, &t, &o, &p.req), HORA_SUCCESS)
          << hora_last_error_message();
    }
    for (auto& p : pend) {
      std::string msg;
      ASSERT_EQ(waitAndFree(p.req, 60, &msg), HORA_SUCCESS) << p.name << ": " << msg;
      int wrong = 0;
      for (int64_t i = 0; i < p.shape[0]; ++i) {
        double got = readVal(dt.dt, p.buf.data(), i), want = reference(size, i, p.op, dt.dt);
        if (std::fabs(got - want) > tolerance(dt.dt, p.op) * std::max(1.0, std::fabs(want))) {
          if (wrong++ < 3)
            ADD_FAILURE() << p.name << " rank " << rank << " [" << i << "] got " << got << " want "
                          << want;
        }
      }
      EXPECT_EQ(wrong, 0) << p.name;
    }
  }
}

namespace {

DLTensor deviceTensor(void* data, DLDataType dt, std::vector<int64_t>* shape, DLDeviceType device,
                      int deviceId) {
  DLTensor t = makeTensor(data, dt, shape);
  t.device.device_type = device;
  t.device.device_id = deviceId;
  return t;
}

// A library-owned output sits where the input was.
void expectOutputDevice(const DLTensor* out, DLDeviceType device, int deviceId,
                        const std::string& what) {
  EXPECT_EQ(out->device.device_type, device) << what;
  EXPECT_EQ(out->device.device_id, device == kDLCPU ? 0 : deviceId) << what;
}

}  // namespace

void allgatherSweep(int rank, int size, hora_runtime_t rt, DLDeviceType device, int deviceId) {
  using hora::DataType;
  for (const DT& dt : allDtypes()) {
    int64_t rows = rank == 0 ? 0 : rank + 1;  // rank 0 contributes nothing
    std::vector<int64_t> shape = {rows, 3};
    TestBuffer buf(std::max<int64_t>(rows * 3, 1) * hora::dataTypeSize(dt.dt), device);
    for (int64_t i = 0; i < rows * 3; ++i)
      writeVal(dt.dt, buf.data(), i, (rank * 10 + i) % 7 + (dt.dt == DataType::kBool ? 0 : 1));
    DLTensor t = deviceTensor(buf.data(), dt.dl, &shape, device, deviceId);
    hora_options_t o;
    hora_options_init(&o);
    std::string name = std::string("ag.") + dt.name;
    o.name = name.c_str();
    hora_request_t req;
    ASSERT_EQ(hora_allgather_async(rt, &t, &o, &req), HORA_SUCCESS) << hora_last_error_message();
    ASSERT_EQ(hora_wait(req, 60), HORA_SUCCESS) << hora_last_error_message();
    const DLTensor* out = nullptr;
    ASSERT_EQ(hora_request_output(req, &out), HORA_SUCCESS);
    expectOutputDevice(out, device, deviceId, name);
    const std::vector<char> result = outputBytes(out);
    int64_t total = 0;
    for (int r = 1; r < size; ++r) total += r + 1;
    ASSERT_EQ(out->ndim, 2);
    ASSERT_EQ(out->shape[0], total);
    ASSERT_EQ(out->shape[1], 3);
    int64_t off = 0;
    for (int r = 1; r < size; ++r)
      for (int64_t i = 0; i < (r + 1) * 3; ++i, ++off) {
        double want = (r * 10 + i) % 7 + (dt.dt == DataType::kBool ? 0 : 1);
        if (dt.dt == DataType::kBool) want = want != 0;
        ASSERT_EQ(readVal(dt.dt, result.data(), off), want) << dt.name << " from rank " << r;
      }
    hora_request_free(req);
  }
}

void alltoallCheck(int rank, int size, hora_runtime_t rt, DLDeviceType device, int deviceId) {
  // rank r sends (r + d) % 3 rows to rank d; a row is 2 int64 values [r, d].
  // From 3 ranks on, the last rank neither sends nor receives anything (it
  // must still take part).
  auto rowsFor = [size](int from, int to) -> int64_t {
    if (size >= 3 && (from == size - 1 || to == size - 1)) return 0;
    return (from + to) % 3;
  };
  std::vector<int64_t> splits(size);
  int64_t rows = 0;
  for (int d = 0; d < size; ++d) rows += splits[d] = rowsFor(rank, d);
  std::vector<int64_t> values;
  for (int d = 0; d < size; ++d)
    for (int64_t k = 0; k < splits[d]; ++k) values.insert(values.end(), {rank, d * 100 + k});
  TestBuffer data(values.size() * sizeof(int64_t), device);
  if (!values.empty()) std::memcpy(data.data(), values.data(), values.size() * sizeof(int64_t));
  std::vector<int64_t> shape = {rows, 2};
  DLTensor t = deviceTensor(data.data(), dlType(kDLInt, 64), &shape, device, deviceId);
  hora_options_t o;
  hora_options_init(&o);
  o.name = "a2a";
  hora_request_t req;
  ASSERT_EQ(hora_alltoall_async(rt, &t, splits.data(), size, &o, &req), HORA_SUCCESS)
      << hora_last_error_message();
  ASSERT_EQ(hora_wait(req, 60), HORA_SUCCESS) << hora_last_error_message();
  const int64_t* recv = nullptr;
  int32_t nrecv = 0;
  ASSERT_EQ(hora_request_received_splits(req, &recv, &nrecv), HORA_SUCCESS);
  ASSERT_EQ(nrecv, size);
  const DLTensor* out = nullptr;
  ASSERT_EQ(hora_request_output(req, &out), HORA_SUCCESS);
  expectOutputDevice(out, device, deviceId, "a2a");
  const std::vector<char> result = outputBytes(out);
  const int64_t* v = reinterpret_cast<const int64_t*>(result.data());
  int64_t off = 0;
  for (int s = 0; s < size; ++s) {
    ASSERT_EQ(recv[s], rowsFor(s, rank));
    for (int64_t k = 0; k < recv[s]; ++k, off += 2) {
      ASSERT_EQ(v[off], s);
      ASSERT_EQ(v[off + 1], rank * 100 + k);
    }
  }
  ASSERT_EQ(out->shape[0], off / 2);
  hora_request_free(req);
}

void reducescatterSweep(int rank, int size, hora_runtime_t rt, DLDeviceType device, int deviceId) {
  using hora::DataType;
  // float32 and float16 go through NCCL on a GPU; int16 has no NCCL type and
  // is staged through the CPU data plane even where a communicator exists.
  const DT kTypes[] = {{DataType::kFloat32, {kDLFloat, 32, 1}, "float32"},
                       {DataType::kFloat16, {kDLFloat, 16, 1}, "float16"},
                       {DataType::kInt16, {kDLInt, 16, 1}, "int16"}};
  for (const DT& dt : kTypes) {
    for (int64_t dim0 : {int64_t{1}, int64_t{7}, int64_t{10}, int64_t{1001}}) {
      for (hora_reduce_op_t op : {HORA_OP_SUM, HORA_OP_AVERAGE}) {
        if (dt.dt == DataType::kInt16 && op == HORA_OP_AVERAGE) continue;
        // Scale factors on one case per dtype (exact in every dtype here).
        const bool scaled = dim0 == 10 && op == HORA_OP_SUM;
        const double pre = scaled ? 2.0 : 1.0, post = scaled ? 0.5 : 1.0;
        std::vector<int64_t> shape = {dim0, 2};
        TestBuffer in(dim0 * 2 * hora::dataTypeSize(dt.dt), device);
        for (int64_t i = 0; i < dim0 * 2; ++i) writeVal(dt.dt, in.data(), i, (i + rank) % 5);
        DLTensor t = deviceTensor(in.data(), dt.dl, &shape, device, deviceId);
        hora_options_t o;
        hora_options_init(&o);
        std::string name =
            std::string("rs.") + dt.name + "." + std::to_string(dim0) + "." + std::to_string(op);
        o.name = name.c_str();
        o.op = op;
        o.prescale = pre;
        o.postscale = post;
        hora_request_t req;
        ASSERT_EQ(hora_reducescatter_async(rt, &t, &o, &req), HORA_SUCCESS)
            << hora_last_error_message();
        ASSERT_EQ(hora_wait(req, 60), HORA_SUCCESS) << hora_last_error_message();
        const DLTensor* out = nullptr;
        ASSERT_EQ(hora_request_output(req, &out), HORA_SUCCESS);
        expectOutputDevice(out, device, deviceId, name);
        const std::vector<char> result = outputBytes(out);
        int64_t myRows = dim0 / size + (rank < dim0 % size ? 1 : 0);
        int64_t start = 0;
        for (int r = 0; r < rank; ++r) start += dim0 / size + (r < dim0 % size ? 1 : 0);
        ASSERT_EQ(out->shape[0], myRows) << name;
        for (int64_t i = 0; i < myRows * 2; ++i) {
          double sum = 0;
          for (int r = 0; r < size; ++r) sum += (start * 2 + i + r) % 5;
          const double want = op == HORA_OP_SUM ? sum * pre * post : sum / size;
          ASSERT_NEAR(readVal(dt.dt, result.data(), i), want, 2e-3 * std::max(1.0, std::fabs(want)))
              << name << " rank " << rank << " [" << i << "]";
        }
        hora_request_free(req);
      }
    }
  }
}

}  // namespace htest
