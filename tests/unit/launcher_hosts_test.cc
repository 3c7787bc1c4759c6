// Unit tests for horarun's hosts (launcher/hosts.h): -H host lists, hostfiles, rank assignment
// (local/cross rank and size as horovodrun assigns them) and isLocalHost. Pure logic, except
// hostfiles written to a temporary directory.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "launcher/hosts.h"

namespace horarun {
namespace {

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

std::vector<std::pair<std::string, int>> pairs(const std::vector<HostSpec>& hosts) {
  std::vector<std::pair<std::string, int>> out;
  for (const auto& h : hosts) out.emplace_back(h.name, h.slots);
  return out;
}

using Pairs = std::vector<std::pair<std::string, int>>;

// ---- -H host lists ----

TEST(HostListTest, ParsesNamesAndSlotsInOrder) {
  std::vector<HostSpec> hosts;
  std::string error;
  ASSERT_TRUE(parseHostList("a:2,b:4,c", &hosts, &error)) << error;
  EXPECT_EQ(pairs(hosts), (Pairs{{"a", 2}, {"b", 4}, {"c", 1}}));
}

TEST(HostListTest, AcceptsAddressesAndNameCharacters) {
  std::vector<HostSpec> hosts;
  std::string error;
  ASSERT_TRUE(parseHostList("10.0.0.1:4,node-1.example_x:3,localhost", &hosts, &error)) << error;
  EXPECT_EQ(pairs(hosts), (Pairs{{"10.0.0.1", 4}, {"node-1.example_x", 3}, {"localhost", 1}}));
}

TEST(HostListTest, SlotsAreDecimalWithAtMostSixDigits) {
  std::vector<HostSpec> hosts;
  std::string error;
  ASSERT_TRUE(parseHostList("a:007,b:999999", &hosts, &error)) << error;
  EXPECT_EQ(pairs(hosts), (Pairs{{"a", 7}, {"b", 999999}}));
  hosts.clear();
  EXPECT_FALSE(parseHostList("a:1000000", &hosts, &error));
  EXPECT_TRUE(contains(error, "slots must be a positive number")) << error;
}

TEST(HostListTest, EmptyEntriesAreSkipped) {
  // A trailing, leading or doubled comma is tolerated, not reported.
  for (const char* text : {"a:2,", ",a:2", "a:2,,b", ",,a:2,,,b,"}) {
    SCOPED_TRACE(text);
    std::vector<HostSpec> hosts;
    std::string error;
    ASSERT_TRUE(parseHostList(text, &hosts, &error)) << error;
    EXPECT_EQ(hosts.at(0).name, "a");
    EXPECT_EQ(hosts.at(0).slots, 2);
  }
}

TEST(HostListTest, NoHostsIsAnError) {
  for (const char* text : {"", ",", ",,,"}) {
    SCOPED_TRACE(text);
    std::vector<HostSpec> hosts;
    std::string error;
    EXPECT_FALSE(parseHostList(text, &hosts, &error));
    EXPECT_EQ(error, "-H '" + std::string(text) + "' names no hosts");
  }
}

TEST(HostListTest, BadSlotsAreRejectedNamingTheEntry) {
  for (const char* entry :
       {"a:0", "a:-1", "a:x", "a:", "a:1.5", "a:+2", "a: 2", "a:2x", "a:0x10"}) {
    SCOPED_TRACE(entry);
    std::vector<HostSpec> hosts;
    std::string error;
    EXPECT_FALSE(parseHostList(std::string("b:1,") + entry + ",c", &hosts, &error));
    EXPECT_EQ(error, "host entry '" + std::string(entry) +
                         "': slots must be a positive number (host:slots)");
  }
}

TEST(HostListTest, BadNamesAreRejectedNamingTheEntry) {
  // ":2" is an empty name; "a:2:3" is the name "a:2" with 3 slots; "::1" (IPv6) cannot be
  // written in a host list.
  for (const char* entry : {":2", "a b:2", "a:2:3", "::1", "a/b", "a@b", "host!"}) {
    SCOPED_TRACE(entry);
    std::vector<HostSpec> hosts;
    std::string error;
    EXPECT_FALSE(parseHostList(entry, &hosts, &error));
    EXPECT_TRUE(contains(error, "host entry '" + std::string(entry) + "'")) << error;
    EXPECT_TRUE(contains(error, "host names may contain")) << error;
  }
  std::vector<HostSpec> hosts;
  std::string error;
  EXPECT_FALSE(parseHostList("a:2, b:4", &hosts, &error)) << "a space after the comma";
  EXPECT_TRUE(contains(error, "' b:4'")) << error;
}

// Was a bug: a host named twice was two hosts, so two ranks on one machine both got local
// rank 0 (and picked the same GPU). Now its slots are added up, in its first place, with a note.
TEST(HostListTest, RepeatedHostsAreMergedWithANote) {
  std::vector<HostSpec> hosts;
  std::vector<std::string> notes;
  std::string error;
  ASSERT_TRUE(parseHostList("a:2,b,a:3,c:1,b,a", &hosts, &error, &notes)) << error;
  EXPECT_EQ(pairs(hosts), (Pairs{{"a", 6}, {"b", 2}, {"c", 1}}));
  EXPECT_EQ(notes, (std::vector<std::string>{
                       "-H: host 'a' is listed 3 times: its slots are added up, 2+3+1 = 6",
                       "-H: host 'b' is listed 2 times: its slots are added up, 1+1 = 2"}));
  // The example; and no note without a repetition, nor without a place for notes.
  hosts.clear(), notes.clear();
  ASSERT_TRUE(parseHostList("host1:2,host1:2", &hosts, &error, &notes)) << error;
  EXPECT_EQ(pairs(hosts), (Pairs{{"host1", 4}}));
  EXPECT_EQ(notes.size(), 1u);
  hosts.clear(), notes.clear();
  ASSERT_TRUE(parseHostList("a:2,b:2", &hosts, &error, &notes)) << error;
  EXPECT_TRUE(notes.empty());
  hosts.clear();
  ASSERT_TRUE(parseHostList("a,a", &hosts, &error)) << error;
  EXPECT_EQ(pairs(hosts), (Pairs{{"a", 2}}));
}

TEST(HostListTest, MergedSlotsHaveTheSameLimitAsOneEntry) {
  std::vector<HostSpec> hosts;
  std::string error;
  ASSERT_TRUE(parseHostList("a:999998,a:1", &hosts, &error)) << error;
  EXPECT_EQ(pairs(hosts), (Pairs{{"a", 999999}}));
  hosts.clear();
  EXPECT_FALSE(parseHostList("a:999999,a:1", &hosts, &error));
  EXPECT_EQ(error,
            "-H entry 'a:1': host 'a' is listed again and its slots add up to more than 999999");
}

// Names are compared as written; two names of one machine stay two hosts.
TEST(HostListTest, DifferentNamesOfOneMachineAreNotMerged) {
  std::vector<HostSpec> hosts;
  std::vector<std::string> notes;
  std::string error;
  ASSERT_TRUE(parseHostList("localhost:1,127.0.0.1:1", &hosts, &error, &notes)) << error;
  EXPECT_EQ(pairs(hosts), (Pairs{{"localhost", 1}, {"127.0.0.1", 1}}));
  EXPECT_TRUE(notes.empty());
}

// ---- hostfiles ----

class HostfileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/hora_hostfile_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    for (const auto& f : files_) std::remove(f.c_str());
    rmdir(dir_.c_str());
  }
  std::string write(const std::string& name, const std::string& text) {
    std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    files_.push_back(path);
    return path;
  }
  std::string dir_;
  std::vector<std::string> files_;
};

TEST_F(HostfileTest, ReadsSlotsAndColonFormsWithCommentsAndBlankLines) {
  std::string path = write("hosts",
                           "# cluster A\n"
                           "node1 slots=4\n"
                           "\n"
                           "node2:2      # two GPUs\n"
                           "   \t\n"
                           "  node3\n"
                           "10.0.0.5 slots=8\n"
                           "node6");  // no final newline
  std::vector<HostSpec> hosts;
  std::string error;
  ASSERT_TRUE(parseHostfile(path, &hosts, &error)) << error;
  EXPECT_EQ(pairs(hosts),
            (Pairs{{"node1", 4}, {"node2", 2}, {"node3", 1}, {"10.0.0.5", 8}, {"node6", 1}}));
}

TEST_F(HostfileTest, LastSlotsWins) {
  std::string path = write("hosts", "a:2 slots=3\nb slots=2 slots=5\n");
  std::vector<HostSpec> hosts;
  std::string error;
  ASSERT_TRUE(parseHostfile(path, &hosts, &error)) << error;
  EXPECT_EQ(pairs(hosts), (Pairs{{"a", 3}, {"b", 5}}));
}

TEST_F(HostfileTest, RepeatedHostsAreMergedNamingTheLines) {
  std::string path = write("hosts", "a slots=2\nb slots=1\n# a again\na:4\na slots=1\n");
  std::vector<HostSpec> hosts;
  std::vector<std::string> notes;
  std::string error;
  ASSERT_TRUE(parseHostfile(path, &hosts, &error, &notes)) << error;
  EXPECT_EQ(pairs(hosts), (Pairs{{"a", 7}, {"b", 1}}));
  EXPECT_EQ(notes, (std::vector<std::string>{"hostfile '" + path +
                                             "': host 'a' is listed 3 times (lines 1, 4, 5): its "
                                             "slots are added up, 2+4+1 = 7"}));
  std::string big = write("big", "a slots=999999\na\n");
  hosts.clear();
  EXPECT_FALSE(parseHostfile(big, &hosts, &error));
  EXPECT_EQ(error, big + ":2: host 'a' is listed again and its slots add up to more than 999999");
}

TEST_F(HostfileTest, BadLinesNameTheFileAndLine) {
  struct Case {
    const char* line;
    const char* message;
  };
  const Case cases[] = {
      {"node1 slots=0", "expected 'host slots=N', got 'slots=0'"},
      {"node1 slots=-2", "expected 'host slots=N', got 'slots=-2'"},
      {"node1 slots=x", "expected 'host slots=N', got 'slots=x'"},
      {"node1 slots=", "expected 'host slots=N', got 'slots='"},
      {"node1 4", "expected 'host slots=N', got '4'"},
      {"node1 slots = 4", "expected 'host slots=N', got 'slots'"},
      {"node1 max_slots=4", "expected 'host slots=N', got 'max_slots=4'"},
      {"node1:0", "host entry 'node1:0': slots must be a positive number"},
      {"node1:x slots=2", "host entry 'node1:x': slots must be a positive number"},
      {"no/de slots=2", "host entry 'no/de': host names may contain"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.line);
    std::string path = write("bad", std::string("# header\ngood slots=1\n\n") + c.line + "\n");
    std::vector<HostSpec> hosts;
    std::string error;
    EXPECT_FALSE(parseHostfile(path, &hosts, &error));
    EXPECT_EQ(error.rfind(path + ":4: ", 0), 0u) << error;
    EXPECT_TRUE(contains(error, c.message)) << error;
  }
}

TEST_F(HostfileTest, EndlessOrHugeFilesAreRefusedWithBoundedMemory) {
  // /dev/zero never ends and has no newline: read unbounded, it grew horarun's
  // memory until it was killed. Now it is refused after kMaxHostfileBytes.
  std::vector<HostSpec> hosts;
  std::string error;
  EXPECT_FALSE(parseHostfile("/dev/zero", &hosts, &error));
  EXPECT_TRUE(contains(error, "hostfile '/dev/zero' is longer than 32 MiB")) << error;
  // A regular file one byte over the limit is refused too; one at the limit
  // is read (a host, then one long comment).
  std::string body = "n slots=2\n";
  body.append(kMaxHostfileBytes - body.size(), '#');
  std::string at = write("at_limit", body);
  EXPECT_TRUE(parseHostfile(at, &hosts, &error)) << error;
  EXPECT_EQ(pairs(hosts), (Pairs{{"n", 2}}));
  std::string over = write("over_limit", body + "\n");
  hosts.clear();
  EXPECT_FALSE(parseHostfile(over, &hosts, &error));
  EXPECT_TRUE(contains(error, "is longer than 32 MiB")) << error;
}

TEST_F(HostfileTest, CrlfLineEndingsAreAccepted) {
  std::string path = write("crlf", "node1 slots=2\r\n# comment\r\n\r\nnode2\r\n");
  std::vector<HostSpec> hosts;
  std::string error;
  ASSERT_TRUE(parseHostfile(path, &hosts, &error)) << error;
  EXPECT_EQ(pairs(hosts), (Pairs{{"node1", 2}, {"node2", 1}}));
}

TEST_F(HostfileTest, MissingFileIsNamed) {
  std::vector<HostSpec> hosts;
  std::string error;
  std::string path = dir_ + "/does-not-exist";
  EXPECT_FALSE(parseHostfile(path, &hosts, &error));
  EXPECT_EQ(error, "cannot read hostfile '" + path + "'");
}

TEST_F(HostfileTest, EmptyOrCommentOnlyFileNamesNoHosts) {
  for (const char* text : {"", "\n\n", "# only a comment\n   # another\n"}) {
    SCOPED_TRACE(text);
    std::string path = write("empty", text);
    std::vector<HostSpec> hosts;
    std::string error;
    EXPECT_FALSE(parseHostfile(path, &hosts, &error));
    EXPECT_EQ(error, "hostfile '" + path + "' names no hosts");
  }
}

// ---- rank assignment ----

struct Expected {
  int rank, localRank, localSize, crossRank, crossSize, hostIndex;
  const char* host;
};

void expectSlots(const std::vector<Slot>& got, int np, const std::vector<Expected>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE("rank " + std::to_string(i));
    const auto& s = got[i];
    const auto& w = want[i];
    EXPECT_EQ(s.rank, w.rank);
    EXPECT_EQ(s.size, np);
    EXPECT_EQ(s.localRank, w.localRank);
    EXPECT_EQ(s.localSize, w.localSize);
    EXPECT_EQ(s.crossRank, w.crossRank);
    EXPECT_EQ(s.crossSize, w.crossSize);
    EXPECT_EQ(s.hostIndex, w.hostIndex);
    EXPECT_EQ(s.host, w.host);
  }
}

TEST(AssignSlotsTest, FillsHostsInOrderWithHorovodLocalAndCrossRanks) {
  std::vector<HostSpec> hosts = {{"a", 2}, {"b", 4}, {"c", 1}};
  std::vector<Slot> slots;
  std::string error;
  ASSERT_TRUE(assignSlots(hosts, 7, &slots, &error)) << error;
  // Local rank 0 exists on a, b, c; local rank 1 on a, b; local ranks 2 and 3 only on b.
  expectSlots(slots, 7,
              {
                  {0, 0, 2, 0, 3, 0, "a"},
                  {1, 1, 2, 0, 2, 0, "a"},
                  {2, 0, 4, 1, 3, 1, "b"},
                  {3, 1, 4, 1, 2, 1, "b"},
                  {4, 2, 4, 0, 1, 1, "b"},
                  {5, 3, 4, 0, 1, 1, "b"},
                  {6, 0, 1, 2, 3, 2, "c"},
              });
}

TEST(AssignSlotsTest, ASmallHostInTheMiddle) {
  std::vector<HostSpec> hosts = {{"a", 1}, {"b", 3}, {"c", 2}};
  std::vector<Slot> slots;
  std::string error;
  ASSERT_TRUE(assignSlots(hosts, 6, &slots, &error)) << error;
  expectSlots(slots, 6,
              {
                  {0, 0, 1, 0, 3, 0, "a"},
                  {1, 0, 3, 1, 3, 1, "b"},
                  {2, 1, 3, 0, 2, 1, "b"},
                  {3, 2, 3, 0, 1, 1, "b"},
                  {4, 0, 2, 2, 3, 2, "c"},
                  {5, 1, 2, 1, 2, 2, "c"},
              });
}

TEST(AssignSlotsTest, LastHostPartlyUsedAndHostsWithoutRanksDropped) {
  std::vector<HostSpec> hosts = {{"a", 2}, {"b", 4}, {"c", 1}, {"d", 8}};
  std::vector<Slot> slots;
  std::string error;
  ASSERT_TRUE(assignSlots(hosts, 4, &slots, &error)) << error;
  // b gets 2 of its 4 slots (local size 2); c and d get nothing and count for no cross size.
  expectSlots(slots, 4,
              {
                  {0, 0, 2, 0, 2, 0, "a"},
                  {1, 1, 2, 0, 2, 0, "a"},
                  {2, 0, 2, 1, 2, 1, "b"},
                  {3, 1, 2, 1, 2, 1, "b"},
              });
}

TEST(AssignSlotsTest, OneHost) {
  std::vector<Slot> slots;
  std::string error;
  ASSERT_TRUE(assignSlots({{"localhost", 4}}, 3, &slots, &error)) << error;
  expectSlots(slots, 3,
              {
                  {0, 0, 3, 0, 1, 0, "localhost"},
                  {1, 1, 3, 0, 1, 0, "localhost"},
                  {2, 2, 3, 0, 1, 0, "localhost"},
              });
}

TEST(AssignSlotsTest, OneSlotPerHost) {
  std::vector<Slot> slots;
  std::string error;
  ASSERT_TRUE(assignSlots({{"a", 1}, {"b", 1}, {"c", 1}}, 3, &slots, &error)) << error;
  expectSlots(slots, 3,
              {
                  {0, 0, 1, 0, 3, 0, "a"},
                  {1, 0, 1, 1, 3, 1, "b"},
                  {2, 0, 1, 2, 3, 2, "c"},
              });
}

TEST(AssignSlotsTest, TooFewSlotsIsAnError) {
  std::vector<Slot> slots;
  std::string error;
  EXPECT_FALSE(assignSlots({{"a", 2}, {"b", 4}, {"c", 1}}, 8, &slots, &error));
  EXPECT_EQ(error, "-np 8 needs 8 slots but the hosts offer 7");
  EXPECT_FALSE(assignSlots({}, 1, &slots, &error));
  EXPECT_EQ(error, "-np 1 needs 1 slots but the hosts offer 0");
  EXPECT_TRUE(slots.empty());
}

TEST(AssignSlotsTest, NonPositiveNpIsAnError) {
  std::vector<Slot> slots;
  std::string error;
  EXPECT_FALSE(assignSlots({{"a", 2}}, 0, &slots, &error));
  EXPECT_FALSE(assignSlots({{"a", 2}}, -1, &slots, &error));
}

TEST(AssignSlotsTest, ReplacesPreviousContents) {
  std::vector<Slot> slots(5);
  std::string error;
  ASSERT_TRUE(assignSlots({{"a", 2}}, 2, &slots, &error)) << error;
  EXPECT_EQ(slots.size(), 2u);
}

// Was a bug: a host named twice was two hosts, both ranks got local rank 0 and a cross size of
// 2 on one machine. Merged, it is one host with two local ranks.
TEST(AssignSlotsTest, RepeatedHostGetsDistinctLocalRanks) {
  std::vector<HostSpec> hosts;
  std::string error;
  ASSERT_TRUE(parseHostList("a:1,a:1", &hosts, &error)) << error;
  std::vector<Slot> slots;
  ASSERT_TRUE(assignSlots(hosts, 2, &slots, &error)) << error;
  expectSlots(slots, 2,
              {
                  {0, 0, 2, 0, 1, 0, "a"},
                  {1, 1, 2, 0, 1, 0, "a"},
              });
}

// Was a bug: the slots were summed in an int (3,000 hosts of 999,999 slots overflowed it) and
// cross ranks took ranks x hosts steps (a million ranks on 100,000 hosts: minutes).
TEST(AssignSlotsTest, TheLargestJobsAreCountedRightAndQuickly) {
  std::vector<HostSpec> big(3000, HostSpec{"h", 999999});
  std::vector<Slot> slots;
  std::string error;
  ASSERT_TRUE(assignSlots(big, 1 << 20, &slots, &error)) << error;
  EXPECT_EQ(slots.size(), 1u << 20);
  EXPECT_EQ(slots.back().localRank, (1 << 20) - 999999 - 1);
  EXPECT_EQ(slots.back().crossRank, 1);
  EXPECT_EQ(slots.back().crossSize, 2);
  std::vector<HostSpec> many;
  for (int h = 0; h < 100000; ++h) many.push_back({"h" + std::to_string(h), 10});
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(assignSlots(many, 1000000, &slots, &error)) << error;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(slots.back().crossRank, 99999);
  EXPECT_EQ(slots.back().crossSize, 100000);
  EXPECT_EQ(slots.back().localSize, 10);
}

// Invariants over random host lists, against a direct restatement of horovodrun's rules.
TEST(AssignSlotsTest, RandomHostListsFollowTheRules) {
  std::mt19937 rng(12345);
  for (int iter = 0; iter < 500; ++iter) {
    std::vector<HostSpec> hosts;
    int nHosts = 1 + static_cast<int>(rng() % 6);
    int total = 0;
    for (int h = 0; h < nHosts; ++h) {
      hosts.push_back({"h" + std::to_string(h), 1 + static_cast<int>(rng() % 5)});
      total += hosts.back().slots;
    }
    int np = 1 + static_cast<int>(rng() % total);
    SCOPED_TRACE("iteration " + std::to_string(iter) + ", np " + std::to_string(np));
    std::vector<Slot> slots;
    std::string error;
    ASSERT_TRUE(assignSlots(hosts, np, &slots, &error)) << error;
    ASSERT_EQ(static_cast<int>(slots.size()), np);
    // Ranks on each host, filling hosts in order.
    std::vector<int> used(hosts.size(), 0);
    int left = np;
    for (size_t h = 0; h < hosts.size(); ++h) {
      used[h] = std::min(hosts[h].slots, left);
      left -= used[h];
    }
    int rank = 0;
    for (size_t h = 0; h < hosts.size(); ++h) {
      for (int l = 0; l < used[h]; ++l, ++rank) {
        const Slot& s = slots[rank];
        ASSERT_EQ(s.rank, rank);
        EXPECT_EQ(s.size, np);
        EXPECT_EQ(s.hostIndex, static_cast<int>(h));
        EXPECT_EQ(s.host, hosts[h].name);
        EXPECT_EQ(s.localRank, l);
        EXPECT_EQ(s.localSize, used[h]);
        int crossRank = 0, crossSize = 0;
        for (size_t g = 0; g < hosts.size(); ++g)
          if (used[g] > l) {
            crossSize++;
            if (g < h) crossRank++;
          }
        EXPECT_EQ(s.crossRank, crossRank);
        EXPECT_EQ(s.crossSize, crossSize);
      }
    }
  }
}

// ---- isLocalHost ----

TEST(IsLocalHostTest, LoopbackNames) {
  EXPECT_TRUE(isLocalHost("localhost"));
  EXPECT_TRUE(isLocalHost("127.0.0.1"));
  EXPECT_TRUE(isLocalHost("127.1.2.3"));
  EXPECT_TRUE(isLocalHost("::1"));
}

TEST(IsLocalHostTest, ThisHostsNameAndAddresses) {
  char name[256] = {0};
  ASSERT_EQ(gethostname(name, sizeof(name) - 1), 0);
  EXPECT_TRUE(isLocalHost(name)) << name;
  ifaddrs* list = nullptr;
  ASSERT_EQ(getifaddrs(&list), 0);
  int checked = 0;
  for (ifaddrs* a = list; a; a = a->ifa_next) {
    if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN] = {0};
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text, sizeof(text));
    EXPECT_TRUE(isLocalHost(text)) << text << " (" << a->ifa_name << ")";
    ++checked;
  }
  freeifaddrs(list);
  EXPECT_GT(checked, 0) << "no IPv4 interface at all?";
}

TEST(IsLocalHostTest, OtherNamesAreRemote) {
  EXPECT_FALSE(isLocalHost("192.0.2.1"));  // TEST-NET-1, never assigned
  EXPECT_FALSE(isLocalHost("remote-host.invalid"));
  EXPECT_FALSE(isLocalHost(""));
  EXPECT_FALSE(isLocalHost("128.0.0.1"));
  // Exact, case-sensitive matches only.
  EXPECT_FALSE(isLocalHost("LOCALHOST"));
  EXPECT_FALSE(isLocalHost("localhost.localdomain"));
  EXPECT_FALSE(isLocalHost("0:0:0:0:0:0:0:1"));
}

// Documents today's behaviour: any name starting with "127." counts as local, including DNS
// names such as "127.example.com", whose ranks would then be started on this machine.
TEST(IsLocalHostTest, AnyNameStartingWith127DotIsLocal) {
  EXPECT_TRUE(isLocalHost("127.example.com"));
}

}  // namespace
}  // namespace horarun
