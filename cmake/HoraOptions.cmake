# Every hora build option, with its default and a one-line doc, in one place.
option(HORA_BUILD_TESTS "Build the GoogleTest suites under tests/" ON)
option(HORA_BUILD_EXAMPLES "Build the example programs under examples/" ON)
option(HORA_BUILD_BENCH "Build hora-bench under bench/" ON)
option(HORA_BUILD_LAUNCHER "Build the horarun job launcher under launcher/" ON)
option(HORA_WERROR "Treat compiler warnings as errors" OFF)
set(HORA_SANITIZE "" CACHE STRING "Sanitizer build: '', 'address' (ASan+UBSan) or 'thread' (TSan)")
option(HORA_FUZZ "Also build libFuzzer binaries of tests/fuzz (clang only; scripts/fuzz.sh)" OFF)
