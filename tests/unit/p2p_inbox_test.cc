// P2pInbox (ops/p2p/p2p_inbox.h): a rank's shared-memory inbox of
// single-producer single-consumer byte rings. Checked here in one process,
// the owner's mapping and a peer's mapping of the same file side by side:
// bytes written through one come out of the other in order across many
// wrap-arounds; a full ring takes what fits and no more; readable/writable
// add up; a file that is not a v1 inbox, or a name that is not hora's, is
// refused by open; a corrupted ring is not written past; the doorbell rings
// only a sleeping owner; and sweepDeadP2pInboxes removes the inboxes of
// processes that are gone and keeps everything else.
#include "ops/p2p/p2p_inbox.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace hora {
namespace {

constexpr uint64_t kRing = 4096;

class P2pInboxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/hora-p2p-inbox-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::string cmd = "rm -rf '" + dir_ + "'";
    ASSERT_EQ(std::system(cmd.c_str()), 0);
  }
  bool exists(const std::string& name) const {
    struct stat st;
    return ::stat((dir_ + "/" + name).c_str(), &st) == 0;
  }
  void writeFile(const std::string& name, const std::vector<char>& bytes) {
    int fd = ::open((dir_ + "/" + name).c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
    ::close(fd);
  }
  std::vector<char> readFile(const std::string& name) {
    std::vector<char> b;
    int fd = ::open((dir_ + "/" + name).c_str(), O_RDONLY);
    EXPECT_GE(fd, 0);
    if (fd < 0) return b;
    struct stat st;
    ::fstat(fd, &st);
    b.resize(static_cast<size_t>(st.st_size));
    EXPECT_EQ(::pread(fd, b.data(), b.size(), 0), static_cast<ssize_t>(b.size()));
    ::close(fd);
    return b;
  }
  std::unique_ptr<P2pInbox> create(const std::string& name, uint32_t rings = 2,
                                   uint64_t ringBytes = kRing) {
    auto r = P2pInbox::create(dir_, name, rings, ringBytes);
    EXPECT_TRUE(r.isOk()) << r.status().message();
    return r.isOk() ? r.take() : nullptr;
  }
  std::string dir_;
};

std::vector<uint8_t> pattern(size_t n, size_t from) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(((from + i) * 2654435761u) >> 13);
  return v;
}

// A pid that existed a moment ago and no longer does: a reaped child's.
pid_t deadPid() {
  pid_t c = ::fork();
  if (c == 0) ::_exit(0);
  int st = 0;
  ::waitpid(c, &st, 0);
  return c;
}

TEST_F(P2pInboxTest, CreateThenOpenSeesTheSameRings) {
  auto owner = create("hora-1-p2p-a", 3, 8192);
  ASSERT_TRUE(owner);
  EXPECT_EQ(owner->rings(), 3u);
  EXPECT_EQ(owner->ringBytes(), 8192u);
  EXPECT_EQ(owner->ownerPid(), ::getpid());
  EXPECT_EQ(owner->path(), dir_ + "/hora-1-p2p-a");
  EXPECT_EQ(owner->header().closed.value.load(), 0u);

  auto peer = P2pInbox::open(dir_, "hora-1-p2p-a");
  ASSERT_TRUE(peer.isOk()) << peer.status().message();
  EXPECT_EQ(peer.value()->rings(), 3u);
  EXPECT_EQ(peer.value()->ringBytes(), 8192u);
  EXPECT_EQ(peer.value()->ownerPid(), ::getpid());

  // The peer produces into ring 2; the owner consumes it. Rings 0 and 1 see nothing.
  const auto msg = pattern(1000, 7);
  ASSERT_EQ(peer.value()->write(2, msg.data(), msg.size()), msg.size());
  EXPECT_EQ(owner->readable(0), 0u);
  EXPECT_EQ(owner->readable(1), 0u);
  EXPECT_EQ(owner->readable(2), msg.size());
  std::vector<uint8_t> got(msg.size());
  ASSERT_EQ(owner->read(2, got.data(), got.size()), msg.size());
  EXPECT_EQ(got, msg);
  EXPECT_EQ(owner->readable(2), 0u);
  EXPECT_EQ(peer.value()->writable(2), 8192u);

  // Only the owner removes the file, once; a peer's mapping outlives it.
  peer.value()->unlink();
  EXPECT_TRUE(exists("hora-1-p2p-a"));
  owner->unlink();
  EXPECT_FALSE(exists("hora-1-p2p-a"));
  owner->unlink();
  ASSERT_EQ(peer.value()->write(0, msg.data(), 10), 10u);
  EXPECT_EQ(owner->readable(0), 10u);
}

TEST_F(P2pInboxTest, CreateRefusesBadSizesAndAnExistingFile) {
  for (uint64_t bad :
       {uint64_t(0), uint64_t(2048), uint64_t(4095), uint64_t(6000), uint64_t(12288)}) {
    auto r = P2pInbox::create(dir_, "hora-1-p2p-bad", 2, bad);
    ASSERT_FALSE(r.isOk()) << bad;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    EXPECT_NE(r.status().message().find("power of two"), std::string::npos) << r.status().message();
    EXPECT_FALSE(exists("hora-1-p2p-bad"));
  }
  auto noRings = P2pInbox::create(dir_, "hora-1-p2p-bad", 0, kRing);
  EXPECT_EQ(noRings.status().code(), Code::kInvalidArgument);

  auto first = create("hora-1-p2p-x");
  ASSERT_TRUE(first);
  auto second = P2pInbox::create(dir_, "hora-1-p2p-x", 2, kRing);
  ASSERT_FALSE(second.isOk());
  EXPECT_EQ(second.status().code(), Code::kSystemError);
  EXPECT_NE(second.status().message().find("cannot create"), std::string::npos);
  // The failed create did not remove the first one's file.
  EXPECT_TRUE(exists("hora-1-p2p-x"));
}

// A stream of odd-sized writes and reads through a 4 KiB ring: every byte
// comes out once, in order, across dozens of wrap-arounds, and the two
// counts always add up to the ring's size.
TEST_F(P2pInboxTest, StreamSurvivesManyWrapArounds) {
  auto owner = create("hora-1-p2p-w", 2, kRing);
  ASSERT_TRUE(owner);
  auto peer = P2pInbox::open(dir_, "hora-1-p2p-w");
  ASSERT_TRUE(peer.isOk());
  P2pInbox& tx = *peer.value();
  const size_t total = 40 * kRing + 123;
  const auto src = pattern(total, 0);
  std::vector<uint8_t> dst;
  size_t sent = 0;
  const size_t writeSizes[] = {1, 1237, 4000, 17, 2048, 3999, 4096};
  const size_t readSizes[] = {977, 5, 4096, 3000, 1, 2500};
  size_t wi = 0, ri = 0;
  while (dst.size() < total) {
    const size_t want = std::min(writeSizes[wi++ % 7], total - sent);
    const size_t room = tx.writable(1);
    const size_t n = tx.write(1, src.data() + sent, want);
    ASSERT_EQ(n, std::min(want, room));
    sent += n;
    ASSERT_EQ(owner->readable(1) + tx.writable(1), kRing);
    ASSERT_EQ(owner->readable(1), sent - dst.size());
    std::vector<uint8_t> buf(readSizes[ri++ % 6]);
    const size_t avail = owner->readable(1);
    const size_t m = owner->read(1, buf.data(), buf.size());
    ASSERT_EQ(m, std::min(buf.size(), avail));
    dst.insert(dst.end(), buf.begin(), buf.begin() + m);
  }
  EXPECT_EQ(sent, total);
  ASSERT_EQ(dst.size(), total);
  EXPECT_TRUE(std::memcmp(dst.data(), src.data(), total) == 0);
  EXPECT_EQ(owner->readable(0), 0u);  // the other ring untouched
}

// Exactly at the edge: a write that ends on the ring's last byte, then one
// that starts at its first; a write split across the end.
TEST_F(P2pInboxTest, WriteSplitAcrossTheEndOfTheRing) {
  auto owner = create("hora-1-p2p-e", 1, kRing);
  ASSERT_TRUE(owner);
  const auto a = pattern(kRing - 100, 1);
  ASSERT_EQ(owner->write(0, a.data(), a.size()), a.size());
  ASSERT_EQ(owner->read(0, nullptr, a.size()), a.size());  // null discards
  const auto b = pattern(300, 2);                          // 100 bytes at the end, 200 at the start
  ASSERT_EQ(owner->write(0, b.data(), b.size()), b.size());
  std::vector<uint8_t> got(300);
  ASSERT_EQ(owner->read(0, got.data(), 150), 150u);  // the read splits elsewhere
  ASSERT_EQ(owner->read(0, got.data() + 150, 150), 150u);
  EXPECT_EQ(got, b);
}

TEST_F(P2pInboxTest, FullRingTakesWhatFitsAndNoMore) {
  auto owner = create("hora-1-p2p-f", 2, kRing);
  ASSERT_TRUE(owner);
  const auto big = pattern(kRing + 500, 3);
  EXPECT_EQ(owner->writable(0), kRing);
  ASSERT_EQ(owner->write(0, big.data(), big.size()), kRing);  // partial
  EXPECT_EQ(owner->writable(0), 0u);
  EXPECT_EQ(owner->readable(0), kRing);
  EXPECT_EQ(owner->write(0, big.data() + kRing, 1), 0u);  // full
  EXPECT_EQ(owner->writable(1), kRing);                   // per ring
  std::vector<uint8_t> got(100);
  ASSERT_EQ(owner->read(0, got.data(), 100), 100u);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), big.begin()));
  EXPECT_EQ(owner->writable(0), 100u);
  ASSERT_EQ(owner->write(0, big.data() + kRing, 500), 100u);  // again only what fits
  EXPECT_EQ(owner->write(0, big.data(), 0), 0u);
  std::vector<uint8_t> rest(kRing);
  ASSERT_EQ(owner->read(0, rest.data(), kRing + 1), kRing);  // no more than is there
  EXPECT_TRUE(std::equal(rest.begin(), rest.end(), big.begin() + 100));
  EXPECT_EQ(owner->read(0, rest.data(), 1), 0u);  // empty
}

// A misbehaving peer leaves head - tail larger than the ring: neither side
// touches the data (no write past the ring, no read of garbage).
TEST_F(P2pInboxTest, CorruptedRingCountersAreNotTrusted) {
  auto owner = create("hora-1-p2p-c", 1, kRing);
  ASSERT_TRUE(owner);
  // The first ring's control block follows the header page: head at +0.
  const uint64_t head = 10 * kRing;
  int fd = ::open(owner->path().c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::pwrite(fd, &head, sizeof head, 4096), static_cast<ssize_t>(sizeof head));
  ::close(fd);
  uint8_t buf[16] = {};
  EXPECT_EQ(owner->readable(0), 0u);
  EXPECT_EQ(owner->writable(0), 0u);
  EXPECT_EQ(owner->write(0, buf, sizeof buf), 0u);
  EXPECT_EQ(owner->read(0, buf, sizeof buf), 0u);
}

TEST_F(P2pInboxTest, OpenRefusesWhatIsNotAV2Inbox) {
  {
    auto good = create("hora-1-p2p-m", 2, kRing);
    ASSERT_TRUE(good);
    auto ok = P2pInbox::open(dir_, "hora-1-p2p-m");
    ASSERT_TRUE(ok.isOk()) << ok.status().message();
    const std::vector<char> image = readFile("hora-1-p2p-m");
    // Header page, ring controls, fast boxes, rings.
    ASSERT_EQ(image.size(), 4096 + 4096 + 4096 + 2 * kRing);

    // One field at a time spoiled in a copy of a good inbox.
    struct Spoil {
      const char* what;
      size_t offset;
      uint64_t value;
      size_t bytes;
    };
    const Spoil spoils[] = {
        {"magic", offsetof(P2pInboxHeader, magic), 0x1234, 8},
        {"version", offsetof(P2pInboxHeader, version), 1, 4},
        {"zero rings", offsetof(P2pInboxHeader, rings), 0, 4},
        {"rings vs file size", offsetof(P2pInboxHeader, rings), 3, 4},
        {"ring size not a power of two", offsetof(P2pInboxHeader, ringBytes), 6000, 8},
        {"ring size vs file size", offsetof(P2pInboxHeader, ringBytes), 8192, 8},
        {"ring size below 4096", offsetof(P2pInboxHeader, ringBytes), 2048, 8},
    };
    for (const Spoil& s : spoils) {
      std::vector<char> bad = image;
      std::memcpy(bad.data() + s.offset, &s.value, s.bytes);
      writeFile("hora-9-p2p-bad", bad);
      auto r = P2pInbox::open(dir_, "hora-9-p2p-bad");
      ASSERT_FALSE(r.isOk()) << s.what;
      EXPECT_EQ(r.status().code(), Code::kProtocolError) << s.what;
      EXPECT_NE(r.status().message().find("is not a hora v2 inbox"), std::string::npos)
          << s.what << ": " << r.status().message();
    }
    // A good image of a different size than its header says.
    std::vector<char> longer = image;
    longer.resize(image.size() + 4096);
    writeFile("hora-9-p2p-long", longer);
    EXPECT_EQ(P2pInbox::open(dir_, "hora-9-p2p-long").status().code(), Code::kProtocolError);
  }
  writeFile("hora-9-p2p-short", std::vector<char>(100, 0));
  auto tooSmall = P2pInbox::open(dir_, "hora-9-p2p-short");
  ASSERT_FALSE(tooSmall.isOk());
  EXPECT_NE(tooSmall.status().message().find("too small"), std::string::npos)
      << tooSmall.status().message();
  auto missing = P2pInbox::open(dir_, "hora-9-p2p-absent");
  ASSERT_FALSE(missing.isOk());
  EXPECT_EQ(missing.status().code(), Code::kSystemError);
  EXPECT_NE(missing.status().message().find("cannot open a peer's point-to-point inbox"),
            std::string::npos)
      << missing.status().message();
}

// The name comes from the store, i.e. from another process: only a plain
// file name starting with "hora-" is opened.
TEST_F(P2pInboxTest, OpenChecksTheNameFromTheStore) {
  auto good = create("hora-1-p2p-n");
  ASSERT_TRUE(good);
  ::mkdir((dir_ + "/hora-sub").c_str(), 0700);
  for (const char* name : {"", "x", "hora", "Hora-1-p2p-n", "../hora-1-p2p-n",
                           "hora-sub/../hora-1-p2p-n", "/etc/passwd", "p2p-hora-1"}) {
    auto r = P2pInbox::open(dir_, name);
    ASSERT_FALSE(r.isOk()) << name;
    EXPECT_EQ(r.status().code(), Code::kProtocolError) << name;
    EXPECT_NE(r.status().message().find("is not hora's"), std::string::npos)
        << name << ": " << r.status().message();
  }
  EXPECT_TRUE(P2pInbox::open(dir_, "hora-1-p2p-n").isOk());
}

TEST_F(P2pInboxTest, DoorbellRingsOnlyASleepingOwner) {
  auto owner = create("hora-1-p2p-d");
  ASSERT_TRUE(owner);
  auto peer = P2pInbox::open(dir_, "hora-1-p2p-d");
  ASSERT_TRUE(peer.isOk());
  auto& bell = owner->header().doorbell.value;
  const uint32_t before = bell.load();
  peer.value()->ring();
  EXPECT_EQ(bell.load(), before);  // awake: nothing to do
  owner->header().sleeping.value.store(1);
  peer.value()->ring();
  EXPECT_EQ(bell.load(), before + 1);
}

TEST_F(P2pInboxTest, SweepRemovesDeadOwnersInboxesOnly) {
  const pid_t dead = deadPid();
  ASSERT_GT(dead, 0);
  ASSERT_NE(::kill(dead, 0), 0);  // really gone
  const std::string me = std::to_string(::getpid());
  const std::string gone = std::to_string(dead);
  const std::vector<char> junk(10, 'x');
  writeFile("hora-" + gone + "-p2p-1f2e", junk);   // dead: removed
  writeFile("hora-" + me + "-p2p-9abc", junk);     // alive (us): kept
  writeFile("hora-1-p2p-init", junk);              // pid 1 is alive: kept
  writeFile("hora-" + gone + "-shm-1f2e", junk);   // not an inbox: kept
  writeFile("hora-" + gone + "x-p2p-1f2e", junk);  // pid not a number: kept
  writeFile("hora--" + gone + "-p2p-1f2e", junk);  // no pid: kept
  writeFile("other-" + gone + "-p2p-1f2e", junk);  // not hora's: kept
  auto live = create("hora-" + me + "-p2p-live");  // a real one of ours: kept
  ASSERT_TRUE(live);

  sweepDeadP2pInboxes(dir_);

  EXPECT_FALSE(exists("hora-" + gone + "-p2p-1f2e"));
  for (const std::string& kept :
       {"hora-" + me + "-p2p-9abc", std::string("hora-1-p2p-init"), "hora-" + gone + "-shm-1f2e",
        "hora-" + gone + "x-p2p-1f2e", "hora--" + gone + "-p2p-1f2e", "other-" + gone + "-p2p-1f2e",
        "hora-" + me + "-p2p-live"})
    EXPECT_TRUE(exists(kept)) << kept;
  sweepDeadP2pInboxes(dir_ + "/absent");  // no directory: nothing happens
}

}  // namespace
}  // namespace hora
