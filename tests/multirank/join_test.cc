// Join (uneven inputs) with every collective kind, issue 13: world sizes 2-4,
// every rank joining first, the response cache on and off, each scenario
// under a deadline so a hang fails instead of blocking the suite.
//
// What a joined rank does (docs/architecture.md, "Join"):
//   allreduce      contributes the op's identity (sum: zeros)
//   allgather      contributes zero rows: the others get the gather of theirs
//   reducescatter  contributes the identity, like allreduce
//   broadcast      receives nothing; from a joined root it is an error on
//                  every rank that submitted it
//   alltoall       an error on every rank that submitted it
#include <algorithm>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "rank_harness.h"

using namespace htest;

namespace {

constexpr double kDeadlineS = 60;  // per world: a hang fails the scenario

hora_options_t opts(const std::string& name, hora_reduce_op_t op = HORA_OP_SUM, int32_t root = 0) {
  hora_options_t o;
  hora_options_init(&o);
  o.name = name.c_str();
  o.op = op;
  o.root = root;
  return o;
}

hora_status_t allreduce(hora_runtime_t rt, std::vector<float>& v, const std::string& name,
                        hora_request_t* req, hora_reduce_op_t op = HORA_OP_SUM) {
  std::vector<int64_t> shape = {static_cast<int64_t>(v.size())};
  DLTensor t = makeTensor(v.data(), dlType(kDLFloat, 32), &shape);
  hora_options_t o = opts(name, op);
  return hora_allreduce_async(rt, &t, &t, &o, req);
}

// rank+1 rows of 3 floats: row i of rank r holds 100 r + i.
std::vector<float> gatherRows(int rank) {
  std::vector<float> v;
  for (int i = 0; i <= rank; ++i)
    for (int c = 0; c < 3; ++c) v.push_back(100.0f * rank + i);
  return v;
}

// Submits an allgather of gatherRows(rank), waits, returns the rows.
std::vector<float> allgather(hora_runtime_t rt, int rank, const std::string& name) {
  std::vector<float> v = gatherRows(rank);
  std::vector<int64_t> shape = {rank + 1, 3};
  DLTensor t = makeTensor(v.data(), dlType(kDLFloat, 32), &shape);
  hora_options_t o = opts(name);
  hora_request_t req;
  EXPECT_EQ(hora_allgather_async(rt, &t, &o, &req), HORA_SUCCESS) << hora_last_error_message();
  EXPECT_EQ(hora_wait(req, 30), HORA_SUCCESS) << name << ": " << hora_last_error_message();
  const DLTensor* out = nullptr;
  std::vector<float> rows;
  if (hora_request_output(req, &out) == HORA_SUCCESS && out) {
    EXPECT_EQ(out->ndim, 2);
    const int64_t n = out->shape[0] * out->shape[1];
    const float* p = static_cast<const float*>(out->data);
    rows.assign(p, p + n);
  }
  hora_request_free(req);
  return rows;
}

void joinAndExpectLast(hora_runtime_t rt, int expectLast) {
  hora_request_t j;
  ASSERT_EQ(hora_join_async(rt, nullptr, &j), HORA_SUCCESS) << hora_last_error_message();
  ASSERT_EQ(hora_wait(j, 30), HORA_SUCCESS) << hora_last_error_message();
  int32_t last = -1;
  EXPECT_EQ(hora_request_join_last_rank(j, &last), HORA_SUCCESS);
  if (expectLast >= 0) {
    EXPECT_EQ(last, expectLast);
  }
  hora_request_free(j);
}

template <typename Body>
void forEachWorld(Body body) {
  for (int size = 2; size <= 4; ++size)
    for (int joiner = 0; joiner < size; ++joiner)
      for (int cache : {0, 1024}) {
        SCOPED_TRACE("size " + std::to_string(size) + ", rank " + std::to_string(joiner) +
                     " joins first, cache capacity " + std::to_string(cache));
        runThreads(
            size, [&](int rank, hora_runtime_t rt) { body(size, joiner, rank, rt); },
            [cache](hora_config_t& c) { c.cache_capacity = cache; }, kDeadlineS);
      }
}

// The case: the others allgather while one rank has joined; the
// joined rank contributes no rows. Mixed with cached allreduces and a
// broadcast from a rank that did not join.
TEST(Join, OthersAllgatherAllreduceAndBroadcastWhileARankHasJoined) {
  forEachWorld([](int size, int joiner, int rank, hora_runtime_t rt) {
    // Warm the cache: every rank, before anyone joins.
    std::vector<float> w(5, float(rank + 1));
    hora_request_t req;
    ASSERT_EQ(allreduce(rt, w, "warm", &req), HORA_SUCCESS);
    ASSERT_EQ(waitAndFree(req, 30), HORA_SUCCESS) << lastMessage();
    std::vector<float> all = allgather(rt, rank, "rows.before");
    ASSERT_EQ(all.size(), size_t(3 * size * (size + 1) / 2));
    if (rank == joiner) return joinAndExpectLast(rt, -1);

    for (int step = 0; step < 3; ++step) {
      // Allgather: the joined rank's slice is empty.
      std::vector<float> got = allgather(rt, rank, "rows");
      std::vector<float> want;
      for (int r = 0; r < size; ++r)
        if (r != joiner) {
          std::vector<float> g = gatherRows(r);
          want.insert(want.end(), g.begin(), g.end());
        }
      EXPECT_EQ(got, want) << "step " << step;
      // A cached allreduce: the joined rank contributes zeros.
      std::vector<float> v(5, float(rank + 1));
      ASSERT_EQ(allreduce(rt, v, "warm", &req), HORA_SUCCESS) << hora_last_error_message();
      ASSERT_EQ(waitAndFree(req, 30), HORA_SUCCESS) << lastMessage();
      EXPECT_FLOAT_EQ(v[4], size * (size + 1) / 2.0f - (joiner + 1)) << "step " << step;
      // Broadcast from the lowest rank that did not join.
      const int root = joiner == 0 ? 1 : 0;
      std::vector<float> b(4, float(rank));
      std::vector<int64_t> bs = {4};
      DLTensor bt = makeTensor(b.data(), dlType(kDLFloat, 32), &bs);
      hora_options_t o = opts("bcast", HORA_OP_SUM, root);
      ASSERT_EQ(hora_broadcast_async(rt, &bt, &o, &req), HORA_SUCCESS) << hora_last_error_message();
      ASSERT_EQ(waitAndFree(req, 30), HORA_SUCCESS) << lastMessage();
      EXPECT_EQ(b[3], float(root)) << "step " << step;
    }
    // The last of the others to join is reported; make it deterministic.
    joinAndExpectLast(rt, -1);
  });
}

// A broadcast whose root has joined cannot send: every rank that submitted it
// fails at once with a message naming the tensor, the root and the join;
// the set goes on (an allreduce after it works) and the join completes.
TEST(Join, BroadcastFromAJoinedRootFailsOnEveryRankNamingTheRoot) {
  forEachWorld([](int size, int joiner, int rank, hora_runtime_t rt) {
    hora_request_t req;
    std::vector<float> w(3, 1.0f);
    ASSERT_EQ(allreduce(rt, w, "warm", &req), HORA_SUCCESS);
    ASSERT_EQ(waitAndFree(req, 30), HORA_SUCCESS) << lastMessage();
    // The same broadcast once before the join, so it is in the cache when on.
    std::vector<float> b(4, float(rank));
    std::vector<int64_t> bs = {4};
    DLTensor bt = makeTensor(b.data(), dlType(kDLFloat, 32), &bs);
    hora_options_t o = opts("weights", HORA_OP_SUM, joiner);
    ASSERT_EQ(hora_broadcast_async(rt, &bt, &o, &req), HORA_SUCCESS);
    ASSERT_EQ(waitAndFree(req, 30), HORA_SUCCESS) << lastMessage();
    EXPECT_EQ(b[0], float(joiner));
    if (rank == joiner) return joinAndExpectLast(rt, -1);

    ASSERT_EQ(hora_broadcast_async(rt, &bt, &o, &req), HORA_SUCCESS) << hora_last_error_message();
    std::string msg;
    EXPECT_EQ(waitAndFree(req, 30, &msg), HORA_ERR_INVALID_USAGE) << msg;
    EXPECT_NE(msg.find("broadcast \"weights\""), std::string::npos) << msg;
    EXPECT_NE(msg.find("root rank " + std::to_string(joiner)), std::string::npos) << msg;
    EXPECT_NE(msg.find("joined"), std::string::npos) << msg;
    // The set is healthy: the others go on.
    std::vector<float> v(3, 1.0f);
    ASSERT_EQ(allreduce(rt, v, "warm", &req), HORA_SUCCESS) << hora_last_error_message();
    ASSERT_EQ(waitAndFree(req, 30), HORA_SUCCESS) << lastMessage();
    EXPECT_FLOAT_EQ(v[0], float(size - 1));
    joinAndExpectLast(rt, -1);
  });
}

// Alltoall cannot run with a joined rank (it would have to receive); every
// rank that submitted it fails with the joined ranks named. Reducescatter
// runs, the joined rank contributing zeros.
TEST(Join, AlltoallFailsAndReducescatterSumsTheOthersWhileARankHasJoined) {
  forEachWorld([](int size, int joiner, int rank, hora_runtime_t rt) {
    if (rank == joiner) return joinAndExpectLast(rt, -1);
    std::vector<int64_t> shape = {size, 2};
    std::vector<float> v(2 * size, float(rank + 1));
    DLTensor t = makeTensor(v.data(), dlType(kDLFloat, 32), &shape);
    hora_options_t o = opts("a2a");
    hora_request_t req;
    ASSERT_EQ(hora_alltoall_async(rt, &t, nullptr, size, &o, &req), HORA_SUCCESS)
        << hora_last_error_message();
    std::string msg;
    EXPECT_EQ(waitAndFree(req, 30, &msg), HORA_ERR_INVALID_USAGE) << msg;
    EXPECT_NE(msg.find("alltoall \"a2a\""), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(joiner)), std::string::npos) << msg;

    o = opts("rs");
    ASSERT_EQ(hora_reducescatter_async(rt, &t, &o, &req), HORA_SUCCESS)
        << hora_last_error_message();
    ASSERT_EQ(hora_wait(req, 30), HORA_SUCCESS) << hora_last_error_message();
    const DLTensor* out = nullptr;
    ASSERT_EQ(hora_request_output(req, &out), HORA_SUCCESS);
    ASSERT_EQ(out->shape[0], 1);  // one row each
    EXPECT_FLOAT_EQ(static_cast<const float*>(out->data)[1],
                    size * (size + 1) / 2.0f - (joiner + 1));
    hora_request_free(req);
    joinAndExpectLast(rt, -1);
  });
}

// Allreduces large enough for the data plane (above the inline cut-over;
// one small shared-memory chunk, and one split into parts), every op, one
// tensor and two fused, while a rank has joined: the joined rank's identity
// is combined in as its own operand, in rank order, so the others get
// exactly the reduction of theirs.
TEST(Join, DataPlaneAllreducesOfEveryOpWhileARankHasJoined) {
  forEachWorld([](int size, int joiner, int rank, hora_runtime_t rt) {
    if (rank == joiner) return joinAndExpectLast(rt, -1);
    const hora_reduce_op_t ops[] = {HORA_OP_SUM, HORA_OP_MIN, HORA_OP_MAX, HORA_OP_PRODUCT};
    auto value = [](int r, size_t i) { return float(1 + (r + i) % 2) * (i % 5 == 0 ? -1 : 1); };
    for (size_t count : {size_t{4000}, size_t{70000}}) {
      for (hora_reduce_op_t op : ops) {
        std::vector<float> a(count), b(count / 2 + 1);
        for (size_t i = 0; i < a.size(); ++i) a[i] = value(rank, i);
        for (size_t i = 0; i < b.size(); ++i) b[i] = value(rank, i + 1);
        const std::string name = "dp." + std::to_string(count) + "." + std::to_string(op);
        hora_request_t ra, rb;
        ASSERT_EQ(allreduce(rt, a, name + ".a", &ra, op), HORA_SUCCESS) << lastMessage();
        ASSERT_EQ(allreduce(rt, b, name + ".b", &rb, op), HORA_SUCCESS) << lastMessage();
        ASSERT_EQ(waitAndFree(ra, 30), HORA_SUCCESS) << lastMessage();
        ASSERT_EQ(waitAndFree(rb, 30), HORA_SUCCESS) << lastMessage();
        auto want = [&](size_t i) {
          float w = op == HORA_OP_SUM ? 0.0f : op == HORA_OP_PRODUCT ? 1.0f : value(rank, i);
          for (int r = 0; r < size; ++r) {
            if (r == joiner) continue;
            const float x = value(r, i);
            w = op == HORA_OP_SUM       ? w + x
                : op == HORA_OP_PRODUCT ? w * x
                : op == HORA_OP_MIN     ? std::min(w, x)
                                        : std::max(w, x);
          }
          return w;
        };
        for (size_t i = 0; i < a.size(); ++i)
          ASSERT_EQ(a[i], want(i)) << name << " rank " << rank << " [" << i << "]";
        for (size_t i = 0; i < b.size(); ++i)
          ASSERT_EQ(b[i], want(i + 1)) << name << ".b rank " << rank << " [" << i << "]";
      }
    }
    joinAndExpectLast(rt, -1);
  });
}

// Every rank joins in turn, in one job: join completes each round and
// reports the last rank to join; collectives keep working between rounds.
TEST(Join, EveryRankJoinsFirstInTurnInOneJob) {
  for (int size = 2; size <= 4; ++size)
    for (int cache : {0, 1024}) {
      SCOPED_TRACE("size " + std::to_string(size) + ", cache " + std::to_string(cache));
      runThreads(
          size,
          [&](int rank, hora_runtime_t rt) {
            for (int first = 0; first < size; ++first) {
              if (rank != first) {
                std::vector<float> v(7, 1.0f);
                hora_request_t req;
                ASSERT_EQ(allreduce(rt, v, "grad", &req), HORA_SUCCESS);
                ASSERT_EQ(waitAndFree(req, 30), HORA_SUCCESS) << lastMessage();
                EXPECT_FLOAT_EQ(v[6], float(size - 1));
                std::vector<float> g = allgather(rt, rank, "g");
                EXPECT_EQ(g.size(), size_t(3 * (size * (size + 1) / 2 - (first + 1))));
              }
              hora_request_t j;
              ASSERT_EQ(hora_join_async(rt, nullptr, &j), HORA_SUCCESS);
              ASSERT_EQ(hora_wait(j, 30), HORA_SUCCESS) << hora_last_error_message();
              int32_t last = -1;
              EXPECT_EQ(hora_request_join_last_rank(j, &last), HORA_SUCCESS);
              EXPECT_NE(last, first) << "the first to join cannot be the last";
              hora_request_free(j);
            }
          },
          [cache](hora_config_t& c) { c.cache_capacity = cache; }, kDeadlineS);
    }
}

}  // namespace
