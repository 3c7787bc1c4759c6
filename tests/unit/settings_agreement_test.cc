// Settings agreement (controllers/settings_agreement.h): the difference text,
// and the protocol over a MemoryStore with members as threads: equal settings
// pass, one differing member fails every member with the same message, a
// missing member is a timeout naming it.
#include "controllers/settings_agreement.h"

#include <functional>
#include <thread>

#include "core/memory_store.h"
#include "gtest/gtest.h"

namespace hora {
namespace {

const SharedSettings kBase = {{"HORA_GPU_BACKEND", "auto"}, {"HORA_CACHE_CAPACITY", "1024"}};

TEST(SettingsAgreement, DiffNamesEverySettingRanksAndValues) {
  EXPECT_EQ(diffSettings(kBase, 3, encodeSettings(kBase), 0), "");
  SharedSettings other = {{"HORA_GPU_BACKEND", "gloo"}, {"HORA_CACHE_CAPACITY", "1024"}};
  EXPECT_EQ(diffSettings(other, 3, encodeSettings(kBase), 0),
            "HORA_GPU_BACKEND is 'gloo' on rank 3 but 'auto' on rank 0");
  SharedSettings fewer = {{"HORA_CACHE_CAPACITY", "16"}};
  EXPECT_EQ(diffSettings(fewer, 1, encodeSettings(kBase), 0),
            "HORA_CACHE_CAPACITY is '16' on rank 1 but '1024' on rank 0; "
            "HORA_GPU_BACKEND is (unset) on rank 1 but 'auto' on rank 0");
}

// Runs the protocol on `n` members; member r uses settings(r).
std::vector<Status> agree(int n, const std::function<SharedSettings(int)>& settings,
                          int absent = -1) {
  auto store = std::make_shared<MemoryStore>();
  std::vector<int> global(n);
  for (int r = 0; r < n; ++r) global[r] = 10 + r;  // set ranks differ from global ranks
  std::vector<Status> out(n);
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r) {
    if (r == absent) continue;
    ts.emplace_back([&, r] {
      out[r] =
          agreeOnSettings(*store, r, global, settings(r), std::chrono::milliseconds(500), "test");
    });
  }
  for (auto& t : ts) t.join();
  return out;
}

TEST(SettingsAgreement, EqualSettingsPassAtEveryWorldSize) {
  for (int n = 1; n <= 4; ++n)
    for (const Status& s : agree(n, [](int) { return kBase; }))
      EXPECT_TRUE(s.isOk()) << s.message();
}

TEST(SettingsAgreement, OneDifferingMemberFailsEveryMemberWithTheSameMessage) {
  auto out = agree(4, [](int r) {
    SharedSettings s = kBase;
    if (r == 2) s[0].second = "nccl";
    return s;
  });
  for (const Status& s : out) {
    EXPECT_EQ(s.code(), Code::kInvalidArgument);
    EXPECT_NE(s.message().find("HORA_GPU_BACKEND is 'nccl' on rank 12 but 'auto' on rank 10"),
              std::string::npos)
        << s.message();
    EXPECT_EQ(s.message(), out[0].message());
  }
}

TEST(SettingsAgreement, AMissingMemberIsATimeoutNamingIt) {
  auto out = agree(
      3, [](int) { return kBase; }, /*absent=*/2);
  EXPECT_EQ(out[0].code(), Code::kTimeout);
  EXPECT_NE(out[0].message().find("rank 12 did not arrive"), std::string::npos) << out[0].message();
  EXPECT_EQ(out[1].code(), Code::kTimeout) << out[1].message();
  EXPECT_NE(out[1].message().find("rank 12 did not arrive"), std::string::npos)
      << "every member names the missing rank: " << out[1].message();
}

}  // namespace
}  // namespace hora
