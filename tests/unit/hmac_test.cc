// SHA-256 (FIPS 180-4 / NIST examples) and HMAC-SHA256 (RFC 4231) known-answer tests.
#include "core/hmac.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace hora {
namespace {

std::string repeat(char c, size_t n) { return std::string(n, c); }

TEST(Sha256Test, NistVectors) {
  EXPECT_EQ(toHex(sha256("")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(toHex(sha256("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(toHex(sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(toHex(sha256(repeat('a', 1000000))),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256Test, PaddingBoundaries) {
  // Lengths around the 55/56/64-byte padding edges; expected values from Python's hashlib.
  struct Case {
    size_t n;
    const char* hex;
  };
  const Case cases[] = {
      {55, "463eb28e72f82e0a96c0a4cc53690c571281131f672aa229e0d45ae59b598b59"},
      {56, "da2ae4d6b36748f2a318f23e7ab1dfdf45acdc9d049bd80e59de82a60895f562"},
      {63, "29af2686fd53374a36b0846694cc342177e428d1647515f078784d69cdb9e488"},
      {64, "fdeab9acf3710362bd2658cdc9a29e8f9c757fcf9811603a8c447cd1d9151108"},
      {65, "4bfd2c8b6f1eec7a2afeb48b934ee4b2694182027e6d0fc075074f2fabb31781"},
      {119, "da18797ed7c3a777f0847f429724a2d8cd5138e6ed2895c3fa1a6d39d18f7ec6"},
      {120, "f52b23db1fbb6ded89ef42a23ce0c8922c45f25c50b568a93bf1c075420bbb7c"},
      {128, "471fb943aa23c511f6f72f8d1652d9c880cfa392ad80503120547703e56a2be5"},
  };
  for (const auto& c : cases) {
    std::string data;
    for (size_t i = 0; i < c.n; ++i) data.push_back(static_cast<char>(i % 251));
    EXPECT_EQ(toHex(sha256(data)), c.hex) << "length " << c.n;
  }
}

TEST(HmacSha256Test, Rfc4231Case1) {
  EXPECT_EQ(toHex(hmacSha256(repeat('\x0b', 20), "Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
}

TEST(HmacSha256Test, Rfc4231Case2) {
  EXPECT_EQ(toHex(hmacSha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST(HmacSha256Test, Rfc4231Case3) {
  EXPECT_EQ(toHex(hmacSha256(repeat('\xaa', 20), repeat('\xdd', 50))),
            "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
}

TEST(HmacSha256Test, Rfc4231Case4) {
  std::string key;
  for (int i = 1; i <= 25; ++i) key.push_back(static_cast<char>(i));
  EXPECT_EQ(toHex(hmacSha256(key, repeat('\xcd', 50))),
            "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
}

TEST(HmacSha256Test, Rfc4231Case6LongKey) {
  EXPECT_EQ(toHex(hmacSha256(repeat('\xaa', 131),
                             "Test Using Larger Than Block-Size Key - Hash Key First")),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

TEST(HmacSha256Test, Rfc4231Case7LongKeyAndData) {
  EXPECT_EQ(toHex(hmacSha256(repeat('\xaa', 131),
                             "This is a test using a larger than block-size key and a larger "
                             "than block-size data. The key needs to be hashed before being "
                             "used by the HMAC algorithm.")),
            "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
}

TEST(HmacSha256Test, EmptyKeyIsValid) {
  // The store handshake uses an empty key when the job has no secret.
  EXPECT_EQ(hmacSha256("", "x").size(), 32u);
  EXPECT_NE(hmacSha256("", "x"), hmacSha256("k", "x"));
}

TEST(ConstantTimeEqualTest, ComparesBytes) {
  EXPECT_TRUE(constantTimeEqual("", ""));
  EXPECT_TRUE(constantTimeEqual(std::string("a\0b", 3), std::string("a\0b", 3)));
  EXPECT_FALSE(constantTimeEqual("abc", "abd"));
  EXPECT_FALSE(constantTimeEqual("abc", "ab"));
  EXPECT_FALSE(constantTimeEqual("", "a"));
}

TEST(RandomBytesTest, LengthAndVariety) {
  auto a = randomBytes(32);
  auto b = randomBytes(32);
  ASSERT_TRUE(a.isOk()) << a.status().toString();
  ASSERT_TRUE(b.isOk()) << b.status().toString();
  EXPECT_EQ(a.value().size(), 32u);
  EXPECT_NE(a.value(), b.value());
  auto empty = randomBytes(0);
  ASSERT_TRUE(empty.isOk());
  EXPECT_TRUE(empty.value().empty());
}

TEST(ToHexTest, Renders) {
  EXPECT_EQ(toHex(std::string("\x01\xab\x00\xff", 4)), "01ab00ff");
  EXPECT_EQ(toHex(""), "");
}

TEST(RandomHexTest, LengthDigitsAndNoRepeats) {
  std::set<std::string> seen;
  for (size_t n : {size_t{0}, size_t{1}, size_t{12}, size_t{31}, size_t{32}}) {
    const std::string h = randomHex(n);
    EXPECT_EQ(h.size(), n);
    EXPECT_EQ(h.find_first_not_of("0123456789abcdef"), std::string::npos) << h;
    if (n >= 12) EXPECT_TRUE(seen.insert(h).second) << h;
  }
  EXPECT_NE(randomHex(32), randomHex(32));
}

}  // namespace
}  // namespace hora
