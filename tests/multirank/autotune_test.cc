// Online autotune across ranks (core/autotune.h, controllers/autotune_driver.h):
// results stay exact while the tuner changes the fusion threshold, cycle
// time, shm chunk and cut-over between steps (ranks as threads and as
// processes), every rank applies the same sequence of values (the metrics'
// digest), HORA_AUTOTUNE=0 keeps the configured values, explicit settings
// stay fixed unless HORA_AUTOTUNE=1 is explicit, and the CSV log is written.
#include <gtest/gtest.h>
#include <hora/hora.h>
#include <stdlib.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/spin_wait.h"
#include "rank_harness.h"

namespace {

using htest::makeTensor;
using htest::runProcesses;
using htest::runThreads;
using htest::waitAndFree;

using htest::metrics;

// The "autotune" object of a metrics JSON text.
std::string autotunePart(const std::string& json) {
  const size_t at = json.find("\"autotune\":{");
  if (at == std::string::npos) return "";
  return json.substr(at, json.find('}', at) - at + 1);
}

int64_t field(const std::string& part, const std::string& name) {
  const size_t at = part.find("\"" + name + "\":");
  if (at == std::string::npos) return -1;
  size_t p = at + name.size() + 3;
  if (part[p] == '"') ++p;
  return std::strtoll(part.c_str() + p, nullptr, part.compare(at + 1, 6, "digest") == 0 ? 16 : 10);
}

// One training-like step: tensors of many sizes (one spans several shm
// chunks), the same names every step, submitted last layer first, then all
// waited for and checked exactly. "" or what went wrong.
std::string step(hora_runtime_t rt, int rank, int size, int s) {
  static const int64_t kCounts[] = {1, 7, 1000, 4099, 30000, 65536, 250000, 600000, 3, 1500000};
  constexpr int kTensors = sizeof(kCounts) / sizeof(kCounts[0]);
  std::vector<std::vector<float>> f(kTensors);
  std::vector<std::vector<double>> d(kTensors);
  std::vector<std::vector<int64_t>> shapes(2 * kTensors);
  std::vector<hora_request_t> reqs;
  std::vector<std::string> names;
  for (int i = kTensors - 1; i >= 0; --i) {
    const int64_t n = kCounts[i];
    f[i].resize(n);
    d[i].resize(n);
    for (int64_t k = 0; k < n; ++k) {
      f[i][k] = static_cast<float>((rank + 1) + (k % 7) + s);
      d[i][k] = static_cast<double>((rank + 1) * 3 + (k % 5) + s);
    }
    for (int which = 0; which < 2; ++which) {
      shapes[2 * i + which] = {n};
      DLTensor t =
          which == 0 ? makeTensor(f[i].data(), htest::dlType(kDLFloat, 32), &shapes[2 * i + which])
                     : makeTensor(d[i].data(), htest::dlType(kDLFloat, 64), &shapes[2 * i + which]);
      names.push_back("grad." + std::to_string(i) + (which ? ".f64" : ".f32"));
      hora_options_t o;
      hora_options_init(&o);
      o.name = names.back().c_str();
      o.op = HORA_OP_SUM;
      hora_request_t r = nullptr;
      if (hora_allreduce_async(rt, &t, &t, &o, &r) != HORA_SUCCESS)
        return "submit " + names.back() + ": " + hora_last_error_message();
      reqs.push_back(r);
    }
  }
  std::string err;
  for (size_t j = 0; j < reqs.size(); ++j) {
    std::string msg;
    if (waitAndFree(reqs[j], 60, &msg) != HORA_SUCCESS && err.empty()) err = names[j] + ": " + msg;
  }
  if (!err.empty()) return err;
  const double ranks = size * (size + 1) / 2.0;
  for (int i = 0; i < kTensors; ++i)
    for (int64_t k = 0; k < kCounts[i]; ++k) {
      const double wf = ranks + size * static_cast<double>((k % 7) + s);
      const double wd = 3 * ranks + size * static_cast<double>((k % 5) + s);
      if (f[i][k] != wf || d[i][k] != wd) {
        std::ostringstream o;
        o << "step " << s << " rank " << rank << " grad." << i << "[" << k << "]: got " << f[i][k]
          << "/" << d[i][k] << " want " << wf << "/" << wd;
        return o.str();
      }
    }
  return "";
}

// Env for one test; restored after it (threads share the process environment).
struct Env {
  std::vector<std::string> names;
  Env(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const auto& [k, v] : vars) {
      ::setenv(k, v, 1);
      names.push_back(k);
    }
  }
  ~Env() {
    for (const auto& k : names) ::unsetenv(k.c_str());
  }
};

constexpr int kSteps = 60;

TEST(AutotuneThreads, ExactResultsWhileValuesChangeAndEveryRankAppliesTheSame) {
  const std::string log = "/tmp/hora-autotune-test-" + std::to_string(::getpid()) + ".csv";
  Env env({{"HORA_AUTOTUNE", "1"}, {"HORA_AUTOTUNE_LOG", log.c_str()}});
  constexpr int kSize = 3;
  std::vector<std::string> parts(kSize);
  runThreads(
      kSize,
      [&](int rank, hora_runtime_t rt) {
        for (int s = 0; s < kSteps; ++s) {
          const std::string e = step(rt, rank, kSize, s);
          ASSERT_EQ(e, "") << e;
        }
        parts[rank] = autotunePart(metrics(rt));
      },
      [](hora_config_t& c) {
        c.fusion_threshold_bytes = 64 << 10;  // a bad start: explicit, but HORA_AUTOTUNE=1 is too
        c.cycle_time_ms = 8;
      },
      240);
  for (int r = 0; r < kSize; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r) + ": " + parts[r]);
    EXPECT_NE(parts[r].find("\"enabled\":true"), std::string::npos);
    EXPECT_GE(field(parts[r], "changes"), 3) << "the values must change mid-run";
    // The same sequence of values on every rank, and the same values now.
    EXPECT_EQ(field(parts[r], "digest"), field(parts[0], "digest"));
    for (const char* v : {"fusion_threshold_bytes", "cycle_time_us", "shm_chunk_bytes",
                          "shm_min_bytes", "gloo_bcube_max_bytes"})
      EXPECT_EQ(field(parts[r], v), field(parts[0], v)) << v;
  }
  EXPECT_GE(field(parts[0], "windows"), 20);
  std::ifstream in(log);
  std::string header, line;
  ASSERT_TRUE(std::getline(in, header)) << log;
  EXPECT_EQ(header.rfind("window,search,event,fusion_threshold_bytes", 0), 0u) << header;
  int lines = 0;
  while (std::getline(in, line)) ++lines;
  EXPECT_GE(lines, 20);
  std::remove(log.c_str());
}

TEST(AutotuneThreads, OffKeepsTheConfiguredValues) {
  Env env({{"HORA_AUTOTUNE", "0"}});
  constexpr int kSize = 2;
  std::vector<std::string> parts(kSize);
  runThreads(
      kSize,
      [&](int rank, hora_runtime_t rt) {
        for (int s = 0; s < 30; ++s) {
          const std::string e = step(rt, rank, kSize, s);
          ASSERT_EQ(e, "") << e;
        }
        parts[rank] = autotunePart(metrics(rt));
      },
      [](hora_config_t& c) {
        c.fusion_threshold_bytes = 64 << 10;
        c.cycle_time_ms = 8;
      });
  for (int r = 0; r < kSize; ++r) {
    SCOPED_TRACE(parts[r]);
    EXPECT_NE(parts[r].find("\"enabled\":false"), std::string::npos);
    EXPECT_EQ(field(parts[r], "changes"), 0);
    EXPECT_EQ(field(parts[r], "fusion_threshold_bytes"), 64 << 10);
    EXPECT_EQ(field(parts[r], "cycle_time_us"), 8000);
    // The default: 256 KiB when each of the 2 ranks has a CPU of its own.
    EXPECT_EQ(field(parts[r], "shm_chunk_bytes"),
              hora::usableCpuCount() >= kSize ? 256 << 10 : 1 << 20);
    EXPECT_EQ(parts[r].find("\"windows\""), std::string::npos) << "no tuner ran";
  }
}

TEST(AutotuneThreads, ExplicitSettingsStayFixedByDefault) {
  // HORA_AUTOTUNE unset (on by default): the fusion threshold and cycle time
  // set in the config stay; the shm chunk (not set) may move.
  const std::string log = "/tmp/hora-autotune-pinned-" + std::to_string(::getpid()) + ".csv";
  Env env({{"HORA_AUTOTUNE_LOG", log.c_str()}});
  constexpr int kSize = 2;
  std::vector<std::string> parts(kSize);
  runThreads(
      kSize,
      [&](int rank, hora_runtime_t rt) {
        for (int s = 0; s < 40; ++s) {
          const std::string e = step(rt, rank, kSize, s);
          ASSERT_EQ(e, "") << e;
        }
        parts[rank] = autotunePart(metrics(rt));
      },
      [](hora_config_t& c) {
        c.fusion_threshold_bytes = 1 << 20;
        c.cycle_time_ms = 2;
      });
  EXPECT_EQ(field(parts[0], "fusion_threshold_bytes"), 1 << 20) << parts[0];
  EXPECT_EQ(field(parts[0], "cycle_time_us"), 2000) << parts[0];
  std::ifstream in(log);
  std::string line;
  std::getline(in, line);
  int lines = 0;
  while (std::getline(in, line)) {
    ++lines;
    EXPECT_NE(line.find(",1048576,2000,"), std::string::npos) << line;
  }
  EXPECT_GE(lines, 10);
  std::remove(log.c_str());
}

TEST(AutotuneProcesses, ExactResultsWhileValuesChangeAndEveryRankAppliesTheSame) {
  constexpr int kSize = 3;
  auto results = runProcesses(kSize,
                              [](int rank) {
                                hora_runtime_t rt = nullptr;
                                CHILD_CHECK(hora_init(nullptr, &rt) == HORA_SUCCESS, "init: %s",
                                            hora_last_error_message());
                                for (int s = 0; s < kSteps; ++s) {
                                  const std::string e = step(rt, rank, kSize, s);
                                  CHILD_CHECK(e.empty(), "%s", e.c_str());
                                }
                                std::printf("AUTOTUNE %s\n", autotunePart(metrics(rt)).c_str());
                                std::fflush(stdout);
                                hora_shutdown(rt);
                                return 0;
                              },
                              240, nullptr,
                              {{"HORA_AUTOTUNE", "1"},
                               {"HORA_FUSION_THRESHOLD_BYTES", "65536"},
                               {"HORA_CYCLE_TIME_MS", "8"},
                               {"HORA_SHM_CHUNK_BYTES", "2097152"}});
  std::vector<std::string> parts;
  for (const auto& r : results) {
    ASSERT_EQ(r.exitCode, 0) << r.output;
    const size_t at = r.output.find("AUTOTUNE ");
    ASSERT_NE(at, std::string::npos) << r.output;
    parts.push_back(r.output.substr(at, r.output.find('\n', at) - at));
  }
  for (int r = 0; r < kSize; ++r) {
    SCOPED_TRACE(parts[r]);
    EXPECT_GE(field(parts[r], "changes"), 3);
    EXPECT_EQ(field(parts[r], "digest"), field(parts[0], "digest"));
    EXPECT_EQ(field(parts[r], "shm_chunk_bytes"), field(parts[0], "shm_chunk_bytes"));
    EXPECT_LE(field(parts[r], "shm_chunk_bytes"), 2 << 20) << "never past the segments' slot";
  }
}

}  // namespace
