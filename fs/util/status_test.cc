#include "util/status.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <set>
#include <string>

namespace tfs {
namespace {

TEST(StatusTest, OkIsZeroAndClassOk) {
  Status st;
  EXPECT_TRUE(st.ok());
  EXPECT_EQ(st.error_class(), ErrorClass::kOk);
  EXPECT_EQ(st.ToErrno(), 0);
  EXPECT_STREQ(st.Name(), "Ok");
}

TEST(StatusTest, CodesBelongToTheirClass) {
  EXPECT_TRUE(Status(Err::kNoSpace).Is(ErrorClass::kNoSpace));
  EXPECT_TRUE(Status(Err::kBadChecksum).Is(ErrorClass::kCorrupt));
  EXPECT_TRUE(Status(Err::kBadMagic).Is(ErrorClass::kCorrupt));
  EXPECT_TRUE(Status(Err::kNotAdmitted).Is(ErrorClass::kAgain));
  EXPECT_TRUE(Status(Err::kRestart).Is(ErrorClass::kAgain));
  EXPECT_TRUE(Status(Err::kIoTimeout).Is(ErrorClass::kIo));
  EXPECT_TRUE(Status(Err::kReadOnly).Is(ErrorClass::kPermission));
  // Corruption is never "try again".
  EXPECT_FALSE(Status(Err::kBadChecksum).Is(ErrorClass::kAgain));
}

TEST(StatusTest, ErrnoAtTheEdges) {
  EXPECT_EQ(Status(Err::kNoSpace).ToErrno(), -ENOSPC);
  EXPECT_EQ(Status(Err::kIo).ToErrno(), -EIO);
  EXPECT_EQ(Status(Err::kNotFound).ToErrno(), -ENOENT);
  EXPECT_EQ(Status(Err::kReadOnly).ToErrno(), -EROFS);
  EXPECT_EQ(Status(Err::kNotEmpty).ToErrno(), -ENOTEMPTY);
  EXPECT_EQ(Status(Err::kBadChecksum).ToErrno(), -EUCLEAN);
  EXPECT_EQ(Status(Err::kDataCorrupt).ToErrno(), -EIO);  // as docs/usage.md promises for file data
  EXPECT_TRUE(Status(Err::kDataCorrupt).Is(ErrorClass::kCorrupt));
  EXPECT_EQ(Status(Err::kNoData).ToErrno(), -ENODATA);
  EXPECT_EQ(Status::FromErrno(-ENOSPC), Status(Err::kNoSpace));
  EXPECT_EQ(Status::FromErrno(EROFS), Status(Err::kReadOnly));
  EXPECT_EQ(Status::FromErrno(-ETIMEDOUT), Status(Err::kIoTimeout));
  EXPECT_TRUE(Status::FromErrno(0).ok());
  EXPECT_EQ(Status::FromErrno(-EXDEV), Status(Err::kIo));  // unmapped
}

TEST(StatusTest, EveryCodeHasDistinctNameAndAMessage) {
  std::set<std::string> names;
  for (int c = 1; c < int(Err::kCount); c++) {
    Status st{Err(c)};
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.error_class(), ErrorClass::kOk) << st.Name();
    EXPECT_LT(st.ToErrno(), 0) << st.Name();
    EXPECT_GT(std::string(st.Message()).size(), 3u);
    EXPECT_TRUE(names.insert(st.Name()).second) << st.Name();
    EXPECT_STRNE(ErrorClassName(st.error_class()), "Unknown");
  }
}

Result<int> Parse(int v) {
  if (v < 0) return Err::kInvalidArgument;
  return v * 2;
}

Result<int> AddParsed(int a, int b) {
  int x = TFS_TRY(Parse(a));
  int y = TFS_TRY(Parse(b));
  return x + y;
}

Status CheckBoth(int a, int b) {
  TFS_TRY(Parse(a));
  TFS_TRY(AddParsed(a, b));
  return Status::Ok();
}

TEST(StatusTest, TryPropagatesErrorsAndUnwrapsValues) {
  Result<int> r = AddParsed(1, 2);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 6);
  Result<int> bad = AddParsed(1, -1);
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(bad.status(), Status(Err::kInvalidArgument));
  EXPECT_TRUE(CheckBoth(1, 1).ok());
  EXPECT_EQ(CheckBoth(1, -5), Status(Err::kInvalidArgument));
  EXPECT_EQ(CheckBoth(-1, 5), Status(Err::kInvalidArgument));
}

TEST(StatusTest, ResultHoldsNonTrivialValues) {
  Result<std::string> a = std::string(100, 'x');
  Result<std::string> b = Err::kNotFound;
  Result<std::string> c = a;
  EXPECT_EQ(c->size(), 100u);
  b = std::move(a);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, std::string(100, 'x'));
  std::string moved = std::move(b).value();
  EXPECT_EQ(moved.size(), 100u);
}

TEST(StatusTest, ResultFromOkStatusIsAnError) {
  // An Ok status carries no value: treating it as one would be a bug.
  Result<int> r = Status::Ok();
  EXPECT_FALSE(r.ok());
  EXPECT_TRUE(r.status().Is(ErrorClass::kInternal));
}

TEST(StatusDeathTest, ValueOfErrorTraps) {
  Result<int> r = Err::kIo;
  EXPECT_DEATH((void)r.value(), "");
}

}  // namespace
}  // namespace tfs
