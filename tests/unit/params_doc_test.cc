// docs/params.md is generated from the parameter registry; this test keeps
// it in sync (on failure it prints the file's expected content).
#include <fstream>
#include <sstream>

#include "core/params.h"
#include "gtest/gtest.h"

#ifndef HORA_SOURCE_DIR
#define HORA_SOURCE_DIR "."
#endif

TEST(ParamsDoc, DocsParamsMdMatchesTheRegistry) {
  std::string expected =
      "# HORA_* parameters\n\nGenerated from `core/params.cc` (the registry); "
      "`tests/unit/params_doc_test.cc` fails when they drift apart.\n"
      "Explicit `hora_config_t` fields override these.\n\n" +
      hora::Params::dumpMarkdown();
  std::ifstream f(std::string(HORA_SOURCE_DIR) + "/docs/params.md");
  std::stringstream ss;
  ss << f.rdbuf();
  EXPECT_EQ(ss.str(), expected) << "regenerate docs/params.md with the content above (or run "
                                   "HORA_WRITE_PARAMS_DOC=1 on this test)";
  if (getenv("HORA_WRITE_PARAMS_DOC"))
    std::ofstream(std::string(HORA_SOURCE_DIR) + "/docs/params.md") << expected;
}
