// Issue 14: tensor sizes that overflow, through the C ABI on every rank, with both CPU data
// planes (shared memory, the default on one host, and Gloo with HORA_SHM=0). A shape whose
// element count or byte size would overflow is refused at submission, naming the op, the
// tensor, the rank and the dimension, before anything reads the tensor's memory (every tensor
// here points at a few valid bytes); rows that fit on each rank but not together are refused
// by the coordinator on every rank. Either way the set stays usable.
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "rank_harness.h"

using namespace htest;

namespace {

constexpr int64_t k2e40 = int64_t{1} << 40;
constexpr int64_t k2e62 = int64_t{1} << 62;
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

class Overflow : public ::testing::TestWithParam<bool> {
 protected:
  // Read once by each runtime's init, before any starts.
  void SetUp() override { ::setenv("HORA_SHM", GetParam() ? "1" : "0", 1); }
  void TearDown() override { ::unsetenv("HORA_SHM"); }
};

// A normal allreduce after the refusals: the set is still usable and every rank in step.
void expectUsable(hora_runtime_t rt, int size, const char* name) {
  std::vector<float> buf = {1, 2, 3};
  std::vector<int64_t> shape = {3};
  DLTensor t = makeTensor(buf.data(), dlType(kDLFloat, 32), &shape);
  hora_options_t o;
  hora_options_init(&o);
  o.name = name;
  hora_request_t req = nullptr;
  ASSERT_EQ(hora_allreduce_async(rt, &t, &t, &o, &req), HORA_SUCCESS) << hora_last_error_message();
  ASSERT_EQ(waitAndFree(req), HORA_SUCCESS) << lastMessage();
  EXPECT_EQ(buf, (std::vector<float>{1.0f * size, 2.0f * size, 3.0f * size}));
}

bool has(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// The three float32 shapes of the issue: [2^40, 2^40] wrapped to 0 elements and "succeeded",
// [2^62+1, 4] wrapped to 4 and read 16 bytes, [2^62, 3] wrapped negative and crashed every
// rank (SIGSEGV in the shm allreduce, SIGFPE inside Gloo).
struct Huge {
  std::vector<int64_t> shape;
  int dim;  // the dimension the message names
};
const std::vector<Huge> kIssueShapes = {{{k2e40, k2e40}, 1}, {{k2e62 + 1, 4}, 0}, {{k2e62, 3}, 0}};

TEST_P(Overflow, IssueShapesAreRefusedAtSubmissionByEveryCollective) {
  runThreads(2, [&](int rank, hora_runtime_t rt) {
    float tiny[4] = {1, 2, 3, 4};  // valid, but 16 bytes: nothing may read past it
    float other[4] = {};
    std::vector<int64_t> four = {4};
    DLTensor small = makeTensor(other, dlType(kDLFloat, 32), &four);
    const std::string onRank = " on rank " + std::to_string(rank);
    for (const Huge& h : kIssueShapes) {
      std::vector<int64_t> shape = h.shape;
      DLTensor t = makeTensor(tiny, dlType(kDLFloat, 32), &shape);
      std::string text = "float32[";
      for (size_t i = 0; i < shape.size(); ++i) text += (i ? "," : "") + std::to_string(shape[i]);
      text += "]";
      hora_options_t o;
      hora_options_init(&o);
      o.name = "huge";
      hora_request_t req = nullptr;
      // `where` = "<op> "<name>" on rank <r>, <argument>"
      auto refused = [&](hora_status_t s, const std::string& where) {
        const std::string m = hora_last_error_message();
        EXPECT_EQ(s, HORA_ERR_INVALID_ARGUMENT) << where << ": " << m;
        EXPECT_EQ(req, nullptr) << where;
        EXPECT_TRUE(has(m, where + " " + text + " is too large: at dimension " +
                               std::to_string(h.dim) + " (" + std::to_string(shape[h.dim]) +
                               ") its size passes 2^63-1 bytes"))
            << m;
        EXPECT_TRUE(has(m, "split into smaller ones")) << m;  // what to do
      };
      refused(hora_allreduce_async(rt, &t, &t, &o, &req),
              "allreduce \"huge\"" + onRank + ", input");
      refused(hora_allreduce_async(rt, &small, &t, &o, &req),
              "allreduce \"huge\"" + onRank + ", output");
      const DLTensor* ins[2] = {&small, &t};
      DLTensor* outs[2] = {&small, &t};
      refused(hora_grouped_allreduce_async(rt, 2, ins, outs, &o, &req),
              "grouped allreduce \"huge.1\"" + onRank + ", input");
      refused(hora_broadcast_async(rt, &t, &o, &req), "broadcast \"huge\"" + onRank + ", tensor");
      refused(hora_allgather_async(rt, &t, &o, &req), "allgather \"huge\"" + onRank + ", input");
      refused(hora_alltoall_async(rt, &t, nullptr, 0, &o, &req),
              "alltoall \"huge\"" + onRank + ", input");
      int64_t splits[2] = {shape[0], 0};
      refused(hora_alltoall_async(rt, &t, splits, 2, &o, &req),
              "alltoall \"huge\"" + onRank + ", input");
      refused(hora_reducescatter_async(rt, &t, &o, &req),
              "reducescatter \"huge\"" + onRank + ", input");
    }
    EXPECT_EQ(tiny[0], 1.0f);
    EXPECT_EQ(tiny[3], 4.0f);
    expectUsable(rt, 2, "after.huge");
  });
}

// Each rank's 2^62 one-byte rows fit; together they pass 2^63-1 bytes (the total wrapped
// negative). The coordinator refuses the tensor on every rank with the same message.
TEST_P(Overflow, AllgatherWhoseRowsTogetherOverflowFailsEveryRank) {
  std::vector<std::string> messages(2);
  runThreads(2, [&](int rank, hora_runtime_t rt) {
    uint8_t tiny[8] = {};
    std::vector<int64_t> shape = {k2e62};
    DLTensor t = makeTensor(tiny, dlType(kDLUInt, 8), &shape);
    hora_options_t o;
    hora_options_init(&o);
    o.name = "rows";
    hora_request_t req = nullptr;
    ASSERT_EQ(hora_allgather_async(rt, &t, &o, &req), HORA_SUCCESS) << hora_last_error_message();
    EXPECT_EQ(waitAndFree(req, 30, &messages[rank]), HORA_ERR_INVALID_ARGUMENT) << messages[rank];
    expectUsable(rt, 2, "after.allgather");
  });
  for (const auto& m : messages) {
    EXPECT_TRUE(has(m,
                    "allgather \"rows\" in process set global: the gathered tensor would pass "
                    "2^63-1 bytes (rows of uint8[*]): ranks 0,1 have 4611686018427387904 rows"))
        << m;
    EXPECT_TRUE(has(m, "Gather fewer rows per call")) << m;
  }
  // The same diagnosis on every rank (only the "on rank N" prefix differs).
  auto tail = [](const std::string& m) { return m.substr(m.find(" in process set")); };
  EXPECT_EQ(tail(messages[0]), tail(messages[1]));
}

// Both ranks send all their 2^62 one-byte rows to rank 1, which would receive 2^63.
TEST_P(Overflow, AlltoallReceivingPastTheLimitFailsEveryRank) {
  std::vector<std::string> messages(2);
  runThreads(2, [&](int rank, hora_runtime_t rt) {
    uint8_t tiny[8] = {};
    std::vector<int64_t> shape = {k2e62};
    DLTensor t = makeTensor(tiny, dlType(kDLUInt, 8), &shape);
    hora_options_t o;
    hora_options_init(&o);
    o.name = "skewed";
    int64_t splits[2] = {0, k2e62};
    hora_request_t req = nullptr;
    ASSERT_EQ(hora_alltoall_async(rt, &t, splits, 2, &o, &req), HORA_SUCCESS)
        << hora_last_error_message();
    EXPECT_EQ(waitAndFree(req, 30, &messages[rank]), HORA_ERR_INVALID_ARGUMENT) << messages[rank];
    expectUsable(rt, 2, "after.alltoall");
  });
  for (const auto& m : messages)
    EXPECT_TRUE(has(m,
                    "alltoall \"skewed\" in process set global: what rank 1 receives would "
                    "pass 2^63-1 bytes (rows of uint8[*]): ranks 0,1 have "
                    "4611686018427387904 rows for it"))
        << m;
}

// Splits whose sum wraps around to exactly dimension 0 (2^63-1 + 2^63-1 + 6 = 4 mod 2^64)
// passed the sum check and sent 2^63-1 rows of a 4-row tensor.
TEST_P(Overflow, AlltoallSplitsThatOverflowAreRefusedAtSubmission) {
  runThreads(3, [&](int rank, hora_runtime_t rt) {
    float tiny[4] = {};
    std::vector<int64_t> shape = {4};
    DLTensor t = makeTensor(tiny, dlType(kDLFloat, 32), &shape);
    hora_options_t o;
    hora_options_init(&o);
    o.name = "wrap";
    hora_request_t req = nullptr;
    int64_t wrapping[3] = {kMax, kMax, 6};
    EXPECT_EQ(hora_alltoall_async(rt, &t, wrapping, 3, &o, &req), HORA_ERR_INVALID_ARGUMENT);
    std::string m = hora_last_error_message();
    EXPECT_TRUE(has(m, "alltoall \"wrap\" on rank " + std::to_string(rank) +
                           ": splits overflow int64 at split 1 (9223372036854775807); they must "
                           "sum to dimension 0 (4)"))
        << m;
    int64_t negative[3] = {5, -1, 0};
    EXPECT_EQ(hora_alltoall_async(rt, &t, negative, 3, &o, &req), HORA_ERR_INVALID_ARGUMENT);
    m = hora_last_error_message();
    EXPECT_TRUE(has(m, "split 1 is negative (-1)")) << m;
    EXPECT_EQ(req, nullptr);
    expectUsable(rt, 3, "after.splits");
  });
}

INSTANTIATE_TEST_SUITE_P(Planes, Overflow, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "shm" : "gloo"; });

}  // namespace
