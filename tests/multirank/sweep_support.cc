// allreduceSweep: every dtype, op and element count (0, 1, odd, 1001),
// submitted before any is waited for so they fuse, checked exactly against
// the local reference. Shared by the CPU collectives
// suite and the GPU-path suite (tensors described as CUDA memory).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "rank_harness.h"
#include "tensor_util.h"

namespace htest {

void allreduceSweep(int rank, int size, hora_runtime_t rt, DLDeviceType device) {
  using hora::ReduceOp;
  const int64_t kCounts[] = {0, 1, 7, 1001};
  struct Pending {
    hora_request_t req;
    std::vector<char> buf;
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
                  std::vector<char>(std::max<int64_t>(n, 1) * hora::dataTypeSize(dt.dt)),
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

}  // namespace htest
