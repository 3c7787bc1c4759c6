// ShmSegment (ops/shm/shm_segment.h): a peer segment that is missing, of the
// wrong size or not a hora segment of this version and slot size is refused
// with the reason, never mapped and used; a good one round-trips its header.
#include "ops/shm/shm_segment.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace hora {
namespace {

class ShmSegmentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/hora-shm-seg-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    for (const char* f : {"mine", "junk", "short"}) ::unlink((dir_ + "/" + f).c_str());
    ::rmdir(dir_.c_str());
  }
  void writeFile(const std::string& name, size_t bytes, char fill) {
    int fd = ::open((dir_ + "/" + name).c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
    ASSERT_GE(fd, 0);
    std::vector<char> b(bytes, fill);
    ASSERT_EQ(::write(fd, b.data(), b.size()), static_cast<ssize_t>(b.size()));
    ::close(fd);
  }
  std::string dir_;
};

constexpr size_t kSlot = 64 << 10;

TEST_F(ShmSegmentTest, GoodSegmentOpensAndOtherSlotSizesAreRefused) {
  auto mine = ShmSegment::create(dir_, "mine", kSlot);
  ASSERT_TRUE(mine.isOk()) << mine.status().message();
  auto peer = ShmSegment::open(dir_, "mine", kSlot);
  ASSERT_TRUE(peer.isOk()) << peer.status().message();
  EXPECT_EQ(peer.value()->slotBytes(), kSlot);
  auto other = ShmSegment::open(dir_, "mine", 2 * kSlot);
  ASSERT_FALSE(other.isOk());
  EXPECT_NE(other.status().message().find("wrong size"), std::string::npos)
      << other.status().message();
}

TEST_F(ShmSegmentTest, FileOfTheRightSizeWithoutAHoraHeaderIsRefused) {
  writeFile("junk", kShmHeaderBytes + 2 * kSlot, 'x');
  auto s = ShmSegment::open(dir_, "junk", kSlot);
  ASSERT_FALSE(s.isOk());
  EXPECT_EQ(s.status().code(), Code::kSystemError);
  EXPECT_NE(s.status().message().find("is not a hora v" + std::to_string(kShmVersion) +
                                      " segment with 65536-byte slots"),
            std::string::npos)
      << s.status().message();
}

TEST_F(ShmSegmentTest, MissingOrShortFilesAreRefused) {
  auto missing = ShmSegment::open(dir_, "absent", kSlot);
  ASSERT_FALSE(missing.isOk());
  EXPECT_NE(missing.status().message().find("cannot open peer segment"), std::string::npos)
      << missing.status().message();
  writeFile("short", 100, 0);
  auto shortFile = ShmSegment::open(dir_, "short", kSlot);
  ASSERT_FALSE(shortFile.isOk());
  EXPECT_NE(shortFile.status().message().find("wrong size"), std::string::npos)
      << shortFile.status().message();
}

}  // namespace
}  // namespace hora
