// Fuzz target: decodeAbort (controllers/coordinator_link.h), the payload of
// the abort frame a peer sends when a set fails. Any input gives a Status
// whose code is a valid error code.
#include "controllers/coordinator_link.h"
#include "tests/fuzz/fuzz_target.h"

using namespace hora;  // NOLINT(build/namespaces): a test program

std::vector<std::string> horaFuzzSeeds() {
  return {encodeAbort(Status(Code::kRemoteError, "rank 3 lost")),
          encodeAbort(protocolError("bad frame")), encodeAbort(Status(Code::kInvalidArgument, ""))};
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Status s = decodeAbort(std::string(reinterpret_cast<const char*>(data), size));
  HORA_FUZZ_CHECK(!s.isOk());
  HORA_FUZZ_CHECK(static_cast<int>(s.code()) > 0 && s.code() <= kLastCode);
  (void)s.toString();
  return 0;
}
