#include "core/hmac.h"

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <algorithm>
#include <limits>
#include <random>

namespace hora {
namespace {

// OpenSSL's oldest queued error, for a message (empty when none).
std::string opensslError() {
  unsigned long e = ERR_get_error();
  if (e == 0) return "no detail from OpenSSL";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  ERR_clear_error();
  return buf;
}

}  // namespace

std::string sha256(const std::string& data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  // EVP_Digest fails only on allocation failure inside OpenSSL; an empty
  // digest then makes every authentication fail closed.
  if (EVP_Digest(data.data(), data.size(), md, &len, EVP_sha256(), nullptr) != 1) return {};
  return std::string(reinterpret_cast<const char*>(md), len);
}

std::string hmacSha256(const std::string& key, const std::string& msg) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (key.size() > static_cast<size_t>(std::numeric_limits<int>::max())) return {};
  // Fails closed as sha256() does: an empty MAC never equals a peer's.
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), md, &len) == nullptr)
    return {};
  return std::string(reinterpret_cast<const char*>(md), len);
}

bool constantTimeEqual(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  if (a.empty()) return true;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

Result<std::string> randomBytes(size_t n) {
  std::string out(n, '\0');
  size_t got = 0;
  while (got < n) {
    const size_t step = std::min<size_t>(n - got, 1 << 20);
    if (RAND_bytes(reinterpret_cast<unsigned char*>(&out[got]), static_cast<int>(step)) != 1)
      return systemError("cannot draw " + std::to_string(n) +
                         " random bytes from OpenSSL's generator: " + opensslError());
    got += step;
  }
  return out;
}

std::string randomHex(size_t chars) {
  auto bytes = randomBytes((chars + 1) / 2);
  std::string raw;
  if (bytes.isOk()) {
    raw = bytes.take();
  } else {
    std::random_device rd;
    for (size_t i = 0; i < (chars + 1) / 2; ++i) raw.push_back(static_cast<char>(rd() & 0xff));
  }
  return toHex(raw).substr(0, chars);
}

std::string toHex(const std::string& bytes) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 0xf]);
  }
  return out;
}

}  // namespace hora
