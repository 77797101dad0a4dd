// The ctl replies tierfs ctl reads (see ctl.h): the core's document with the
// front end's additions per member.
#include "userspace/fuse/ctl.h"

#include <vector>

#include "mount/control.h"
#include "mount/stats.h"

namespace tfs::fuse {
namespace {

struct MemberCtx {
  MemberControl* members;
  store::Store* store;
};

void WriteMember(void* ctx, u32 member, JsonOut& w) {
  auto* c = static_cast<MemberCtx*>(ctx);
  const BlockDevice* dev = c->store->devs().member(member)->bdev();
  w.StringField("path", c->members->Path(dev));
  userspace::JsonWriter fault;
  w.Key("fault");
  if (c->members->WriteFault(dev, fault)) {
    w.Raw(fault.str());
  } else {
    w.Null();
  }
  userspace::JsonWriter io;
  w.Key("uring");  // (not "io": the core's own per-origin counters)
  if (c->members->WriteUring(dev, io)) {
    w.Raw(io.str());
  } else {
    w.Null();
  }
}

}  // namespace

Status CtlStats(mount::Instance& inst, MemberControl* members, std::string* out) {
  std::vector<char> buf(kCtlMax);
  JsonBuffer sink(buf.data(), kCtlMax);
  JsonOut w(&JsonBuffer::Sink, &sink);
  mount::MemberExtras extras;
  MemberCtx mctx{members, &inst.store()};
  if (members != nullptr) extras = mount::MemberExtras{&WriteMember, &mctx};
  TFS_TRY(mount::WriteStats(inst, w, &extras));
  if (sink.overflowed()) return Err::kNoSpace;
  if (!w.complete()) return Err::kInternal;  // never hand out a malformed document
  out->assign(buf.data(), sink.size());
  return Status::Ok();
}

std::string CtlCommand(mount::Instance& inst, const std::string& line) {
  char reply[256];
  (void)mount::RunControl(inst, line.data(), line.size(), reply, sizeof(reply));  // (the reply says it)
  return reply;
}

}  // namespace tfs::fuse
