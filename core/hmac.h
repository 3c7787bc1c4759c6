// SHA-256, HMAC-SHA256, constant-time comparison and random bytes, from
// OpenSSL's libcrypto (libssl-dev): a maintained, audited implementation
// rather than one of our own.
//
// Used by the TCP store (core/tcp_store.cc) for its challenge-response
// handshake: the server sends a random nonce (randomBytes), the client answers
// hmacSha256(secret, context + nonce), the server compares with
// constantTimeEqual. Nothing here is on a hot path; the code favours clarity.
//
// Thread-safety: pure functions, safe from any thread.
#pragma once

#include <cstddef>
#include <string>

#include "core/status.h"

namespace hora {

// SHA-256 digest of `data`: 32 raw bytes.
std::string sha256(const std::string& data);

// HMAC-SHA256(key, msg): 32 raw bytes. Keys longer than 64 bytes are hashed first.
std::string hmacSha256(const std::string& key, const std::string& msg);

// Compares two byte strings in time that depends only on their lengths.
bool constantTimeEqual(const std::string& a, const std::string& b);

// `n` bytes from OpenSSL's CSPRNG (seeded by the kernel).
Result<std::string> randomBytes(size_t n);

// Lower-case hexadecimal rendering of raw bytes ("\x01\xab" -> "01ab").
std::string toHex(const std::string& bytes);

// `chars` random lower-case hex digits (names of shared-memory segments,
// tokens that connections present): OpenSSL's generator, or the kernel's
// (std::random_device) should that fail.
std::string randomHex(size_t chars);

}  // namespace hora
