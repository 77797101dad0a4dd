// Per-file options (posix/opts.h): the tierfs.* xattrs set, got, listed and
// removed, their validation and one-line reasons, chattr's permission rule
// (checked before the value; no caller is refused), inheritance by new
// children (and not by existing ones, nor of a damaged value), creates racing
// a change of their directory's options, persistence across a remount, the
// codec's edge values, a damaged stored value, ENOSPC when metadata may not
// grow, and the two options honoured now: foreground_target steering a
// file's new data to the member or group it names, and compression deciding
// whether new data is compressed (with chattr +c as its mirror).
#include "posix/opts.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "data/data.h"
#include "mount/testing.h"
#include "posix/fs.h"
#include "posix/testing.h"
#include "userspace/platform/mem_device.h"

namespace tfs::posix {
namespace {

using fixture::XattrNames;

const Caller kUser{1000, 1000};

// posix on two members, "ssd.a" (the filesystem's foreground and metadata
// target) and "hdd.b" (background target), or on "ssd.a" alone.
struct Fs : testing::MountedFs {
  std::unique_ptr<userspace::MemDevice> ssd = testing::MemMember();
  std::unique_ptr<userspace::MemDevice> hdd = testing::MemMember();

  explicit Fs(bool two = true) : Fs(two, two ? testing::TwoTierFormat() : testing::SmallFormat()) {}
  Fs(bool two, const store::FormatOptions& fo) {
    fs_options.root_owner = kUser;
    if (two) {
      EXPECT_TRUE(testing::FormatTwoTier(ssd.get(), hdd.get(), fo).ok());
      devs = {ssd.get(), hdd.get()};
    } else {
      EXPECT_TRUE(testing::FormatMembers({ssd.get()}, fo).ok());
      devs = {ssd.get()};
    }
    Mount();
  }
  ~Fs() { Unmount(); }
  u32 Member(const char* label) const {
    for (u32 i = 0; i < store->sb().nr_members; i++)
      if (std::string(store->sb().members[i].label) == label) return i;
    ADD_FAILURE() << "no member " << label;
    return 0;
  }
};

// posix on three members: "ssd.a" (the filesystem's foreground target) and
// "hdd.b", "hdd.c" -- one group "hdd" of two members.
struct ThreeFs : testing::MountedFs {
  std::unique_ptr<userspace::MemDevice> ssd = testing::MemMember();
  std::unique_ptr<userspace::MemDevice> hdd_b = testing::MemMember();
  std::unique_ptr<userspace::MemDevice> hdd_c = testing::MemMember();

  ThreeFs() {
    fs_options.root_owner = kUser;
    devs = {ssd.get(), hdd_b.get(), hdd_c.get()};
    EXPECT_TRUE(testing::FormatMembers(devs, testing::TwoTierFormat(), {"ssd.a", "hdd.b", "hdd.c"}).ok());
    Mount();
  }
  ~ThreeFs() { Unmount(); }
  u32 Member(const char* label) const {
    for (u32 i = 0; i < store->sb().nr_members; i++)
      if (std::string(store->sb().members[i].label) == label) return i;
    ADD_FAILURE() << "no member " << label;
    return 0;
  }
};

Status Set(Filesystem& fs, u64 ino, const std::string& n, const std::string& v, u32 flags = 0,
           Filesystem::OptionCaller* who = Filesystem::kFrontEndChecked) {
  return fs.SetXattr(ino, n.data(), u32(n.size()), v.data(), u32(v.size()), flags, who);
}
Status Remove(Filesystem& fs, u64 ino, const std::string& n,
              Filesystem::OptionCaller* who = Filesystem::kFrontEndChecked) {
  return fs.RemoveXattr(ino, n.data(), u32(n.size()), who);
}
Result<std::string> Get(Filesystem& fs, u64 ino, const std::string& n) {
  auto len = fs.GetXattr(ino, n.data(), u32(n.size()), nullptr, 0);
  if (!len.ok()) return len.status();
  std::string v(len.value(), '\0');
  if (v.empty()) return v;
  auto r = fs.GetXattr(ino, n.data(), u32(n.size()), v.data(), u32(v.size()));
  if (!r.ok()) return r.status();
  EXPECT_EQ(r.value(), v.size());
  return v;
}
std::string GetOr(Filesystem& fs, u64 ino, const std::string& n) {
  auto r = Get(fs, ino, n);
  return r.ok() ? r.value() : std::string("<") + r.status().Message() + ">";
}
u64 Mkfile(Filesystem& fs, u64 dir, const std::string& n) {
  auto r = fs.Mknod(dir, n.data(), u32(n.size()), kModeReg | 0644, 0, kUser);
  EXPECT_TRUE(r.ok()) << n;
  return r.ok() ? r.value().ino : 0;
}
u64 Mkdir(Filesystem& fs, u64 dir, const std::string& n) {
  auto r = fs.Mkdir(dir, n.data(), u32(n.size()), 0755, kUser);
  EXPECT_TRUE(r.ok()) << n;
  return r.ok() ? r.value().ino : 0;
}

// The members the extents of `ino` point into, and how many have a
// compressed copy (the one place here that reads extent values).
struct Placement {
  std::set<u32> members;
  u32 extents = 0;
  u32 compressed = 0;
  std::vector<data::Policy> policies;  // each extent's, in order
};
Placement Extents(store::Store& s, u64 ino) {
  Placement p;
  btree::Iterator it(&s.btrees(), btree::kBtreeExtents);
  EXPECT_TRUE(it.Seek(btree::Pos{btree::kBtreeExtents, ino, 0}).ok());
  for (; it.Valid() && it.pos().inode == ino; (void)it.Next()) {
    data::Extent e;
    EXPECT_TRUE(data::ParseExtent(it.pos(), it.value(), it.val_bytes(), &e).ok());
    p.extents++;
    p.policies.push_back(e.policy);
    bool compressed = false;
    for (u32 i = 0; i < e.nr_ptrs; i++) {
      p.members.insert(e.ptrs[i].dev);
      compressed |= e.ptrs[i].compressed;
    }
    if (compressed) p.compressed++;
  }
  return p;
}

// Rewrites an inode's stored bytes directly (damage no posix path writes).
void PokeInode(store::Store& s, u64 ino, const std::function<void(InodeFormat&)>& change) {
  u8 buf[sizeof(InodeFormat)];
  ASSERT_EQ(s.btrees().Get(btree::Pos{btree::kBtreeInodes, ino, 0}, buf, sizeof(buf)).value(), sizeof(buf));
  InodeFormat in;
  memcpy(&in, buf, sizeof(in));
  change(in);
  btree::Transaction tx(&s.btrees());
  ASSERT_TRUE(tx.Set(btree::Pos{btree::kBtreeInodes, ino, 0}, &in, sizeof(in)).ok());
  ASSERT_TRUE(tx.Commit().ok());
}

std::string Text(size_t bytes) {
  std::string t;
  for (int i = 0; t.size() < bytes; i++) t += "line " + std::to_string(i) + ": the quick brown fox\n";
  t.resize(bytes);
  return t;
}

TEST(InodeOptsTest, SetGetListAndRemove) {
  Fs m;
  const u64 f = Mkfile(m.fs, kRootIno, "f");
  for (const char* o : {"foreground_target", "background_target", "promote_target", "replicas", "compression"})
    EXPECT_EQ(Get(m.fs, f, std::string("tierfs.") + o).status().code(), Err::kNoData) << o;
  EXPECT_EQ(GetOr(m.fs, f, "tierfs.inherited"), "");
  ASSERT_TRUE(Set(m.fs, f, "user.k", "v").ok());
  EXPECT_EQ(XattrNames(m.fs, f), std::vector<std::string>{"user.k"});

  const i64 ctime0 = m.fs.GetAttr(f).value().ctime_ns;
  ASSERT_TRUE(Set(m.fs, f, "tierfs.foreground_target", "hdd.b").ok());
  EXPECT_GT(m.fs.GetAttr(f).value().ctime_ns, ctime0);
  ASSERT_TRUE(Set(m.fs, f, "tierfs.background_target", "hdd").ok());
  ASSERT_TRUE(Set(m.fs, f, "tierfs.promote_target", "ssd").ok());
  ASSERT_TRUE(Set(m.fs, f, "tierfs.replicas", "2").ok());
  ASSERT_TRUE(Set(m.fs, f, "tierfs.compression", "zstd").ok());
  EXPECT_EQ(GetOr(m.fs, f, "tierfs.foreground_target"), "hdd.b");  // a member
  EXPECT_EQ(GetOr(m.fs, f, "tierfs.background_target"), "hdd");    // a group
  EXPECT_EQ(GetOr(m.fs, f, "tierfs.promote_target"), "ssd");
  EXPECT_EQ(GetOr(m.fs, f, "tierfs.replicas"), "2");
  EXPECT_EQ(GetOr(m.fs, f, "tierfs.compression"), "zstd");
  EXPECT_EQ(GetOr(m.fs, f, "tierfs.inherited"), "");  // set here, not inherited
  // Inode fields, not keys: the xattr table holds user.k alone.
  u32 keys = 0;
  btree::Iterator it(&m.store->btrees(), btree::kBtreeXattrs);
  ASSERT_TRUE(it.Seek(btree::Pos{btree::kBtreeXattrs, f, 0}).ok());
  for (; it.Valid() && it.pos().inode == f; (void)it.Next()) keys++;
  EXPECT_EQ(keys, 1u);
  EXPECT_EQ(XattrNames(m.fs, f), (std::vector<std::string>{"user.k", "tierfs.foreground_target",
                                                           "tierfs.background_target", "tierfs.promote_target",
                                                           "tierfs.replicas", "tierfs.compression"}));
  // Sizes and short buffers, as for any xattr.
  EXPECT_EQ(m.fs.GetXattr(f, "tierfs.foreground_target", 24, nullptr, 0).value(), 5u);
  char small[4];
  EXPECT_EQ(m.fs.GetXattr(f, "tierfs.foreground_target", 24, small, 4).status().code(), Err::kRange);
  const u32 list_len = m.fs.ListXattr(f, nullptr, 0).value();
  std::string list(list_len - 1, '\0');
  EXPECT_EQ(m.fs.ListXattr(f, list.data(), u32(list.size())).status().code(), Err::kRange);
  // Create and replace flags.
  EXPECT_EQ(Set(m.fs, f, "tierfs.replicas", "3", kXattrCreate).code(), Err::kExists);
  ASSERT_TRUE(Set(m.fs, f, "tierfs.replicas", "3", kXattrReplace).ok());
  EXPECT_EQ(GetOr(m.fs, f, "tierfs.replicas"), "3");
  // Remove unsets; a second remove finds nothing.
  ASSERT_TRUE(Remove(m.fs, f, "tierfs.replicas").ok());
  EXPECT_EQ(Get(m.fs, f, "tierfs.replicas").status().code(), Err::kNoData);
  EXPECT_EQ(Remove(m.fs, f, "tierfs.replicas").code(), Err::kNoData);
  EXPECT_EQ(Set(m.fs, f, "tierfs.replicas", "1", kXattrReplace).code(), Err::kNoData);
  ASSERT_TRUE(Set(m.fs, f, "tierfs.replicas", "1", kXattrCreate).ok());
  // A target "none" (or empty) unsets it: the filesystem's applies.
  ASSERT_TRUE(Set(m.fs, f, "tierfs.promote_target", "none").ok());
  EXPECT_EQ(Get(m.fs, f, "tierfs.promote_target").status().code(), Err::kNoData);
  ASSERT_TRUE(Set(m.fs, f, "tierfs.background_target", "").ok());
  EXPECT_EQ(Get(m.fs, f, "tierfs.background_target").status().code(), Err::kNoData);
  // Directories and symlinks have options too.
  const u64 d = Mkdir(m.fs, kRootIno, "d");
  ASSERT_TRUE(Set(m.fs, d, "tierfs.compression", "none").ok());
  EXPECT_EQ(GetOr(m.fs, d, "tierfs.compression"), "none");
  // All of it survives a remount.
  m.Remount();
  EXPECT_EQ(GetOr(m.fs, f, "tierfs.foreground_target"), "hdd.b");
  EXPECT_EQ(GetOr(m.fs, f, "tierfs.replicas"), "1");
  EXPECT_EQ(GetOr(m.fs, f, "tierfs.compression"), "zstd");
  EXPECT_EQ(GetOr(m.fs, d, "tierfs.compression"), "none");
  EXPECT_EQ(XattrNames(m.fs, f), (std::vector<std::string>{"user.k", "tierfs.foreground_target", "tierfs.replicas",
                                                     "tierfs.compression"}));
}

TEST(InodeOptsTest, BadValuesAndNamesAreRefusedWithAReason) {
  Fs m;
  const u64 f = Mkfile(m.fs, kRootIno, "f");
  struct Case {
    const char* name;
    std::string value;
    const char* why;  // a piece of the reason
  };
  const std::vector<Case> cases = {
      {"tierfs.foreground_target", "nvme", "names no member or group"},
      {"tierfs.background_target", "ssd.", "names no member or group"},
      {"tierfs.promote_target", std::string("ssd\0a", 5), "names no member or group"},
      {"tierfs.foreground_target", std::string(40, 's'), "names no member or group"},
      {"tierfs.replicas", "0", "1, 2, 3 or 4"},
      {"tierfs.replicas", "5", "1, 2, 3 or 4"},
      {"tierfs.replicas", "12", "1, 2, 3 or 4"},
      {"tierfs.replicas", "", "1, 2, 3 or 4"},
      {"tierfs.replicas", "two", "1, 2, 3 or 4"},
      {"tierfs.compression", "lz4", "none or zstd"},
      {"tierfs.compression", "ZSTD", "none or zstd"},
      {"tierfs.compression", "", "none or zstd"},
      {"tierfs.bogus", "1", "not an option"},
      {"tierfs.", "1", "not an option"},
      {"tierfs.inherited", "replicas", "read-only"},
      {"tierfs.Replicas", "1", "not an option"},
  };
  for (const Case& c : cases) {
    Filesystem::OptionCaller who;
    who.uid = kUser.uid;
    EXPECT_EQ(Set(m.fs, f, c.name, c.value, 0, &who).code(), Err::kInvalidArgument) << c.name << "=" << c.value;
    ASSERT_NE(who.refused, nullptr) << c.name;
    EXPECT_NE(std::string(who.refused).find(c.why), std::string::npos) << who.refused;
    EXPECT_EQ(std::string(who.refused).find('\n'), std::string::npos);
  }
  // Nothing was stored by any of them.
  EXPECT_EQ(XattrNames(m.fs, f), std::vector<std::string>{});
  // Unknown tierfs.* names are EINVAL for get and remove too; other
  // namespaces stay unsupported.
  EXPECT_EQ(Get(m.fs, f, "tierfs.bogus").status().code(), Err::kInvalidArgument);
  EXPECT_EQ(Remove(m.fs, f, "tierfs.bogus").code(), Err::kInvalidArgument);
  EXPECT_EQ(Remove(m.fs, f, "tierfs.inherited").code(), Err::kInvalidArgument);
  EXPECT_EQ(Set(m.fs, f, "foo.bar", "1").code(), Err::kNotSupported);
  EXPECT_EQ(Set(m.fs, f, "tierfs.replicas", "2", kXattrCreate | kXattrReplace).code(), Err::kInvalidArgument);
  // A refusal that is not a bad value leaves no reason.
  ASSERT_TRUE(Set(m.fs, f, "tierfs.replicas", "2").ok());
  Filesystem::OptionCaller who;
  who.uid = kUser.uid;
  EXPECT_EQ(Set(m.fs, f, "tierfs.replicas", "3", kXattrCreate, &who).code(), Err::kExists);
  EXPECT_EQ(who.refused, nullptr);
}

// chattr's rule: the owner or CAP_FOWNER, asked only of others.
TEST(InodeOptsTest, OnlyTheOwnerOrCapFownerSetsOptions) {
  Fs m;
  const u64 f = Mkfile(m.fs, kRootIno, "f");
  struct Asked {
    int calls = 0;
    bool answer = false;
  } asked;
  Filesystem::OptionCaller who;
  who.has_fowner = [](void* ctx) {
    auto* a = static_cast<Asked*>(ctx);
    a->calls++;
    return a->answer;
  };
  who.ctx = &asked;
  who.uid = kUser.uid;  // the owner: not asked
  ASSERT_TRUE(Set(m.fs, f, "tierfs.replicas", "2", 0, &who).ok());
  EXPECT_EQ(asked.calls, 0);
  who.uid = 2000;  // another, without CAP_FOWNER
  EXPECT_EQ(Set(m.fs, f, "tierfs.replicas", "3", 0, &who).code(), Err::kPermission);
  ASSERT_NE(who.refused, nullptr);
  EXPECT_NE(std::string(who.refused).find("owner"), std::string::npos);
  EXPECT_EQ(Remove(m.fs, f, "tierfs.replicas", &who).code(), Err::kPermission);
  EXPECT_EQ(asked.calls, 2);
  EXPECT_EQ(GetOr(m.fs, f, "tierfs.replicas"), "2");
  asked.answer = true;  // with CAP_FOWNER
  who.refused = nullptr;
  ASSERT_TRUE(Set(m.fs, f, "tierfs.replicas", "3", 0, &who).ok());
  EXPECT_EQ(GetOr(m.fs, f, "tierfs.replicas"), "3");
  // Reading needs nothing of posix (the VFS asks for read access); user.*
  // xattrs are not posix's to permit.
  EXPECT_TRUE(Set(m.fs, f, "user.x", "1", 0, &who).ok());

  // The owner is checked before the value: a non-owner gets EPERM for a bad
  // value too, as the kernel answers (and CAP_FOWNER is asked first).
  asked = Asked{};
  who.uid = 2000;
  who.refused = nullptr;
  EXPECT_EQ(Set(m.fs, f, "tierfs.replicas", "9", 0, &who).code(), Err::kPermission);
  ASSERT_NE(who.refused, nullptr);
  EXPECT_NE(std::string(who.refused).find("owner"), std::string::npos) << who.refused;
  EXPECT_EQ(Set(m.fs, f, "tierfs.foreground_target", "nvme", 0, &who).code(), Err::kPermission);
  EXPECT_EQ(asked.calls, 2);
  asked.answer = true;  // with CAP_FOWNER the value is judged
  EXPECT_EQ(Set(m.fs, f, "tierfs.replicas", "9", 0, &who).code(), Err::kInvalidArgument);
  // The check fails closed: no caller is refused for options (user.* do not
  // ask); kFrontEndChecked is the one way past it.
  EXPECT_EQ(Set(m.fs, f, "tierfs.replicas", "1", 0, nullptr).code(), Err::kPermission);
  EXPECT_EQ(Remove(m.fs, f, "tierfs.replicas", nullptr).code(), Err::kPermission);
  EXPECT_EQ(GetOr(m.fs, f, "tierfs.replicas"), "3");
  EXPECT_TRUE(Set(m.fs, f, "user.y", "1", 0, nullptr).ok());
  EXPECT_TRUE(Set(m.fs, f, "tierfs.replicas", "1", 0, Filesystem::kFrontEndChecked).ok());
  EXPECT_EQ(GetOr(m.fs, f, "tierfs.replicas"), "1");
}

// One trailing NUL is the C string's terminator (setxattr(2) callers pass
// strlen + 1; bcachefs takes it): taken. A NUL inside, or two, is not.
TEST(InodeOptsTest, AValueMayEndWithOneNul) {
  Fs m;
  const u64 f = Mkfile(m.fs, kRootIno, "f");
  ASSERT_TRUE(Set(m.fs, f, "tierfs.foreground_target", std::string("hdd.b\0", 6)).ok());
  EXPECT_EQ(GetOr(m.fs, f, "tierfs.foreground_target"), "hdd.b");
  ASSERT_TRUE(Set(m.fs, f, "tierfs.replicas", std::string("2\0", 2)).ok());
  EXPECT_EQ(GetOr(m.fs, f, "tierfs.replicas"), "2");
  ASSERT_TRUE(Set(m.fs, f, "tierfs.compression", std::string("zstd\0", 5)).ok());
  EXPECT_EQ(GetOr(m.fs, f, "tierfs.compression"), "zstd");
  ASSERT_TRUE(Set(m.fs, f, "tierfs.promote_target", std::string("none\0", 5)).ok());
  EXPECT_EQ(Get(m.fs, f, "tierfs.promote_target").status().code(), Err::kNoData);
  EXPECT_EQ(Set(m.fs, f, "tierfs.replicas", std::string("3\0\0", 3)).code(), Err::kInvalidArgument);
  EXPECT_EQ(Set(m.fs, f, "tierfs.replicas", std::string("\0", 1)).code(), Err::kInvalidArgument);
  EXPECT_EQ(Set(m.fs, f, "tierfs.background_target", std::string("hdd\0b", 5)).code(), Err::kInvalidArgument);
  EXPECT_EQ(Set(m.fs, f, "tierfs.compression", std::string("zstd\0\0", 6)).code(), Err::kInvalidArgument);
  EXPECT_EQ(GetOr(m.fs, f, "tierfs.replicas"), "2");
}

// A set adds nothing to the btree's size, but is refused like any xattr
// set when metadata may not grow (MetadataRoom); a remove still works.
TEST(InodeOptsTest, ASetIsRefusedWhenMetadataMayNotGrow) {
  Fs m(false);
  const u64 f = Mkfile(m.fs, kRootIno, "f");
  ASSERT_TRUE(Set(m.fs, f, "tierfs.replicas", "2").ok());
  ASSERT_TRUE(Set(m.fs, f, "user.k", "v").ok());
  alloc::Allocator& a = m.store->alloc();
  // The btree declares more than the member has: metadata may not grow. (It
  // declares again when its size changes -- a background node write could
  // do so between two calls here -- so asked again until it holds.)
  Status st;
  Status user;
  for (int i = 0; i < 1000; i++) {
    a.SetMetadataNeed(0, 2 * a.nbuckets(0));
    st = Set(m.fs, f, "tierfs.replicas", "3");
    a.SetMetadataNeed(0, 2 * a.nbuckets(0));
    user = Set(m.fs, f, "user.k", "w");
    if (st.code() == Err::kNoSpace && user.code() == Err::kNoSpace) break;
    if (st.ok()) {  // (room again between the calls, or no check: put it back)
      a.SetMetadataNeed(0, 0);
      ASSERT_TRUE(Set(m.fs, f, "tierfs.replicas", "2").ok());
    }
  }
  EXPECT_EQ(user.code(), Err::kNoSpace) << user.Message();  // (what the option set does)
  EXPECT_EQ(st.code(), Err::kNoSpace) << st.Message();
  EXPECT_EQ(GetOr(m.fs, f, "tierfs.replicas"), "2");
  a.SetMetadataNeed(0, 2 * a.nbuckets(0));
  EXPECT_TRUE(Remove(m.fs, f, "tierfs.replicas").ok());
  EXPECT_EQ(Get(m.fs, f, "tierfs.replicas").status().code(), Err::kNoData);
  a.SetMetadataNeed(0, 0);  // (the btree's next declaration is the real one)
}

TEST(InodeOptsTest, NewChildrenInheritExistingOnesDoNot) {
  Fs m;
  const u64 d = Mkdir(m.fs, kRootIno, "d");
  const u64 before = Mkfile(m.fs, d, "before");
  ASSERT_TRUE(Set(m.fs, d, "tierfs.foreground_target", "hdd").ok());
  ASSERT_TRUE(Set(m.fs, d, "tierfs.replicas", "2").ok());
  ASSERT_TRUE(Set(m.fs, d, "tierfs.compression", "zstd").ok());
  EXPECT_EQ(Get(m.fs, before, "tierfs.replicas").status().code(), Err::kNoData);  // not re-propagated
  const u64 file = Mkfile(m.fs, d, "file");
  const u64 sub = Mkdir(m.fs, d, "sub");
  const u64 link = m.fs.Symlink(d, "link", 4, "file", 4, kUser).value().ino;
  const u64 fifo = m.fs.Mknod(d, "fifo", 4, kModeFifo | 0644, 0, kUser).value().ino;
  const u64 opened = m.fs.CreateOpen(d, "opened", 6, 0644, kUser).value().ino;
  ASSERT_TRUE(m.fs.Release(opened).ok());
  const u64 deeper = Mkfile(m.fs, sub, "deeper");  // from sub, which inherited them
  for (u64 ino : {file, sub, link, fifo, opened, deeper}) {
    EXPECT_EQ(GetOr(m.fs, ino, "tierfs.foreground_target"), "hdd") << ino;
    EXPECT_EQ(GetOr(m.fs, ino, "tierfs.replicas"), "2") << ino;
    EXPECT_EQ(GetOr(m.fs, ino, "tierfs.compression"), "zstd") << ino;
    EXPECT_EQ(Get(m.fs, ino, "tierfs.background_target").status().code(), Err::kNoData) << ino;
    EXPECT_EQ(GetOr(m.fs, ino, "tierfs.inherited"), "foreground_target,replicas,compression") << ino;
    EXPECT_EQ(m.fs.GetFlags(ino).value(), Filesystem::kFsComprFl) << ino;  // the flag mirrors it
  }
  EXPECT_EQ(GetOr(m.fs, d, "tierfs.inherited"), "");  // the directory's own
  // A child's own setting is no longer inherited; unsetting clears the mark.
  ASSERT_TRUE(Set(m.fs, file, "tierfs.replicas", "3").ok());
  ASSERT_TRUE(Remove(m.fs, file, "tierfs.compression").ok());
  EXPECT_EQ(GetOr(m.fs, file, "tierfs.inherited"), "foreground_target");
  EXPECT_EQ(m.fs.GetFlags(file).value(), 0u);
  // A later change of the directory reaches no existing child.
  ASSERT_TRUE(Set(m.fs, d, "tierfs.replicas", "4").ok());
  EXPECT_EQ(GetOr(m.fs, sub, "tierfs.replicas"), "2");
  EXPECT_EQ(GetOr(m.fs, Mkfile(m.fs, d, "after"), "tierfs.replicas"), "4");
  // Renames keep what the inode has.
  ASSERT_TRUE(m.fs.Rename(d, "file", 4, kRootIno, "moved", 5, 0).ok());
  EXPECT_EQ(GetOr(m.fs, file, "tierfs.replicas"), "3");
  // The marks survive a remount.
  m.Remount();
  EXPECT_EQ(GetOr(m.fs, deeper, "tierfs.inherited"), "foreground_target,replicas,compression");
  EXPECT_EQ(GetOr(m.fs, file, "tierfs.inherited"), "foreground_target");
  // chattr +c on a directory is its compression option: new files compress.
  const u64 c = Mkdir(m.fs, kRootIno, "c");
  ASSERT_TRUE(m.fs.SetFlags(c, Filesystem::kFsComprFl).ok());
  const u64 cf = Mkfile(m.fs, c, "cf");
  EXPECT_EQ(m.fs.GetFlags(cf).value(), Filesystem::kFsComprFl);
  EXPECT_EQ(GetOr(m.fs, cf, "tierfs.compression"), "zstd");
}

// A directory's damaged option (a value the filesystem cannot hold) stays
// with it -- fsck's to clear -- instead of being copied to every new child;
// its valid ones are inherited as ever.
TEST(InodeOptsTest, ADamagedDirectoryOptionIsNotInherited) {
  Fs m(false);
  const u64 d = Mkdir(m.fs, kRootIno, "d");
  ASSERT_TRUE(Set(m.fs, d, "tierfs.compression", "zstd").ok());
  ASSERT_TRUE(Set(m.fs, d, "tierfs.promote_target", "ssd.a").ok());
  PokeInode(*m.store, d, [](InodeFormat& in) {
    in.foreground_target.set(kOptTargetMember + 5);  // member 5 of 1
    in.background_target.set(kOptTargetGroup | 9);
    in.replicas = 9;
  });
  const u64 child = Mkfile(m.fs, d, "child");
  const u64 sub = Mkdir(m.fs, d, "sub");
  for (u64 ino : {child, sub}) {
    EXPECT_EQ(GetOr(m.fs, ino, "tierfs.inherited"), "promote_target,compression") << ino;
    EXPECT_EQ(GetOr(m.fs, ino, "tierfs.compression"), "zstd") << ino;
    EXPECT_EQ(GetOr(m.fs, ino, "tierfs.promote_target"), "ssd.a") << ino;
    for (const char* o : {"tierfs.foreground_target", "tierfs.background_target", "tierfs.replicas"})
      EXPECT_EQ(Get(m.fs, ino, o).status().code(), Err::kNoData) << ino << " " << o;
    EXPECT_EQ(XattrNames(m.fs, ino), (std::vector<std::string>{"tierfs.promote_target", "tierfs.compression"})) << ino;
  }
  EXPECT_EQ(Get(m.fs, d, "tierfs.replicas").status().code(), Err::kCorrupt);  // the directory's own, still
}

// Creates in a directory racing changes of its options (both take the
// directory's inode lock): every child has the directory's options of one
// moment -- the value before a change or after it, never a mix, never a
// torn flag -- and no create's write of the directory loses a change.
TEST(InodeOptsTest, CreatesRacingAnOptionChangeSeeBeforeOrAfter) {
  Fs m;
  const u64 d = Mkdir(m.fs, kRootIno, "d");
  ASSERT_TRUE(Set(m.fs, d, "tierfs.replicas", "2").ok());
  constexpr int kChanges = 200;
  constexpr int kFiles = 200;
  std::atomic<bool> changes_ok{true};
  std::thread changer([&] {
    for (int i = 0; i < kChanges && changes_ok; i++) {
      // replicas 2 <-> 3, and chattr +c / -c: the compression option and its
      // flag change together, in one transaction.
      Status st = Set(m.fs, d, "tierfs.replicas", i % 2 == 0 ? "3" : "2");
      if (st.ok()) st = m.fs.SetFlags(d, i % 2 == 0 ? Filesystem::kFsComprFl : 0);
      if (!st.ok()) changes_ok = false;
    }
  });
  std::vector<u64> children;
  bool creates_ok = true;  // (no ASSERT while the changer runs: it must be joined)
  for (int i = 0; i < kFiles && creates_ok; i++) {
    const std::string n = "c" + std::to_string(i);
    auto r = m.fs.Mknod(d, n.data(), u32(n.size()), kModeReg | 0644, 0, kUser);
    creates_ok = r.ok();
    if (r.ok()) children.push_back(r.value().ino);
  }
  changer.join();
  ASSERT_TRUE(changes_ok.load());
  ASSERT_TRUE(creates_ok);
  for (u64 ino : children) {
    const std::string replicas = GetOr(m.fs, ino, "tierfs.replicas");
    EXPECT_TRUE(replicas == "2" || replicas == "3") << ino << ": " << replicas;
    const auto compression = Get(m.fs, ino, "tierfs.compression");
    const bool zstd = compression.ok() && compression.value() == "zstd";
    EXPECT_TRUE(zstd || compression.status().code() == Err::kNoData) << ino;
    EXPECT_EQ(m.fs.GetFlags(ino).value(), zstd ? Filesystem::kFsComprFl : 0u) << ino;
    EXPECT_EQ(GetOr(m.fs, ino, "tierfs.inherited"), zstd ? "replicas,compression" : "replicas") << ino;
  }
  // The last change stands (kChanges even: its last set replicas 2 and -c).
  EXPECT_EQ(GetOr(m.fs, d, "tierfs.replicas"), "2");
  EXPECT_EQ(m.fs.GetFlags(d).value(), 0u);
  EXPECT_EQ(XattrNames(m.fs, d), std::vector<std::string>{"tierfs.replicas"});
}

// foreground_target: a file's new data goes to the member or group it
// names, whatever the filesystem's target; the allocator's fallback is
// unchanged. Checked on the extents' pointers.
TEST(InodeOptsTest, ForegroundTargetPlacesNewData) {
  Fs m;
  const u32 ssd = m.Member("ssd.a");
  const u32 hdd = m.Member("hdd.b");
  const std::string data = Text(300 << 10);
  auto write = [&](u64 ino, bool buffered) {
    if (buffered) {
      ASSERT_TRUE(m.fs.OpenInode(ino).ok());
      for (size_t at = 0; at < data.size(); at += 8192)
        ASSERT_TRUE(m.fs.Write(ino, at, data.data() + at, u32(std::min<size_t>(8192, data.size() - at))).ok());
      ASSERT_TRUE(m.fs.Release(ino).ok());
    } else {
      ASSERT_TRUE(m.fs.Write(ino, 0, data.data(), u32(data.size()), Filesystem::kWriteDirect).ok());
    }
  };
  const u64 plain = Mkfile(m.fs, kRootIno, "plain");
  const u64 member = Mkfile(m.fs, kRootIno, "member");
  const u64 group = Mkfile(m.fs, kRootIno, "group");
  const u64 buffered = Mkfile(m.fs, kRootIno, "buffered");
  ASSERT_TRUE(Set(m.fs, member, "tierfs.foreground_target", "hdd.b").ok());
  ASSERT_TRUE(Set(m.fs, group, "tierfs.foreground_target", "hdd").ok());
  ASSERT_TRUE(Set(m.fs, buffered, "tierfs.foreground_target", "hdd").ok());
  const u64 d = Mkdir(m.fs, kRootIno, "d");
  ASSERT_TRUE(Set(m.fs, d, "tierfs.foreground_target", "hdd.b").ok());
  const u64 child = Mkfile(m.fs, d, "child");
  write(plain, false);
  write(member, false);
  write(group, false);
  write(buffered, true);
  write(child, false);
  EXPECT_EQ(Extents(*m.store, plain).members, std::set<u32>{ssd});
  for (u64 ino : {member, group, buffered, child}) EXPECT_EQ(Extents(*m.store, ino).members, std::set<u32>{hdd}) << ino;
  // Back to the filesystem's target once unset; a partial-block overwrite
  // (read, merge, rewrite) follows the option too.
  ASSERT_TRUE(Remove(m.fs, member, "tierfs.foreground_target").ok());
  ASSERT_TRUE(m.fs.Write(member, 0, data.data(), 4096, Filesystem::kWriteDirect).ok());
  EXPECT_EQ(Extents(*m.store, member).members, (std::set<u32>{ssd, hdd}));
  ASSERT_TRUE(Set(m.fs, plain, "tierfs.foreground_target", "hdd").ok());
  ASSERT_TRUE(m.fs.Write(plain, 100, "xyz", 3, Filesystem::kWriteDirect).ok());
  EXPECT_EQ(Extents(*m.store, plain).members, (std::set<u32>{ssd, hdd}));
  // The data reads back whole, and stays placed across a remount.
  m.Remount();
  for (u64 ino : {group, buffered, child}) {
    std::string back(data.size(), '\0');
    ASSERT_EQ(m.fs.Read(ino, 0, back.data(), u32(back.size())).value(), data.size());
    EXPECT_TRUE(back == data) << ino;
    EXPECT_EQ(Extents(*m.store, ino).members, std::set<u32>{hdd}) << ino;
  }
}

// A group of two members ("hdd": hdd.b and hdd.c): a file whose target is
// the group has its data on those members only, whichever member's name
// the group was set by; a member of it alone takes that member's.
TEST(InodeOptsTest, AGroupTargetPlacesDataOnItsMembersOnly) {
  ThreeFs m;
  const u32 ssd = m.Member("ssd.a");
  const u32 b = m.Member("hdd.b");
  const u32 c = m.Member("hdd.c");
  const std::string data = Text(1 << 20);  // four buckets' worth
  const u64 plain = Mkfile(m.fs, kRootIno, "plain");
  const u64 group = Mkfile(m.fs, kRootIno, "group");
  const u64 only_c = Mkfile(m.fs, kRootIno, "only-c");
  const u64 d = Mkdir(m.fs, kRootIno, "d");
  ASSERT_TRUE(Set(m.fs, group, "tierfs.foreground_target", "hdd").ok());
  ASSERT_TRUE(Set(m.fs, only_c, "tierfs.foreground_target", "hdd.c").ok());
  ASSERT_TRUE(Set(m.fs, d, "tierfs.foreground_target", "hdd").ok());
  const u64 child = Mkfile(m.fs, d, "child");
  EXPECT_EQ(GetOr(m.fs, group, "tierfs.foreground_target"), "hdd");
  for (u64 ino : {plain, group, only_c, child})
    ASSERT_TRUE(m.fs.Write(ino, 0, data.data(), u32(data.size()), Filesystem::kWriteDirect).ok()) << ino;
  EXPECT_EQ(Extents(*m.store, plain).members, std::set<u32>{ssd});
  EXPECT_EQ(Extents(*m.store, only_c).members, std::set<u32>{c});
  for (u64 ino : {group, child}) {
    const std::set<u32> on = Extents(*m.store, ino).members;
    EXPECT_FALSE(on.empty()) << ino;
    for (u32 member : on) EXPECT_TRUE(member == b || member == c) << ino << " has data on member " << member;
  }
  std::string back(data.size(), '\0');
  ASSERT_EQ(m.fs.Read(group, 0, back.data(), u32(back.size())).value(), data.size());
  EXPECT_TRUE(back == data);
}

// compression: zstd compresses a file's new data, none keeps it plain even
// on a filesystem formatted with --compression zstd; chattr +c is its mirror.
TEST(InodeOptsTest, CompressionOptionDecidesNewData) {
  Fs m(false);
  const std::string text = Text(256 << 10);
  const u64 z = Mkfile(m.fs, kRootIno, "z");
  const u64 plain = Mkfile(m.fs, kRootIno, "plain");
  ASSERT_TRUE(Set(m.fs, z, "tierfs.compression", "zstd").ok());
  EXPECT_EQ(m.fs.GetFlags(z).value(), Filesystem::kFsComprFl);
  ASSERT_TRUE(m.fs.Write(z, 0, text.data(), u32(text.size())).ok());
  ASSERT_TRUE(m.fs.Write(plain, 0, text.data(), u32(text.size())).ok());
  const Placement pz = Extents(*m.store, z);
  EXPECT_GT(pz.compressed, 0u);
  EXPECT_EQ(pz.compressed, pz.extents);
  EXPECT_EQ(Extents(*m.store, plain).compressed, 0u);
  // chattr -c unsets a zstd option; chattr +c sets it.
  ASSERT_TRUE(m.fs.SetFlags(z, 0).ok());
  EXPECT_EQ(Get(m.fs, z, "tierfs.compression").status().code(), Err::kNoData);
  ASSERT_TRUE(m.fs.SetFlags(plain, Filesystem::kFsComprFl).ok());
  EXPECT_EQ(GetOr(m.fs, plain, "tierfs.compression"), "zstd");
  ASSERT_TRUE(Set(m.fs, plain, "tierfs.compression", "none").ok());
  EXPECT_EQ(m.fs.GetFlags(plain).value(), 0u);
  ASSERT_TRUE(m.fs.SetFlags(plain, 0).ok());  // -c leaves an explicit none
  EXPECT_EQ(GetOr(m.fs, plain, "tierfs.compression"), "none");

  // On a filesystem that compresses everything, none keeps a file plain.
  store::FormatOptions fo = testing::SmallFormat();
  fo.compression = sb::CompressionType::kZstd;
  Fs all(false, fo);
  const u64 a = Mkfile(all.fs, kRootIno, "a");
  const u64 n = Mkfile(all.fs, kRootIno, "n");
  ASSERT_TRUE(Set(all.fs, n, "tierfs.compression", "none").ok());
  ASSERT_TRUE(all.fs.Write(a, 0, text.data(), u32(text.size())).ok());
  ASSERT_TRUE(all.fs.Write(n, 0, text.data(), u32(text.size())).ok());
  EXPECT_GT(Extents(*all.store, a).compressed, 0u);
  EXPECT_EQ(Extents(*all.store, n).compressed, 0u);
  std::string back(text.size(), '\0');
  ASSERT_EQ(all.fs.Read(n, 0, back.data(), u32(back.size())).value(), text.size());
  EXPECT_TRUE(back == text);
}

// Every extent records the options its file had when the extent was
// committed (data/policy.h): targets as canonical codes, replicas,
// compression, and whether zstd saved nothing on its blocks. A file without
// options records the unset policy; an option changed later reaches the
// extents written after (the tail of a truncate too), not the earlier ones.
// The mount recorded the superblock feature first.
TEST(InodeOptsTest, ExtentsRecordThePolicyTheyWereWrittenUnder) {
  ThreeFs m;
  EXPECT_NE(m.store->sb().flags & sb::kSbExtentPolicy, 0);
  const u32 b = m.Member("hdd.b");
  const u32 c = m.Member("hdd.c");
  const u64 f = Mkfile(m.fs, kRootIno, "f");
  const u64 plain = Mkfile(m.fs, kRootIno, "plain");
  const u64 noise = Mkfile(m.fs, kRootIno, "noise");
  ASSERT_TRUE(Set(m.fs, f, "tierfs.foreground_target", "hdd").ok());
  ASSERT_TRUE(Set(m.fs, f, "tierfs.background_target", "hdd.c").ok());
  ASSERT_TRUE(Set(m.fs, f, "tierfs.replicas", "2").ok());
  ASSERT_TRUE(Set(m.fs, f, "tierfs.compression", "zstd").ok());
  ASSERT_TRUE(Set(m.fs, noise, "tierfs.compression", "zstd").ok());
  const std::string text = Text(256 << 10);
  std::string random(256 << 10, 'r');
  u32 x = 2203;
  for (char& ch : random) ch = char((x = x * 1103515245u + 12345u) >> 23);
  ASSERT_TRUE(m.fs.Write(f, 0, text.data(), u32(text.size()), Filesystem::kWriteDirect).ok());
  ASSERT_TRUE(m.fs.Write(plain, 0, text.data(), u32(text.size()), Filesystem::kWriteDirect).ok());
  ASSERT_TRUE(m.fs.OpenInode(noise).ok());  // (buffered: the write-out's path)
  ASSERT_TRUE(m.fs.Write(noise, 0, random.data(), u32(random.size())).ok());
  ASSERT_TRUE(m.fs.Release(noise).ok());
  const data::Policy want{u16(data::kTargetGroup | std::min(b, c)), u16(data::kTargetMember + c), 2,
                          data::kCompressZstd, 0, 0};
  const Placement pf = Extents(*m.store, f);
  ASSERT_GT(pf.extents, 0u);
  EXPECT_EQ(pf.compressed, pf.extents);
  for (const data::Policy& p : pf.policies) EXPECT_EQ(p, want);
  for (const data::Policy& p : Extents(*m.store, plain).policies) EXPECT_EQ(p, data::Policy{});
  const Placement pn = Extents(*m.store, noise);
  ASSERT_GT(pn.extents, 0u);
  EXPECT_EQ(pn.compressed, 0u);
  for (const data::Policy& p : pn.policies)
    EXPECT_EQ(p, (data::Policy{0, 0, 0, data::kCompressZstd, data::kPolicyIncompressible, 0}));
  // A later change: the earlier extents keep theirs; the tail block a
  // truncate rewrites, and a new write, record the new one.
  ASSERT_TRUE(Remove(m.fs, f, "tierfs.background_target").ok());
  ASSERT_TRUE(Set(m.fs, f, "tierfs.replicas", "1").ok());
  SetAttr shrink;
  shrink.valid = kSetSize;
  shrink.size = (128 << 10) + 100;
  ASSERT_TRUE(m.fs.SetAttrs(f, shrink).ok());
  data::Policy now = want;
  now.bg_target = 0;
  now.replicas = 1;
  now.flags = data::kPolicyIncompressible;  // (one block: compressing it cannot save a block)
  const Placement after = Extents(*m.store, f);
  ASSERT_GE(after.extents, 2u);
  EXPECT_EQ(after.policies.back(), now) << "the rewritten tail block";
  EXPECT_EQ(after.policies.front(), want);
  // A new write of f: the new policy (two compressible blocks: zstd saves one).
  data::Policy written = now;
  written.flags = 0;
  ASSERT_TRUE(m.fs.Write(f, 0, text.data(), 8192, Filesystem::kWriteDirect).ok());
  EXPECT_EQ(Extents(*m.store, f).policies.front(), written);
  m.Remount();
  const Placement remounted = Extents(*m.store, f);
  EXPECT_EQ(remounted.policies.front(), written);
  EXPECT_EQ(remounted.policies.back(), now);
}

// A stored value this filesystem cannot hold (damage: fsck clears it) is
// corrupt to getxattr, listed, and ignored by writes.
TEST(InodeOptsTest, ADamagedValueIsCorruptToReadersAndIgnoredByWrites) {
  Fs m(false);
  const u64 f = Mkfile(m.fs, kRootIno, "f");
  ASSERT_TRUE(Set(m.fs, f, "user.k", "v").ok());
  ASSERT_TRUE(Set(m.fs, f, "tierfs.compression", "none").ok());
  PokeInode(*m.store, f, [](InodeFormat& in) {
    in.foreground_target.set(kOptTargetMember + 5);  // member 5 of 1
    in.replicas = 9;
  });
  EXPECT_EQ(Get(m.fs, f, "tierfs.foreground_target").status().code(), Err::kCorrupt);
  EXPECT_EQ(Get(m.fs, f, "tierfs.replicas").status().code(), Err::kCorrupt);
  // Not listed: a name getxattr refuses would fail getfattr -d, cp -a and
  // rsync -X for the whole file; the rest is listed (and copied) as ever.
  EXPECT_EQ(XattrNames(m.fs, f), (std::vector<std::string>{"user.k", "tierfs.compression"}));
  EXPECT_EQ(m.fs.ListXattr(f, nullptr, 0).value(), u32(sizeof("user.k") + sizeof("tierfs.compression")));
  const std::string data = Text(64 << 10);
  ASSERT_TRUE(m.fs.Write(f, 0, data.data(), u32(data.size()), Filesystem::kWriteDirect).ok());
  EXPECT_EQ(Extents(*m.store, f).members, std::set<u32>{0});
  // Setting it again replaces the damage.
  ASSERT_TRUE(Set(m.fs, f, "tierfs.replicas", "1").ok());
  EXPECT_EQ(GetOr(m.fs, f, "tierfs.replicas"), "1");
}

// The codec alone: every value's text and back, the edges of validity, and
// fsck's check and repair.
TEST(InodeOptsTest, CodecAndRepair) {
  Fs m;
  const dev::DeviceSet& devs = m.store->devs();
  const u32 n = devs.size();
  for (u32 o = 0; o < kInodeOpts; o++) {
    const InodeOpt opt = InodeOpt(o);
    for (u32 v = 1; v < 0x200; v++) {
      if (!OptValid(opt, u16(v), n)) continue;
      char text[kOptTextMax];
      const u32 len = FormatOpt(opt, u16(v), devs, text);
      u16 back = 0;
      const char* why = nullptr;
      ASSERT_TRUE(ParseOpt(opt, text, len, devs, &back, &why).ok()) << OptName(opt) << " " << v;
      // (A group is named by its first member, and these labels all have
      // a dot: no label is also a group's name.)
      EXPECT_EQ(back, v) << OptName(opt) << " " << text;
    }
  }
  EXPECT_TRUE(OptValid(kOptForegroundTarget, kOptTargetMember + 1, 2));
  EXPECT_FALSE(OptValid(kOptForegroundTarget, kOptTargetMember + 2, 2));
  EXPECT_TRUE(OptValid(kOptForegroundTarget, kOptTargetGroup | 1, 2));
  EXPECT_FALSE(OptValid(kOptForegroundTarget, kOptTargetGroup | 2, 2));
  EXPECT_FALSE(OptValid(kOptForegroundTarget, 0x80, 2));
  EXPECT_FALSE(OptValid(kOptReplicas, 5, 2));
  EXPECT_FALSE(OptValid(kOptCompression, 3, 2));
  InodeFormat f;
  memset(&f, 0, sizeof(f));
  EXPECT_FALSE(CheckOpts(f, n).any());
  f.opts_inherited = 1u << kOptReplicas;  // inherited, but no value
  EXPECT_TRUE(CheckOpts(f, n).reserved);
  f.promote_target.set(kOptTargetGroup | 9);
  f.compression = 7;
  f.flags.set(kInodeFlagCompress);
  f.opts_inherited = 0x80 | (1u << kOptPromoteTarget);
  f.reserved[1].set(1);
  OptsDamage d = CheckOpts(f, n);
  EXPECT_EQ(d.bad_values, (1u << kOptPromoteTarget) | (1u << kOptCompression));
  EXPECT_TRUE(d.reserved);
  EXPECT_FALSE(d.flag_mismatch);  // (the compression value itself is bad)
  RepairOpts(&f, n);
  EXPECT_FALSE(CheckOpts(f, n).any());
  EXPECT_EQ(f.promote_target.get(), 0u);
  EXPECT_EQ(f.compression, kOptCompressZstd);  // the flag asked for it
  EXPECT_EQ(f.opts_inherited, 0u);
  // A flag that disagrees with a set option follows the option.
  f.compression = kOptCompressNone;
  EXPECT_TRUE(CheckOpts(f, n).flag_mismatch);
  RepairOpts(&f, n);
  EXPECT_EQ(f.flags.get() & kInodeFlagCompress, 0u);
  EXPECT_EQ(f.compression, kOptCompressNone);
}

}  // namespace
}  // namespace tfs::posix
