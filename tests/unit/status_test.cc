// Unit tests for core/status.h: Status and Result<T> basics, withContext,
// codeName for every code, and HORA_RETURN_IF_ERROR.
#include "core/status.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

namespace hora {
namespace {

// Every code of the enum, in ABI order. kInternal is the last one.
std::vector<Code> allCodes() {
  std::vector<Code> codes;
  for (int32_t c = 0; c <= static_cast<int32_t>(Code::kInternal); ++c)
    codes.push_back(static_cast<Code>(c));
  return codes;
}

TEST(StatusTest, DefaultIsOk) {
  Status s;
  EXPECT_TRUE(s.isOk());
  EXPECT_EQ(s.code(), Code::kOk);
  EXPECT_EQ(s.message(), "");
  EXPECT_EQ(s.toString(), "ok");
  EXPECT_TRUE(Status::ok().isOk());
}

TEST(StatusTest, CodeAndMessageAreKept) {
  Status s(Code::kMismatch, "shapes differ");
  EXPECT_FALSE(s.isOk());
  EXPECT_EQ(s.code(), Code::kMismatch);
  EXPECT_EQ(s.message(), "shapes differ");
  EXPECT_EQ(s.toString(), "mismatch: shapes differ");
}

TEST(StatusTest, HelpersSetTheirCode) {
  EXPECT_EQ(invalidArgument("x").code(), Code::kInvalidArgument);
  EXPECT_EQ(invalidUsage("x").code(), Code::kInvalidUsage);
  EXPECT_EQ(systemError("x").code(), Code::kSystemError);
  EXPECT_EQ(internalError("x").code(), Code::kInternal);
  EXPECT_EQ(protocolError("x").code(), Code::kProtocolError);
  EXPECT_EQ(timeoutError("x").code(), Code::kTimeout);
  EXPECT_EQ(timeoutError("waited 3 s").message(), "waited 3 s");
}

TEST(StatusTest, WithContextPrependsAndKeepsCode) {
  Status s = systemError("connection refused").withContext("connecting to store");
  EXPECT_EQ(s.code(), Code::kSystemError);
  EXPECT_EQ(s.message(), "connecting to store: connection refused");
  Status twice = s.withContext("init");
  EXPECT_EQ(twice.message(), "init: connecting to store: connection refused");
  EXPECT_EQ(twice.toString(), "system error: init: connecting to store: connection refused");
}

TEST(StatusTest, WithContextOnOkStaysOk) {
  Status s = Status::ok().withContext("anything");
  EXPECT_TRUE(s.isOk());
  EXPECT_EQ(s.message(), "");
}

TEST(StatusTest, WithContextDoesNotModifyOriginal) {
  const Status original = protocolError("bad tag");
  Status copy = original.withContext("decoding");
  EXPECT_EQ(original.message(), "bad tag");
  EXPECT_EQ(copy.message(), "decoding: bad tag");
}

TEST(StatusTest, CodeNameForEveryCode) {
  const std::vector<std::pair<Code, const char*>> expected = {
      {Code::kOk, "ok"},
      {Code::kInvalidArgument, "invalid argument"},
      {Code::kInvalidUsage, "invalid usage"},
      {Code::kNotInitialized, "not initialized"},
      {Code::kShutDown, "shut down"},
      {Code::kSystemError, "system error"},
      {Code::kBackendError, "backend error"},
      {Code::kRemoteError, "remote error"},
      {Code::kTimeout, "timeout"},
      {Code::kInProgress, "in progress"},
      {Code::kNotSupported, "not supported"},
      {Code::kMismatch, "mismatch"},
      {Code::kAuthError, "authentication error"},
      {Code::kProtocolError, "protocol error"},
      {Code::kInternal, "internal error"},
  };
  ASSERT_EQ(expected.size(), allCodes().size());
  for (const auto& [code, name] : expected) EXPECT_STREQ(codeName(code), name);
}

TEST(StatusTest, CodeNamesAreDistinctAndNonEmpty) {
  std::set<std::string> names;
  for (Code c : allCodes()) {
    std::string n = codeName(c);
    EXPECT_FALSE(n.empty());
    EXPECT_NE(n, "unknown status") << static_cast<int>(c);
    names.insert(n);
  }
  EXPECT_EQ(names.size(), allCodes().size());
}

TEST(StatusTest, CodeNameOutOfRange) {
  EXPECT_STREQ(codeName(static_cast<Code>(99)), "unknown status");
  EXPECT_STREQ(codeName(static_cast<Code>(-1)), "unknown status");
}

TEST(StatusTest, AbiValuesAreStable) {
  // These numbers are the C ABI's HORA_STATUS_* values.
  EXPECT_EQ(static_cast<int>(Code::kOk), 0);
  EXPECT_EQ(static_cast<int>(Code::kInvalidArgument), 1);
  EXPECT_EQ(static_cast<int>(Code::kTimeout), 8);
  EXPECT_EQ(static_cast<int>(Code::kMismatch), 11);
  EXPECT_EQ(static_cast<int>(Code::kProtocolError), 13);
  EXPECT_EQ(static_cast<int>(Code::kInternal), 14);
}

TEST(StatusTest, ToStringForEveryNonOkCode) {
  for (Code c : allCodes()) {
    if (c == Code::kOk) continue;
    Status s(c, "msg");
    EXPECT_EQ(s.toString(), std::string(codeName(c)) + ": msg");
  }
}

// --------------------------------------------------------------- Result<T>

TEST(ResultTest, HoldsValue) {
  Result<int> r(42);
  EXPECT_TRUE(r.isOk());
  EXPECT_TRUE(r.status().isOk());
  EXPECT_EQ(r.value(), 42);
  r.value() = 7;
  EXPECT_EQ(r.value(), 7);
}

TEST(ResultTest, HoldsError) {
  Result<int> r(invalidArgument("negative"));
  EXPECT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "negative");
  EXPECT_EQ(r.value(), 0);  // value-initialized
}

TEST(ResultTest, TakeMovesValueOut) {
  Result<std::vector<int>> r(std::vector<int>{1, 2, 3});
  std::vector<int> v = r.take();
  EXPECT_EQ(v, (std::vector<int>{1, 2, 3}));
}

TEST(ResultTest, ImplicitConversionFromValueAndStatus) {
  auto f = [](bool good) -> Result<std::string> {
    if (!good) return timeoutError("late");
    return std::string("fine");
  };
  Result<std::string> a = f(true);
  ASSERT_TRUE(a.isOk());
  EXPECT_EQ(a.value(), "fine");
  Result<std::string> b = f(false);
  ASSERT_FALSE(b.isOk());
  EXPECT_EQ(b.status().code(), Code::kTimeout);
}

TEST(ResultTest, ConstAccess) {
  const Result<double> r(2.5);
  EXPECT_DOUBLE_EQ(r.value(), 2.5);
}

// ------------------------------------------------------ HORA_RETURN_IF_ERROR

Status failIf(bool fail, int* calls) {
  ++*calls;
  return fail ? internalError("inner failed") : Status::ok();
}

Status twoSteps(bool failFirst, bool failSecond, int* calls, bool* reachedEnd) {
  HORA_RETURN_IF_ERROR(failIf(failFirst, calls));
  HORA_RETURN_IF_ERROR(failIf(failSecond, calls));
  *reachedEnd = true;
  return Status::ok();
}

TEST(ReturnIfErrorTest, PassesThroughOk) {
  int calls = 0;
  bool end = false;
  EXPECT_TRUE(twoSteps(false, false, &calls, &end).isOk());
  EXPECT_EQ(calls, 2);
  EXPECT_TRUE(end);
}

TEST(ReturnIfErrorTest, ReturnsFirstErrorAndStops) {
  int calls = 0;
  bool end = false;
  Status s = twoSteps(true, false, &calls, &end);
  EXPECT_EQ(s.code(), Code::kInternal);
  EXPECT_EQ(s.message(), "inner failed");
  EXPECT_EQ(calls, 1);  // the expression runs once; the second step never runs
  EXPECT_FALSE(end);
}

TEST(ReturnIfErrorTest, SecondStepError) {
  int calls = 0;
  bool end = false;
  Status s = twoSteps(false, true, &calls, &end);
  EXPECT_FALSE(s.isOk());
  EXPECT_EQ(calls, 2);
  EXPECT_FALSE(end);
}

Result<int> resultFunction(bool fail) {
  int calls = 0;
  HORA_RETURN_IF_ERROR(failIf(fail, &calls));
  return 5;
}

TEST(ReturnIfErrorTest, WorksInFunctionReturningResult) {
  Result<int> ok = resultFunction(false);
  ASSERT_TRUE(ok.isOk());
  EXPECT_EQ(ok.value(), 5);
  Result<int> bad = resultFunction(true);
  EXPECT_EQ(bad.status().code(), Code::kInternal);
}

TEST(ReturnIfErrorTest, UsableAsSingleStatementInIfElse) {
  auto f = [](bool cond) -> Status {
    if (cond)
      HORA_RETURN_IF_ERROR(invalidUsage("cond"));
    else
      HORA_RETURN_IF_ERROR(Status::ok());
    return Status::ok();
  };
  EXPECT_EQ(f(true).code(), Code::kInvalidUsage);
  EXPECT_TRUE(f(false).isOk());
}

}  // namespace
}  // namespace hora
