// The contract between a fuzz target in tests/fuzz/ and the two programs built
// from it: libFuzzer (clang, -fsanitize=fuzzer; scripts/fuzz.sh) calls
// LLVMFuzzerTestOneInput with inputs it evolves; replay_main.cc (any compiler;
// a ctest test) calls it with horaFuzzSeeds() and deterministic mutations of
// them. A target must return normally for every input: a crash, a sanitizer
// report, a hang or an unbounded allocation is a bug in the decoder it calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

// Valid encodings made by the matching encoder: the mutations start from them.
std::vector<std::string> horaFuzzSeeds();

// Aborts (so the fuzzer or replay driver reports the input) when a decoder
// broke a promise that is not a crash, e.g. accepted garbage it re-encodes
// differently.
#define HORA_FUZZ_CHECK(cond)                                                            \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "%s:%d: fuzz check failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                      \
    }                                                                                    \
  } while (0)
